"""A simulation runs with the garbage collector's older generations left alone, and gives every
threshold back afterwards: nested, from several threads, after an error, and never turning on a
collector the caller had turned off. The records are the same either way (the golden digests in
test_sim_golden.py pin them; here a run is compared with itself under the default collector)."""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Iterator, Sequence

import pytest

from slo_core.perf import load_profile
from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.sim import collector
from slo_core.sim.collector import YOUNG_THRESHOLD, young_collections_only
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload

YOUNG = (YOUNG_THRESHOLD, collector._NEVER, collector._NEVER)


@pytest.fixture(autouse=True)
def _default_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


class Watching(BaseEnginePolicy):
    """FCFS that notes the collector's thresholds at each decision."""

    name = "watching"

    def __init__(self) -> None:
        self.seen: set[tuple[int, int, int]] = set()

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        self.seen.add(gc.get_threshold())
        return Decision()


def _run(policy: BaseEnginePolicy | str) -> FleetSim:
    made = policy if isinstance(policy, str) else (lambda: policy)
    spec = ReplicaSpec(load_profile("h100-llama3-8b-tp1"), EngineConfig(max_num_seqs=16))
    sim = FleetSim([spec], made, "round-robin")
    sim.run(build_workload(WorkloadSpec(duration_s=4.0, rps=30.0, mix=(1, 1, 1), seed=1)))
    return sim


def test_a_run_decides_under_young_collections_only_and_restores_them() -> None:
    policy = Watching()
    _run(policy)
    assert policy.seen == {YOUNG}
    assert gc.get_threshold() == (700, 10, 10)


def test_nested_and_failing_bodies_restore_the_thresholds() -> None:
    with young_collections_only():
        with young_collections_only():
            assert gc.get_threshold() == YOUNG
        assert gc.get_threshold() == YOUNG  # the outer one is still inside
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(RuntimeError), young_collections_only():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_threads_restore_when_the_last_one_leaves() -> None:
    inside = threading.Barrier(3)
    leave = threading.Event()

    def body() -> None:
        with young_collections_only():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=body) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert gc.get_threshold() == YOUNG
    leave.set()
    for t in threads:
        t.join()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_collector_turned_off_stays_off() -> None:
    gc.set_threshold(0)
    with young_collections_only():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold()[0] == 0


def test_the_record_is_the_same_with_the_default_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    def requests(sim: FleetSim) -> list[tuple[str, float | None, int]]:
        return [(r.request_id, r.finish_s, r.generated) for r in sim._requests]

    paused = requests(_run("gmax"))
    monkeypatch.setattr(collector, "YOUNG_THRESHOLD", 1)  # a young pass at every allocation
    monkeypatch.setattr(collector, "_NEVER", 1)  # and full passes all the time
    assert requests(_run("gmax")) == paused
