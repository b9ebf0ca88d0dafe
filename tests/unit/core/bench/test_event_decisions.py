"""bench/event_decisions.py: the probes are GMAX deciding at frame boundaries only (fewer decisions,
the frame each names) or anew only at some events, and the table reads each run against GMAX's at
every event (its deep-queue rule off) at the same point."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script


@pytest.fixture(scope="module")
def ed() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the scripts import them by name
    load_script(ROOT / "bench" / "run_phases.py", "run_phases")
    return load_script(ROOT / "bench" / "event_decisions.py", "event_decisions")


def test_the_probes_decide_at_frames_only(ed: ModuleType) -> None:
    assert ed.GMAXFrames50().frame_steps == 50 and ed.GMAXFrames10().frame_steps == 10
    assert not ed.GMAXFrames50.reschedule_on_events and not ed.GMAXFrames10.reschedule_on_events
    # the base and the frame probes take every event whatever the depth; gmax-deep-10 is GMAX's default
    for cls in (ed.GMAXEveryEvent, ed.GMAXFrames50, ed.GMAXFrames10, ed.GMAXLatencyEvents):
        assert cls().deep_queue_from == 0
    assert ed.GMAXDeep10().params == ed.GMAX().params
    args = argparse.Namespace(
        points="conv:12",
        replicas=1,
        duration=6.0,
        seed=0,
        objectives="request",
        router="round-robin",
        probes="",
    )
    rows = ed.compare(args)
    by = {r["policy"]: r for r in rows}
    base = by[ed.BASE]
    assert list(by) == [ed.BASE, *ed.PROBES]
    assert by["gmax-frames-50"]["decisions"] < by["gmax-frames-10"]["decisions"] < base["decisions"]
    assert by["gmax-latency-events"]["record"] != base["record"]
    # a queue this short never reaches 512: the base's very run under another name
    assert by["gmax-deep-cadence"]["outcome"] == base["outcome"]
    assert by["gmax-deep-10"]["outcome"] == base["outcome"]
    assert (ed.GMAXDeep10().deep_queue_from, ed.GMAXDeep10().deep_queue_every) == (512, 10)
    assert all(0 <= r["goodput"] <= 1 and r["goodput"] == r["goodput_request_ratio"] for r in rows)
    text = ed.table(rows, "t")
    assert text.count("| conv | 12 | request |") == 1 + len(ed.PROBES) and "| 1.00 |" in text
