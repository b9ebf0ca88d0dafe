"""The ``slofleet`` command: subcommands are discovered from the ``slofleet.commands`` entry points.

Each package registers its own subcommands (``name = "pkg.module:register"``); ``register`` receives
an ``argparse`` sub-parser to fill and must set ``func`` (``args -> exit code``) as its default. This
keeps ``slo_core`` free of imports of the services while one command lists them all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from slo_core import __version__

Register = Callable[[argparse.ArgumentParser], None]


def _unavailable(name: str, exc: ImportError) -> Register:
    """A subcommand whose module cannot be imported (an optional extra is missing): say what to install."""

    def register(parser: argparse.ArgumentParser) -> None:
        def run(_args: argparse.Namespace) -> int:
            missing = exc.name or str(exc)
            print(
                f"slofleet {name}: needs {missing!r}, which is not installed; "
                f"install the extras with: pip install 'slofleet[all]'",
                file=sys.stderr,
            )
            return 2

        parser.set_defaults(func=run)

    register.__doc__ = f"(unavailable: {exc.name or exc}; pip install 'slofleet[all]')"
    return register


def _commands() -> dict[str, Register]:
    found: dict[str, Register] = {}
    for ep in sorted(entry_points(group="slofleet.commands"), key=lambda e: e.name):
        try:
            found[ep.name] = ep.load()
        except ImportError as exc:
            found[ep.name] = _unavailable(ep.name, exc)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slofleet",
        description="SLO-aware LLM fleets: simulate, benchmark and run goodput-maximizing serving.",
    )
    parser.add_argument("--version", action="version", version=f"slofleet {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, register in _commands().items():
        doc = (register.__doc__ or "").strip().splitlines()
        help_text = doc[0] if doc else None
        register(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
