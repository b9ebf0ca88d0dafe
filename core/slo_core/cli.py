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


def _commands() -> dict[str, Register]:
    found: dict[str, Register] = {}
    for ep in sorted(entry_points(group="slofleet.commands"), key=lambda e: e.name):
        found[ep.name] = ep.load()
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
