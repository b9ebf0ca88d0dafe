"""A simulation with Tempo reading a long queue through its SnapshotTable (the running requests live
from the engine) is the simulation with Tempo reading every snapshot (the numpy reference)."""

from __future__ import annotations

from collections.abc import Sequence

from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.base import EngineView, RequestView
from slo_core.policies.gmax_snapshot import LiveSnapshots
from slo_core.policies.tempo import SCALAR_MAX, Densities, Ranked, Tempo, service_densities
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")


class CountingTempo(Tempo):
    """Tempo as shipped, counting its decisions over long queues (the table path)."""

    long_decisions = 0
    live_decisions = 0

    def densities(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> Ranked:
        ranked = super().densities(waiting, running, engine)
        if isinstance(ranked.densities, Densities):
            CountingTempo.long_decisions += 1
            CountingTempo.live_decisions += isinstance(running, LiveSnapshots)
        return ranked


class SnapshotTempo(Tempo):
    """Tempo reading a long queue from its snapshots (every running one built at every decision)."""

    live_running = False

    def densities(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> Ranked:
        if len(waiting) + len(running) <= SCALAR_MAX:
            return super().densities(waiting, running, engine)
        reqs = [*running, *waiting]
        d = service_densities(reqs, running, engine, self.params)
        return Ranked(
            d,
            self.priority_order(d, engine.max_num_seqs),
            [r.request_id for r in reqs],
            lambda i: reqs[i].prompt_tokens + reqs[i].generated_tokens,
            lambda i: reqs[i].kv_tokens,
        )


def test_the_table_path_runs_the_snapshot_reference() -> None:
    # overloaded, compound programs, KV pressure: long queues, preemptions, program stages
    jobs = build_workload(WorkloadSpec(duration_s=8, rps=30, mix=(1, 1, 1), seed=5))
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=80_000, max_num_seqs=48))
    runs = [
        outcomes(FleetSim([spec, spec], cls, "min-load", seed=2).run(jobs))
        for cls in (CountingTempo, SnapshotTempo)
    ]
    assert CountingTempo.long_decisions > 100
    assert CountingTempo.live_decisions == CountingTempo.long_decisions  # the engine's requests, live
    assert runs[0] == runs[1]
