"""Issue 15: the objective (spec.goodput, spec.fairness) is what SLO-aware policies maximize; GMAX's
probabilistic feasibility; the offline upper bound."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from builders import CP, DL, engine, request
from repo_paths import ROOT

from slo_core.crd.policy import SLOPolicy
from slo_core.gain import GainParams
from slo_core.metrics import job_outcomes, summarize
from slo_core.metrics.ceiling import offline_bound
from slo_core.objective import Objective
from slo_core.perf import load_profile
from slo_core.policies.base import RequestView
from slo_core.policies.gmax import GMAX
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import SpeedModel, estimate, fit_probability, normal_cdf
from slo_core.policies.gmax_snapshot import SnapshotTable
from slo_core.policies.registry import make_engine_policy, make_router_policy, objective_aware
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.jobs import Job

PROFILE = load_profile("h100-llama3-8b-tp1")


def _spec() -> Any:
    doc = yaml.safe_load((ROOT / "examples" / "slopolicy-chat-agent.yaml").read_text(encoding="utf-8"))
    doc["spec"]["goodput"] = {"name": "tdg", "firstTokenWeight": 3.0, "decodeTokenWeight": 0.5}
    doc["spec"]["fairness"] = 0.4
    return SLOPolicy.model_validate(doc).spec


# ---- the objective type and the registry -----------------------------------------------------------


def test_objective_is_read_from_spec_goodput_and_fairness() -> None:
    obj = Objective.from_spec(_spec())
    assert obj.goodput == "tdg"
    assert obj.gain.first_token_weight == 3.0 and obj.gain.decode_token_weight == 0.5
    assert obj.fairness == 0.4
    assert obj.function().__name__ == "tdg_gain"


def test_every_slo_aware_policy_takes_the_objective() -> None:
    obj = Objective(goodput="request", fairness=0.3, gain=GainParams(alpha=2.0))
    g = make_engine_policy("gmax", None, obj)
    assert isinstance(g, GMAX)
    assert (g.params.goodput, g.params.fairness, g.params.gain.alpha) == ("request", 0.3, 2.0)
    for variant in ("gmax-oracle", "gmax-no-analyzer", "gmax-no-gmax"):
        assert make_engine_policy(variant, None, obj).params.goodput == "request"  # type: ignore[attr-defined]
    assert make_engine_policy("slos-serve", None, obj).params.value == "request"  # type: ignore[attr-defined]
    assert make_engine_policy("slos-serve", None, Objective()).params.value == "tokens"  # type: ignore[attr-defined]
    tdg = Objective(goodput="tdg", gain=GainParams(first_token_weight=4.0, decode_token_weight=0.5))
    sb = make_engine_policy("slide-batching", None, tdg).params  # type: ignore[attr-defined]
    assert (sb.first_token_weight, sb.decode_token_weight) == (4.0, 0.5)
    tempo = make_engine_policy("tempo", None, Objective(goodput="token")).params  # type: ignore[attr-defined]
    assert (tempo.input_weight, tempo.output_weight) == (1.0, 1.0)
    assert make_router_policy("go-routing", None, tdg).params.first_token_weight == 4.0  # type: ignore[attr-defined]
    pk = make_router_policy("power-of-k", {"k": 2}, obj).params  # type: ignore[attr-defined]
    assert pk.k == 2 and pk.gmax.goodput == "request"
    # FCFS has nothing to maximize: it ignores the objective.
    assert not objective_aware("fcfs") and objective_aware("gmax") and objective_aware("go-routing", "router")
    make_engine_policy("fcfs", None, obj)


def test_params_that_contradict_the_objective_are_refused() -> None:
    with pytest.raises(ValueError, match="contradicts the objective"):
        make_engine_policy("gmax", {"goodput": "token"}, Objective(goodput="request"))
    # the same value is fine, and without an objective a policy keeps its own params
    assert make_engine_policy("gmax", {"goodput": "request"}, Objective(goodput="request")) is not None
    assert make_engine_policy("gmax", {"goodput": "tdg"}).params.goodput == "tdg"  # type: ignore[attr-defined]


def test_bench_builds_the_objective_from_a_policy_file_and_flags(tmp_path: Path) -> None:
    from slo_core.bench.cli import UsageError, objective_from_args

    path = tmp_path / "p.yaml"
    doc = yaml.safe_load((ROOT / "examples" / "slopolicy-chat-agent.yaml").read_text(encoding="utf-8"))
    doc["spec"]["goodput"] = {"name": "request"}
    doc["spec"]["fairness"] = 0.25
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")

    def ns(**kw: Any) -> argparse.Namespace:
        base = {"slo_policy": None, "objective": None, "goodput": None, "fairness": None}
        return argparse.Namespace(**{**base, **kw})

    assert objective_from_args(ns()) == Objective()
    assert objective_from_args(ns(slo_policy=str(path))) == Objective(goodput="request", fairness=0.25)
    got = objective_from_args(ns(slo_policy=str(path), objective="tdg", fairness=0.0))
    assert (got.goodput, got.fairness) == ("tdg", 0.0)
    with pytest.raises(UsageError, match="--fairness"):
        objective_from_args(ns(fairness=2.0))
    with pytest.raises(UsageError, match="--slo-policy"):
        objective_from_args(ns(slo_policy=str(tmp_path / "missing.yaml")))


def test_the_simulator_feeds_policies_the_objectives_gain() -> None:
    seen: list[tuple[float, float]] = []

    class Spy(GMAX):
        def observe(self, finished: Any, now_s: float) -> None:
            seen.extend((f.gain, f.ideal_gain) for f in finished)
            super().observe(finished, now_s)

    jobs = [Job(f"j{i}", float(i) * 0.1, DL, prompt_tokens=50, output_tokens=20) for i in range(5)]
    obj = Objective(goodput="request")
    FleetSim(
        [ReplicaSpec(PROFILE, EngineConfig())], lambda: Spy(**Spy.objective_params(obj)), objective=obj
    ).run(jobs)
    assert seen and all(gain == 1.0 and ideal == 1.0 for gain, ideal in seen)  # request goodput: 1 each


# ---- spec.fairness: a tenant cannot take the whole engine ----------------------------------------


def _two_tenant_jobs() -> list[Job]:
    """A heavy tenant floods with weight-2 deadline requests (far beyond capacity); a light one
    sends one weight-1 request a second."""
    rng = random.Random(3)
    heavy = SLOTargets(RequestKind.DEADLINE, deadline_s=8.0, priority_class="high", priority_weight=2.0)
    light = SLOTargets(RequestKind.DEADLINE, deadline_s=8.0, priority_class="low", priority_weight=1.0)
    jobs = [
        Job(f"h{i}", i / 40.0, heavy, prompt_tokens=400, output_tokens=rng.randint(300, 500), tenant="heavy")
        for i in range(40 * 20)
    ]
    jobs += [
        Job(f"l{i}", i + 0.5, light, prompt_tokens=400, output_tokens=rng.randint(300, 500), tenant="light")
        for i in range(20)
    ]
    return jobs


def _light_share(fairness: float) -> tuple[float, float]:
    """(light tenant's attainment, heavy tenant's attainment) under GMAX with spec.fairness."""
    obj = Objective(fairness=fairness, fairness_half_life_s=10.0)
    cfg = EngineConfig(max_num_seqs=16)
    res = FleetSim([ReplicaSpec(PROFILE, cfg)], "gmax", objective=obj, seed=1).run(_two_tenant_jobs())
    met: dict[str, list[bool]] = {"heavy": [], "light": []}
    for o, job in zip(job_outcomes(res), res.jobs, strict=True):
        met[job.tenant].append(o.gains.get("request", 0.0) > 0)
    return float(np.mean(met["light"])), float(np.mean(met["heavy"]))


def test_fairness_keeps_a_flooding_tenant_from_taking_the_engine() -> None:
    light_plain, _ = _light_share(0.0)
    light_fair, heavy_fair = _light_share(1.0)
    # Unfair: the flood's weight-2 requests crowd the light tenant out of most slots.
    assert light_plain < 0.5
    # With spec.fairness = 1 the light tenant is served (it has the least attained service).
    assert light_fair >= 0.9
    assert light_fair > light_plain + 0.3
    assert heavy_fair > 0.0  # the flood still gets the rest of the engine


# ---- probabilistic feasibility ---------------------------------------------------------------------


def test_fit_probability_reads_the_bound_as_its_quantile() -> None:
    z95 = 1.6448536
    p = fit_probability(np.array([0.0]), np.array([400.0]), np.array([400.0]), 0.45, z95)
    assert p[0] == pytest.approx(0.95, abs=1e-4)  # time for exactly the bound: the bound's quantile
    slack = np.array([50.0, 100.0, 200.0, 400.0, 800.0])
    ps = fit_probability(np.zeros(5), np.full(5, 400.0), slack, 0.45, z95)
    assert np.all(np.diff(ps) > 0) and ps[-1] > 0.99  # more time, more likely
    assert fit_probability(np.zeros(1), np.array([400.0]), np.array([-1.0]), 0.45, z95)[0] == 0.0
    # conditioning: a request that already generated past most of the mass is likelier to end soon
    early = fit_probability(np.array([0.0]), np.array([400.0]), np.array([100.0]), 0.45, z95)[0]
    late = fit_probability(np.array([300.0]), np.array([400.0]), np.array([100.0]), 0.45, z95)[0]
    assert late > early
    assert normal_cdf(np.array([0.0, 1.6448536, -40.0]))[1] == pytest.approx(0.95, abs=1e-6)


def _cp_call(rid: str, bound: int, gen: int = 0) -> RequestView:
    """A running call of stage 0 of program p (due at 60 s), its stage due at 5 s."""
    return request(
        rid,
        CP,
        max_tokens=4096,
        gen=gen,
        prefilled=True,
        bound=bound,
        program_id="p",
        stage=0,
        program_arrival_s=0.0,
        program_deadline_at_s=60.0,
        deadline_at_s=5.0,
    )


def test_a_stage_whose_bound_misses_but_whose_median_fits_keeps_most_of_its_value() -> None:
    # Two calls bounded (q95) at 800 tokens; at 10 ms/token they need 8 s but the stage has 5 s:
    # the yes/no test zeroes the stage, the probabilistic one keeps P(both fit) of its tokens
    # (judged against the stage sub-deadline here; by default GMAX uses the program's deadline).
    calls = [_cp_call("a", 800), _cp_call("b", 800)]
    cols = SnapshotTable().columns([], calls)
    speed = SpeedModel(step_s=0.01, prefill_s_per_token=0.001)
    hard = estimate(cols, 0.0, speed, GMAXParams(feasibility="bound", compound_deadline="stage"), 0.5)
    soft = estimate(cols, 0.0, speed, GMAXParams(compound_deadline="stage"), 0.5)
    assert hard.goodput[0] == 0.0
    one = fit_probability(np.zeros(1), np.array([800.0]), np.array([500.0]), 0.45, 1.6448536)[0]
    stage_tokens = 2 * (100 + 800)
    assert soft.goodput[0] == pytest.approx(stage_tokens * one**2, rel=1e-6)
    assert 0.3 < one < 0.95
    # the oracle knows the lengths: its test stays yes/no
    oracle = estimate(cols, 0.0, speed, GMAXParams(length_source="oracle", compound_deadline="stage"), 0.5)
    assert oracle.goodput[0] == 0.0


def test_gmax_serves_a_likely_feasible_stage_before_a_hopeless_one() -> None:
    likely = [_cp_call("a", 800), _cp_call("b", 800)]  # median ~380 tokens: fits 5 s at 10 ms
    hopeless = request("h", DL, arrival_s=-18.0, max_tokens=4096, bound=2000, waiting_since_s=-18.0)
    eng = engine(seqs=2, kv_total=1000)
    # the calm guard (on by default) ages an 18-s wait above any density while nothing was dropped,
    # by design (test_gmax_policy.py); this test is about the feasibility test alone
    d = GMAX(feasibility="probabilistic", default_step_s=0.01, calm_delta_per_frame=None).decide(
        [hopeless, *[r for r in likely]], [], eng, random.Random(0)
    )
    assert d.admit[:2] == ("a", "b") or set(d.admit[:2]) == {"a", "b"}


# ---- the offline upper bound -----------------------------------------------------------------------


def test_offline_bound_by_hand() -> None:
    # Two deadline jobs due at 1 s on one replica; each takes W = a·(p+o) + d·kv + … seconds.
    a = Job("a", 0.0, SLOTargets(RequestKind.DEADLINE, deadline_s=1.0), prompt_tokens=100, output_tokens=100)
    b = Job(
        "b",
        0.0,
        SLOTargets(RequestKind.DEADLINE, deadline_s=1.0, priority_weight=2.0),
        prompt_tokens=100,
        output_tokens=100,
    )
    from slo_core.metrics.ceiling import job_work_s

    w = job_work_s(a, (PROFILE,), 256)
    kv = 100 * 100 + 100 * 99 / 2
    expected = (
        PROFILE.a_ms_per_token * 200
        + PROFILE.b_ms_per_token_ctx * 5000
        + PROFILE.d_ms_per_kv_token * kv
        + PROFILE.t_c_ms * (100 / 512 + kv / (2 * PROFILE.kv_cache_tokens))
    ) / 1000
    assert w == pytest.approx(expected)
    plenty = offline_bound([a, b], "token", profiles=(PROFILE,), replicas=1, max_num_seqs=256)
    assert plenty is not None and plenty.ratio == pytest.approx(1.0)
    # shrink time: only 1.5 jobs' work fits before the common due time → b whole, half of a
    tight_a = Job(
        "a", 0.0, SLOTargets(RequestKind.DEADLINE, deadline_s=1.5 * w), prompt_tokens=100, output_tokens=100
    )
    tight_b = Job(
        "b",
        0.0,
        SLOTargets(RequestKind.DEADLINE, deadline_s=1.5 * w, priority_weight=2.0),
        prompt_tokens=100,
        output_tokens=100,
    )
    c = offline_bound([tight_a, tight_b], "token", profiles=(PROFILE,), replicas=1, max_num_seqs=256)
    assert c is not None
    assert c.bound == pytest.approx(2 * 200 + 0.5 * 200)
    assert c.ideal == pytest.approx(600)
    assert offline_bound([tight_a], "tempo", profiles=(PROFILE,), replicas=1, max_num_seqs=256) is None


@pytest.mark.parametrize("goodput", ["token", "request"])
def test_no_policy_beats_the_offline_bound(goodput: str) -> None:
    from slo_core.workloads import WorkloadSpec, build_workload

    jobs = build_workload(WorkloadSpec(trace="azure-conv-2023", duration_s=20, rps=14, seed=2))
    bound = offline_bound(jobs, goodput, profiles=(PROFILE,), replicas=1, max_num_seqs=256)
    assert bound is not None
    for policy in ("fcfs", "strict-priority", "gmax"):
        res = FleetSim(
            [ReplicaSpec(PROFILE, EngineConfig())], policy, objective=Objective(goodput=goodput)
        ).run(jobs)
        got = summarize(res, jobs=job_outcomes(res))
        assert got[f"goodput_{goodput}"] <= bound.bound + 1e-6
        assert got[f"goodput_{goodput}_ratio"] <= bound.ratio + 1e-9
