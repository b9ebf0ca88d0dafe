"""bench/gmax_sweep.py calibrate: FCFS's attainment bisected on the sweep's window picks the overload
point (the lightest probed rate under the target) and the light one, saved per combination and resumed;
``run --points`` then uses them per family and replica count."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType

from repo_paths import ROOT, load_script


def _sweep() -> ModuleType:
    return load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep_points")


def test_calibrate_picks_the_edge_of_overload_and_run_uses_it(tmp_path: Path) -> None:
    sweep = _sweep()
    args = argparse.Namespace(
        out=str(tmp_path),
        families="conv",
        replicas="1",
        seed=0,
        duration=20.0,
        target=0.5,
        lo=2.0,
        hi=60.0,
        iterations=2,
        workers=1,
    )
    assert sweep.calibrate(args) == 0
    doc = json.loads((tmp_path / sweep.POINTS_FILE).read_text(encoding="utf-8"))
    res = doc["points"]["conv"]["1"]
    probes = res["probes"]
    failing = [p["per_replica_rps"] for p in probes if p["attainment"] < 0.5]
    passing = [p["per_replica_rps"] for p in probes if p["attainment"] >= 0.5]
    assert failing and passing  # the bracket holds the edge on this window
    assert res["overload_per_replica"] == min(failing)
    assert max(passing) < res["overload_per_replica"]
    assert res["light_per_replica"] == round(res["overload_per_replica"] * sweep.LIGHT_SHARE, 2)
    # resumable: a second call finds the combination done and probes nothing more
    assert sweep.calibrate(args) == 0
    again = json.loads((tmp_path / sweep.POINTS_FILE).read_text(encoding="utf-8"))
    assert again["points"]["conv"]["1"]["probes"] == probes
    points = sweep._points(str(tmp_path / sweep.POINTS_FILE))
    over = res["overload_per_replica"]
    assert sweep._rates("overload,light", "conv", 1, points) == [over, res["light_per_replica"]]
    assert sweep._rates("overload", "conv", 2, points) == [24.0]  # not calibrated: the old default
