"""``slofleet crds``: render the CustomResourceDefinitions from the pydantic models, or check for drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    """Generate crds/ (and the chart's crds/) from the CRD models; --check fails on drift."""
    parser.add_argument(
        "--root", default=".", help="repository root holding crds/ and charts/slofleet/crds/ (default: .)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 when the files differ")
    mode.add_argument(
        "--stdout", action="store_true", help="print both CRDs as one YAML stream (for kubectl apply -f -)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slo_core.crd.generate import drift, rendered, write

    if args.stdout:
        sys.stdout.write("---\n".join(rendered().values()))
        return 0
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
