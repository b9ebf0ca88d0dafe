"""Merge the JSON records of several ``slofleet bench --json`` runs into one table and load plots.

    .venv/bin/python bench/merge_sweep.py [--note TEXT] OUT_DIR RESULTS.json [RESULTS.json ...]

Writes OUT_DIR/table.md (rows sorted by load, then policy; ``--note``: a line above the table, e.g.
when and on which commit the records were made) and OUT_DIR/goodput_vs_load.png and
attainment_by_kind.png over every record. The runs should share the workload options and seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slo_core.bench.runner import markdown_table
from slo_core.sim.plots import write_plots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--note", default="", help="a line written above the table")
    ap.add_argument("out", type=Path)
    ap.add_argument("results", type=Path, nargs="+")
    args = ap.parse_args()
    out: Path = args.out
    records = [r for p in args.results for r in json.loads(p.read_text(encoding="utf-8"))]
    order = {name: i for i, name in enumerate(dict.fromkeys(r["policy"] for r in records))}
    records.sort(key=lambda r: (r["rps"], order[r["policy"]], r["router"]))
    out.mkdir(parents=True, exist_ok=True)
    head = f"{args.note}\n\n" if args.note else ""
    (out / "table.md").write_text(head + markdown_table(records) + "\n", encoding="utf-8")
    write_plots(records, {}, out)
    print(f"{len(records)} records -> {out}")


if __name__ == "__main__":
    main()
