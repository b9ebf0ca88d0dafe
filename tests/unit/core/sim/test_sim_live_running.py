"""An engine that hands GMAX its running requests as live snapshots (SimEngine ``live_running``: the
snapshot table reads their progress fields from the requests, no RequestView built for each at every
step) produces the run that a snapshot of each produces: the same tokens at the same times, the same
preemptions and decisions, and the same learned state in the policy. The table's columns from live
requests equal its columns from their snapshots, for every shape of request, a calibrated bound
schedule (read through the request's view, as a snapshot would read it) included; and the live
sequence cannot be read once its decision has returned, except for snapshots already built.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest
from sim_outcomes import outcomes

from slo_core.objective import Objective
from slo_core.perf import load_profile
from slo_core.policies.gmax_snapshot import SnapshotTable
from slo_core.policies.registry import make_engine_policy
from slo_core.predict import load_estimator
from slo_core.predict.calibration import OnlineCalibrator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.sim.request import RUNNING, WAITING, ProgramState, SimRequest
from slo_core.sim.views import LiveViews, request_views
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads import WorkloadSpec, build_workload

H100 = load_profile("h100-llama3-8b-tp1")

POLICIES = ("gmax", "gmax-oracle", "gmax-no-analyzer", "gmax-no-gmax")

CASES: dict[str, tuple[WorkloadSpec, int | None, int, str, Objective]] = {
    # overloaded, KV pressure (engine preemptions), compound programs, request goodput with fairness
    "mixed-kv-pressure": (
        WorkloadSpec(duration_s=6, rps=24, mix=(1, 1, 1), seed=3),
        60_000,
        64,
        "min-load",
        Objective(goodput="request", fairness=0.3),
    ),
    # Tree-of-Thoughts: deep queues of programs' calls, token goodput
    "tot": (
        WorkloadSpec(duration_s=8, rps=8, mix=(0, 0, 1), dags="tot", seed=4),
        200_000,
        48,
        "round-robin",
        Objective(goodput="token"),
    ),
    # light load: small snapshots, the scalar path (which builds every running snapshot)
    "light-latency": (
        WorkloadSpec(duration_s=20.0, rps=4.0, mix=(1, 0, 0), seed=9),
        None,
        256,
        "round-robin",
        Objective(goodput="token"),
    ),
}


def _factory(name: str, objective: Objective, *, live: bool) -> Any:
    def make() -> Any:
        p = make_engine_policy(name, None, objective)
        if not live:
            p.live_running = False
        return p

    return make


def _policy_state(sim: FleetSim) -> list[tuple[object, ...]]:
    return [
        (
            e.policy.bounds._first,  # type: ignore[attr-defined]
            e.policy.bounds.z_by_kind,  # type: ignore[attr-defined]
            e.policy.correction.factor,  # type: ignore[attr-defined]
        )
        for e in sim.engines
    ]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_live_running_snapshots_change_no_outcome(case: str, policy: str) -> None:
    workload, kv, seqs, router, objective = CASES[case]
    jobs = build_workload(workload)
    spec = ReplicaSpec(H100, EngineConfig(kv_cache_tokens=kv, max_num_seqs=seqs))
    runs = []
    for live in (True, False):
        sim = FleetSim(
            [spec, spec],
            _factory(policy, objective, live=live),
            router,
            seed=3,
            analyzer=SimAnalyzer(load_estimator()),
            objective=objective,
        )
        assert all(e._live is live for e in sim.engines)
        runs.append((sim, sim.run(jobs)))
    (live_sim, live_run), (ref_sim, ref_run) = runs
    assert outcomes(live_run) == outcomes(ref_run)
    assert live_run.replica_stats == ref_run.replica_stats  # decisions and preemptions included
    assert _policy_state(live_sim) == _policy_state(ref_sim)
    if case == "mixed-kv-pressure":
        assert sum(s["preemptions"] for s in live_run.replica_stats) > 0


def test_an_online_calibrated_analyzer_keeps_the_snapshots() -> None:
    """It learns from every view a decision refreshes: the fleet does not hand out live ones."""
    est = load_estimator()
    analyzer = SimAnalyzer(est, calibrator=OnlineCalibrator(est.params.quantile))
    sim = FleetSim([ReplicaSpec(H100)], "gmax", "round-robin", analyzer=analyzer)
    assert not any(e._live for e in sim.engines)
    assert all(e._live for e in FleetSim([ReplicaSpec(H100)], "gmax", "round-robin").engines)
    assert not any(e._live for e in FleetSim([ReplicaSpec(H100)], "edf", "round-robin").engines)


SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=8.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=30.0),
)


def _requests(
    rng: random.Random, n: int, plain: SimAnalyzer, calibrated: SimAnalyzer | None
) -> list[SimRequest]:
    """Running requests of every shape (and one still marked waiting), some in programs, with no
    bound, a plain bound schedule or a calibrated one, counts that cross bound checkpoints."""
    program = ProgramState("prog", 0.5, SLOS[2], (((100, 20), (100, 20)),))
    out = []
    for i in range(n):
        slo = rng.choice(SLOS)
        in_program = rng.random() < 0.4
        r = SimRequest(
            f"r{i}",
            rng.random() * 3,
            SLOS[2] if in_program else slo,
            rng.randrange(1, 3000),
            output_tokens=rng.randrange(1, 400),
            max_tokens=rng.choice((128, 512)),
            deadline_at_s=None if slo.kind is RequestKind.LATENCY and not in_program else 9.0 + i,
            program=program if in_program else None,
            stage=0 if in_program else None,
        )
        if in_program:
            program.calls.append(r)
        schedule = rng.choice(("none", "plain", "calibrated"))
        analyzer = calibrated if schedule == "calibrated" and calibrated is not None else plain
        if schedule != "none":
            r.bound_schedule = analyzer.schedule(r.prompt_tokens, r.slo.kind.value, r.max_tokens)
        r.set_state(WAITING if i == n - 1 else RUNNING)
        r.computed = rng.randrange(0, r.prompt_tokens + 1)
        r.generated = rng.choice((0, 0, rng.randrange(1, 300)))
        if r.generated:
            r.computed = r.prompt_tokens + r.generated - 1
        r.waiting_since_s = rng.random()
        out.append(r)
    return out


def _columns_equal(a: Any, b: Any) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("with_calibrated", [False, True])
def test_columns_from_live_requests_equal_columns_from_their_snapshots(with_calibrated: bool) -> None:
    rng = random.Random(5)
    est = load_estimator()
    calibrated = (
        SimAnalyzer(est, calibrator=OnlineCalibrator(est.params.quantile)) if with_calibrated else None
    )
    reqs = _requests(rng, 40, SimAnalyzer(est), calibrated)
    waiting = reqs[:10]
    running = reqs[10:]
    seen_live: list[str] = []
    seen_views: list[str] = []
    live_table = SnapshotTable(on_fresh=lambda rs: seen_live.extend(r.request_id for r in rs))
    view_table = SnapshotTable(on_fresh=lambda rs: seen_views.extend(r.request_id for r in rs))
    for round_ in range(4):  # the requests move between rounds; the tables keep their caches
        live = LiveViews(running)
        c_live = live_table.columns(request_views(waiting), live)
        live.close()
        c_views = view_table.columns(request_views(waiting), request_views(running))
        _columns_equal(c_live, c_views)
        assert set(seen_live) == set(seen_views)
        running[-1].set_state(RUNNING if round_ % 2 == 0 else WAITING)  # all running, or one not
        for r in running:
            r.generated += 7 * (round_ + 1)
            r.computed = r.prompt_tokens + r.generated - 1
            r.view_key = None
            if r.program is not None:
                r.program.attained_cache = -1


def test_live_snapshots_are_not_read_after_their_decision() -> None:
    rng = random.Random(2)
    reqs = _requests(rng, 5, SimAnalyzer(load_estimator()), None)
    kept = LiveViews(reqs)
    views = list(kept)  # built while the decision runs: kept afterwards
    kept.close()
    assert list(kept) == views and kept[0] is views[0] and len(kept) == 5
    unread = LiveViews(reqs)
    assert len(unread) == 5
    unread.close()
    assert len(unread) == 5
    with pytest.raises(RuntimeError):
        unread[0]
    with pytest.raises(RuntimeError):
        unread.progress()


def test_a_live_table_follows_requests_between_the_queues_across_calls() -> None:
    """A table kept across calls (it finds a waiting snapshot it saw last call by identity) gives the
    columns a snapshot-only table gives, while requests start, are preempted, leave, arrive, and get
    new snapshots or keep theirs."""
    rng = random.Random(11)
    reqs = _requests(rng, 90, SimAnalyzer(load_estimator()), None)
    pool, reqs = reqs[60:], reqs[:60]
    waiting, running = reqs[:30], reqs[30:]
    live_table, view_table = SnapshotTable(), SnapshotTable()
    for _ in range(10):
        for r in waiting:
            if r.state != WAITING:
                r.set_state(WAITING)
        for r in running:
            if r.state != RUNNING:
                r.set_state(RUNNING)
        live = LiveViews(running)
        c_live = live_table.columns(request_views(waiting), live)
        live.close()
        _columns_equal(c_live, view_table.columns(request_views(waiting), request_views(running)))
        rng.shuffle(waiting)
        started = [waiting.pop() for _ in range(min(3, len(waiting)))]
        preempted = [running.pop(rng.randrange(len(running))) for _ in range(min(3, len(running)))]
        for r in preempted:
            r.computed = 0
        gone = [waiting.pop() for _ in range(min(2, len(waiting)))]
        del gone
        arrived = [pool.pop() for _ in range(min(3, len(pool)))]
        waiting += preempted + arrived
        running += started
        for r in rng.sample(waiting, k=min(5, len(waiting))):
            r.view_key = None  # a new snapshot, of the same counts
        for r in running:
            r.generated += 1
            r.computed = r.prompt_tokens + r.generated - 1
            r.view_key = None
            if r.program is not None:
                r.program.attained_cache = -1
