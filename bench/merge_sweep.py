"""Merge the JSON records of several ``slofleet bench --json`` runs into one table and load plots.

    .venv/bin/python bench/merge_sweep.py OUT_DIR RESULTS.json [RESULTS.json ...]

Writes OUT_DIR/table.md (rows sorted by load, then policy) and OUT_DIR/goodput_vs_load.png and
attainment_by_kind.png over every record. The runs should share the workload options and seed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slo_core.bench.runner import markdown_table
from slo_core.sim.plots import write_plots


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    records = [r for p in sys.argv[2:] for r in json.loads(Path(p).read_text(encoding="utf-8"))]
    order = {name: i for i, name in enumerate(dict.fromkeys(r["policy"] for r in records))}
    records.sort(key=lambda r: (r["rps"], order[r["policy"]], r["router"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown_table(records) + "\n", encoding="utf-8")
    write_plots(records, {}, out)
    print(f"{len(records)} records -> {out}")


if __name__ == "__main__":
    main()
