"""bench/sweep_compare.py: the records two sweep folders hold for the same runs, paired by seed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

from repo_paths import ROOT, load_script


def _module() -> ModuleType:
    return load_script(ROOT / "bench" / "sweep_compare.py", "sweep_compare")


def _write(folder: Path, seed: int, values: dict[str, float], objective: str = "token") -> None:
    folder.mkdir(exist_ok=True)
    rows = [{"policy": p, "rps": 6.5, f"goodput_{objective}_ratio": v} for p, v in values.items()]
    rows.append({"policy": "broken", "rps": 6.5, "error": "boom"})
    (folder / f"records-tot-r1-s{seed}-{objective}.json").write_text(json.dumps(rows), encoding="utf-8")


def test_pairs_by_seed_and_reports_the_mean_difference(tmp_path: Path) -> None:
    mod = _module()
    old, new = tmp_path / "old", tmp_path / "new"
    for seed, (a, b) in enumerate([(0.90, 0.91), (0.80, 0.83), (0.70, 0.70)]):
        _write(old, seed, {"gmax": a, "edf": 0.5})
        _write(new, seed, {"gmax": b})
    _write(new, 7, {"gmax": 0.1})  # no old run to pair with: left out
    lines = mod.compare(mod.records(old), mod.records(new))
    assert len(lines) == 3  # header, rule, one point
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:6] == ["gmax", "tot", "1", "6.5", "token", "3"]
    assert float(cells[6]) == 0.8 and float(cells[7]) == 0.8133
    diffs = [0.01, 0.03, 0.0]
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    assert float(cells[8]) == round(mean, 4)
    assert float(cells[9]) == round(se, 4)
    assert cells[10].startswith("0.9000 → 0.9100 / 0.8000 → 0.8300")
