"""``slofleet crds``: render the CustomResourceDefinitions from the pydantic models, or check for drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    """Generate crds/ and the chart's crds/ from the CRD models (--check: fail on drift)."""
    parser.add_argument(
        "--root", default=".", help="repository root holding crds/ and charts/slofleet/crds/ (default: .)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the committed files differ"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slo_core.crd.generate import drift, write

    root = Path(args.root)
    if args.check:
        stale = drift(root)
        for path in stale:
            print(f"stale: {path} (regenerate with: slofleet crds)", file=sys.stderr)
        if not stale:
            print("crds are up to date")
        return 1 if stale else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0
