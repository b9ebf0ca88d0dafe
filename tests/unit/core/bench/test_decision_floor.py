"""bench/decision_floor.py runs FCFS's schedule through the decision path: the probes' runs equal
FCFS's (outcome digests), they decide where FCFS does not, and a probe that is not FCFS's schedule is
refused."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.policies.base import Decision


@pytest.fixture(scope="module")
def df() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the scripts import them by name
    load_script(ROOT / "bench" / "run_phases.py", "run_phases")
    return load_script(ROOT / "bench" / "decision_floor.py", "decision_floor")


def _args(**kw: object) -> argparse.Namespace:
    base = {"family": "conv", "replicas": 1, "rps": 12.0, "duration": 6.0, "seed": 0}
    return argparse.Namespace(**{**base, "objective": "token", "router": "round-robin", **kw})


def test_the_probes_run_fcfs_schedule_through_the_decision_path(df: ModuleType) -> None:
    rows = df.floor(_args())
    assert [r["policy"] for r in rows] == ["fcfs", "fcfs-every-step", "views-every-step"]
    assert len({r["outcome"] for r in rows}) == 1 and len({r["record"] for r in rows}) == 3
    assert rows[0]["decisions"] == 0 and rows[1]["decisions"] == rows[2]["decisions"] > 0
    assert df.table(rows, "t").count("| fcfs") == 2


def test_a_probe_with_another_schedule_is_refused(df: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def shed_newest(self, waiting, running, engine, rng):  # type: ignore[no-untyped-def]
        return Decision(reject=tuple(r.request_id for r in waiting[-1:]), prefill_first=True)

    monkeypatch.setattr(df.ViewsEveryStep, "decide", shed_newest)
    with pytest.raises(SystemExit, match="differs"):
        df.floor(_args())
