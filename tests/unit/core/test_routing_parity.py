"""The simulator runs what is deployed: the router service and the fleet simulator make the same routing
AND admission decision on the same snapshot.

One fleet state (two simulated replicas with queues) is the snapshot: the simulator routes an arrival
through its fleet step (``FleetSim._arrive``: a SimRequest, then the core routing pipeline), and the
same snapshots are fed to a live router's endpoints (``EndpointState.update_view``), which serves the
same request through its real HTTP path (``/v1/completions``: intake, pipeline, admission, upstream).
Both must pick the same replica, or both reject it (503 / REJECTED), or both demote it to best effort
and then pick the same replica.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from slo_core.perf.profiles import load_profile
from slo_core.policies.registry import make_router_policy
from slo_core.routing import RoutingPipeline, SnapshotEndpoint, bounded_scores
from slo_core.runtime_policy import AdmissionRule
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.sim.request import REJECTED, SimRequest
from slo_core.sim.views import request_view
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.workloads.jobs import Job
from slo_lab.loopback_pods import LoopbackPods, close_all
from slo_router.app import RouterState, create_app
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.metrics import RouterMetrics
from slo_router.tenants import KeyStore, Tenant

PROFILE = load_profile("h100-llama3-8b-tp1")
TIERS = {
    "gold": SLOTier("gold", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=0.3, tbt_s=0.05),
    "spare": SLOTier("spare", RequestKind.BEST_EFFORT, PriorityClass("spare", 0.1)),
}
NOW = 10.0
PROMPT_TOKENS = 200
MAX_TOKENS = 64


@pytest.fixture(autouse=True)
async def _stop_loopback_pods() -> AsyncIterator[None]:
    yield
    await close_all()


def build_sim(router: str, admission: AdmissionRule, queued: tuple[int, int], seed: int) -> FleetSim:
    """Two replicas; replica i holds ``queued[i]`` waiting gold requests of 3000 prompt tokens."""
    sim = FleetSim(
        [ReplicaSpec(PROFILE, EngineConfig())] * 2,
        "fcfs",
        router,
        config=SimConfig(drain="all"),
        admission=admission,
    )
    sim.run([])  # sets up the run's bookkeeping; no event happens
    gold = TIERS["gold"].targets()
    for i, n in enumerate(queued):
        for k in range(n):
            r = SimRequest(f"q{i}-{k}", NOW - 0.01, gold, 3000, output_tokens=100, max_tokens=100)
            assert sim.engines[i].accept(r, NOW - 0.01)
    sim.router_rng = random.Random(seed)
    return sim


def sim_decision(sim: FleetSim) -> tuple[str | None, str]:
    """Where the simulator's fleet step sends a new gold request, and its tier after admission."""
    job = Job(
        "new",
        NOW,
        TIERS["gold"].targets(),
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=10,
        max_tokens=MAX_TOKENS,
    )
    sim._arrive(job, NOW)  # the fleet's arrival step: SimRequest, then the routing pipeline
    r = sim._requests[-1]
    if r.state == REJECTED:
        return None, "rejected"
    kind = "spare" if r.slo.kind is RequestKind.BEST_EFFORT else "gold"
    return sim.engines[r.replica].engine_id, kind


