"""bench/run_phases.py splits a run's CPU at the last arrival, counts the drain's decisions and the
garbage collector's time, and leaves FleetSim as it found it."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.sim.fleet import FleetSim


@pytest.fixture(scope="module")
def rp() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the script imports it by name
    return load_script(ROOT / "bench" / "run_phases.py", "run_phases")


def test_phases_of_an_overloaded_run_against_a_light_one(rp: ModuleType) -> None:
    step, run = FleetSim._step, FleetSim.run
    heavy = rp.phases(rp.gmax_sweep.Task("conv", 1, 0, 12.0, "tempo", ("token",), 6.0, "round-robin"))
    assert FleetSim._step is step and FleetSim.run is run  # restored
    assert 0 < heavy["drain_cpu_s"] < heavy["cpu_s"]
    assert 0 < heavy["drain_share"] < 1
    # 12 req/s on one replica is three times its capacity: a queue is left when arrivals stop
    assert heavy["waiting_at_drain"] > 0 and heavy["running_at_drain"] > 0
    assert heavy["end_s"] > heavy["last_arrival_s"] > 5.0
    assert 0 < heavy["drain_decisions"] < heavy["decisions"]
    assert heavy["gc_s"] >= 0 and sum(heavy["collections"]) >= 0
    light = rp.phases(rp.gmax_sweep.Task("conv", 1, 0, 0.5, "tempo", ("token",), 6.0, "round-robin"))
    assert light["waiting_at_drain"] <= 1  # at half a request a second only the last arrival waits
    queued = heavy["waiting_at_drain"] + heavy["running_at_drain"]
    assert light["waiting_at_drain"] + light["running_at_drain"] < queued / 4
    text = rp.table([heavy, light], "t")
    assert text.count("| tempo |") == 2


def test_the_collector_settings_give_the_same_record(rp: ModuleType) -> None:
    task = rp.gmax_sweep.Task("conv", 1, 0, 12.0, "tempo", ("token",), 30.0, "round-robin")
    young = rp.phases(task, "young")
    default = rp.phases(task, "default")
    assert young["record"] == default["record"]
    assert (young["collector"], default["collector"]) == ("young", "default")
    # the counts cover the whole task (the workload built, the record summarized: CPython's
    # thresholds there), the simulation in between collecting far less often when paused
    assert sum(default["collections"]) > sum(young["collections"])
    assert rp.fleet_module.young_collections_only is not None  # put back


def test_the_task_options_name_one_run_of_the_grid(rp: ModuleType) -> None:
    ap = argparse.ArgumentParser()
    rp.gmax_sweep.add_task_arguments(ap, duration_s=120.0)
    args = ap.parse_args(["--rps", "26", "--family", "conv", "--objective", "request"])
    task = rp.gmax_sweep.task_of(args, "gmax")
    assert task == rp.gmax_sweep.Task("conv", 4, 0, 26.0, "gmax", ("request",), 120.0, "round-robin")
