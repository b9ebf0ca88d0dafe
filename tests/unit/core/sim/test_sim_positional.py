"""The policies that order the whole waiting queue return it by position (``PositionalOrder``): every
position names the snapshot the id names, and a run placed by position is the run placed by id."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from sim_outcomes import outcomes

from slo_core.perf import load_profile
from slo_core.policies.autellix import AutellixPLAS
from slo_core.policies.base import Decision, EngineView, PositionalOrder, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.policies.tempo import Tempo
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")
POLICIES = {"gmax": GMAX, "autellix": AutellixPLAS, "tempo": Tempo}


def checked(cls: type, *, by_id: bool) -> tuple[type, list[int], list[int]]:
    """``cls`` with every positional admit checked against the snapshots it was given (and, with
    ``by_id``, handed to the engine as the plain tuple of its ids); the counts of positional ones, and
    of those that preempt."""
    seen = [0]
    preempting = [0]

    def decide(
        self: Any,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        d: Decision = cls.decide(self, waiting, running, engine, rng)
        admit = d.admit
        if isinstance(admit, PositionalOrder):
            seen[0] += 1
            # the admission pool: the preempted in running order, then the waiting
            pre = set(d.preempt)
            pool = [*(r for r in running if r.request_id in pre), *waiting] if pre else list(waiting)
            assert admit.n == len(pool)
            assert list(admit) == [pool[i].request_id for i in admit.at]
            preempting[0] += bool(pre)
            if by_id:
                return Decision(**{**{f: getattr(d, f) for f in d.__slots__}, "admit": tuple(admit)})
        return d

    return type(f"Checked{cls.__name__}", (cls,), {"decide": decide}), seen, preempting


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_run_placed_by_position_is_the_run_placed_by_id(name: str) -> None:
    # overloaded, compound programs, KV pressure: deep queues (numpy paths), preemptions, rejects
    jobs = build_workload(WorkloadSpec(duration_s=8, rps=30, mix=(1, 1, 1), seed=5))
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=80_000, max_num_seqs=48))
    runs = []
    for by_id in (False, True):
        cls, seen, preempting = checked(POLICIES[name], by_id=by_id)
        runs.append(outcomes(FleetSim([spec, spec], cls, "min-load", seed=2).run(jobs)))
        assert seen[0] > 50  # the positional path decided
        if name == "autellix":  # with preempted calls in its pool too
            assert preempting[0] > 5
    assert runs[0] == runs[1]
