"""bench/ab_live_running.py compares GMAX's columns from live running requests with columns from a
snapshot of each at every decision of a real run (and stops if they differ), and its whole runs keep
the record."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import numpy as np
import pytest
from repo_paths import ROOT, load_script

from slo_core.policies.gmax_snapshot import SnapshotTable
from slo_core.sim.views import LiveViews


@pytest.fixture(scope="module")
def ab() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the script imports it by name
    return load_script(ROOT / "bench" / "ab_live_running.py", "ab_live_running")


def _task(ab: ModuleType) -> object:
    return ab.gmax_sweep.Task("tot", 2, 0, 10.0, "gmax", ("token",), 8.0, "round-robin")


def test_every_decision_is_compared_and_timed_both_ways(ab: ModuleType) -> None:
    out = ab.decision_ab(_task(ab), "gmax", 10.0)
    assert out["calls"] > 50 and out["rows"] > out["calls"]
    assert out["live"] > 0 and out["snapshots"] > 0
    # the table's method is restored after the run
    assert SnapshotTable.columns.__qualname__ == "SnapshotTable.columns"


def test_the_whole_runs_agree_and_the_engine_is_restored(ab: ModuleType) -> None:
    live_cpu, live = ab.whole_run(_task(ab), "gmax", 10.0, live=True)
    ref_cpu, ref = ab.whole_run(_task(ab), "gmax", 10.0, live=False)
    assert live == ref and live["goodput_token_ratio"] > 0
    assert live_cpu > 0 and ref_cpu > 0
    assert ab.engine_module.SimEngine.__init__.__qualname__ == "SimEngine.__init__"


def test_a_difference_in_any_column_is_seen(ab: ModuleType) -> None:
    from slo_core.sim.request import RUNNING, SimRequest
    from slo_core.slo import RequestKind, SLOTargets

    slo = SLOTargets(RequestKind.DEADLINE, deadline_s=5.0)
    reqs = [SimRequest(f"r{i}", 0.1 * i, slo, 50, output_tokens=9, max_tokens=9) for i in range(4)]
    for r in reqs:
        r.set_state(RUNNING)
        r.computed = 50
    live = LiveViews(reqs)
    a = SnapshotTable().columns([], live)
    b = SnapshotTable().columns([], list(live))
    assert ab.same_columns(a, b)
    for f in dataclasses.fields(a):
        value = getattr(b, f.name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            changed = value.copy()
            changed[0] = 12345.0  # unlike any value here, NaN included
            assert not ab.same_columns(a, dataclasses.replace(b, **{f.name: changed})), f.name
