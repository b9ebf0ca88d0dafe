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


def _commands(only: str | None = None) -> dict[str, Register]:
    """Subcommands by name; with ``only``, just that one is imported (each pulls in its service)."""
    found: dict[str, Register] = {}
    for ep in sorted(entry_points(group="slofleet.commands"), key=lambda e: e.name):
        if only is not None and ep.name != only:
            continue
        try:
            found[ep.name] = ep.load()
        except ImportError as exc:
            found[ep.name] = _unavailable(ep.name, exc)
    return found


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, when it is a known one (else None: load all)."""
    names = {ep.name for ep in entry_points(group="slofleet.commands")}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--log-level":
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg if arg in names else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slofleet",
        description="SLO-aware LLM fleets: simulate, benchmark and run goodput-maximizing serving.",
    )
    parser.add_argument("--version", action="version", version=f"slofleet {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = _chosen(argv) if argv is not None else None
    for name, register in _commands(only).items():
        doc = (register.__doc__ or "").strip().splitlines()
        help_text = doc[0] if doc else None
        register(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
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