async def router_decision(
    sim: FleetSim, router: str, seed: int, **cfg: Any
) -> tuple[str | None, str, httpx.Response]:
    """The live router, its endpoints fed the simulator's snapshots, serving the same request."""
    seen: list[httpx.Request] = []

    def pod(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1, "total_tokens": PROMPT_TOKENS + 1}
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    endpoints = {}
    models: set[str] = set()
    for e in sim.engines:
        view = e.replica_view(NOW, with_requests=True)
        ep = EndpointState(EndpointSpec(e.engine_id, f"http://{e.engine_id}.pod"))
        ep.update_view(view, NOW)
        endpoints[e.engine_id] = ep
        models.update(view.capabilities.models)
    model = min(models) if models else "m"  # the model the simulated replicas serve
    state = RouterState(
        config=RouterConfig(
            tiers=TIERS,
            default_tier="gold",
            tenants={"t": Tenant("t", ("gold", "spare"), "gold")},
            best_effort_tier="spare",
            **cfg,
        ),
        keys=KeyStore({"k": "t"}),
        endpoints=endpoints,
        metrics=RouterMetrics(),
        policy=make_router_policy(router),
        rng=random.Random(seed),
        client=LoopbackPods(pod).session(),
        clock=lambda: NOW,
    )
    body = {"model": model, "prompt": "x" * (4 * PROMPT_TOKENS), "max_tokens": MAX_TOKENS}
    app = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=app, base_url="http://r") as client:
        resp = await client.post("/v1/completions", json=body, headers={"authorization": "Bearer k"})
    if resp.status_code == 503:
        return None, "rejected", resp
    assert resp.status_code == 200, resp.text
    (sent,) = seen
    return sent.url.host.removesuffix(".pod"), sent.headers["x-slo-tier"], resp


CASES = [
    # (router policy, queued per replica, admission, expected outcome)
    ("go-routing", (0, 6), "reject", "gold"),  # light: the idle replica gains
    ("go-routing", (30, 30), "reject", "rejected"),  # overload: no replica gains → early 503
    ("go-routing", (30, 30), "best-effort", "spare"),  # overload: demoted, then routed as best effort
    ("go-routing", (30, 30), "admit", "gold"),  # overload, admitted anyway
    ("min-load", (30, 2), "reject", "gold"),  # not gain-scored: never infeasible by gain
    ("power-of-k", (3, 30), "reject", "gold"),
    ("slos-serve-reroute", (30, 30), "best-effort", "spare"),  # the policy's own best-effort backup
    ("slos-serve-reroute", (30, 30), "reject", "rejected"),
    ("p2c", (5, 9), "reject", "gold"),
    ("round-robin", (5, 9), "reject", "gold"),
]


def admission_of(action: str) -> tuple[AdmissionRule, dict[str, Any]]:
    """The same admission rule for the simulator and the router's config."""
    if action == "best-effort":
        return AdmissionRule("best-effort", "spare", TIERS["spare"]), {"overload_to_best_effort": True}
    if action == "admit":
        return AdmissionRule("admit", "spare"), {"reject_infeasible": False}
    return AdmissionRule("reject", "spare"), {}


@pytest.mark.parametrize(("router", "queued", "action", "expected"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_router_service_and_simulator_decide_alike(
    router: str, queued: tuple[int, int], action: str, expected: str, seed: int
) -> None:
    rule, cfg = admission_of(action)
    live_sim = build_sim(router, rule, queued, seed)  # the router reads this one's snapshots
    pick, tier, resp = await router_decision(live_sim, router, seed, **cfg)
    sim_pick, sim_tier = sim_decision(build_sim(router, rule, queued, seed))
    assert (pick, tier) == (sim_pick, sim_tier)
    assert tier == expected  # the scenario exercises what it says
    if expected == "rejected":
        assert "retry-after" in {k.lower() for k in resp.headers}


def test_the_router_config_enforces_the_admission_rule_the_simulator_gets() -> None:
    for action in ("reject", "best-effort", "admit"):
        rule, cfg = admission_of(action)
        config = RouterConfig(tiers=TIERS, default_tier="gold", tenants={}, best_effort_tier="spare", **cfg)
        assert (config.admission.on_overload, config.admission.best_effort) == (
            rule.on_overload,
            rule.best_effort,
        )


def test_pipeline_is_the_only_filter_and_bounded_scores_stay_in_unit_range() -> None:
    sim = build_sim("go-routing", AdmissionRule(), (0, 6), 0)
    views = [e.replica_view(NOW) for e in sim.engines]
    pipe = RoutingPipeline(make_router_policy("go-routing"), AdmissionRule("admit"), shuffle=False)
    req = sim.engines[1].waiting[0]
    routed = pipe.route(
        request_view(req), [SnapshotEndpoint(v) for v in views], now_s=NOW, rng=random.Random(0)
    )
    assert all(0.0 <= s <= 1.0 for s in bounded_scores(routed.decision).values())
