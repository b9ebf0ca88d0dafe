"""The operator's scaling loop, pure parts: the same signals and decisions as the simulator's autoscaler
on the same counter stream, the signals read off real sidecar metrics, deletion costs, the parameters
from the CRD."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from repo_paths import ROOT

from slo_core.crd.autoscaling import AutoscalingSpec
from slo_core.perf.profiles import load_profile
from slo_core.scaling import PodCounters, ScaleStep, ScalingLoop, deletion_cost, window
from slo_core.sim.autoscale import Autoscaler, capacity_tokens_per_s, startup_time_s
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.slo import RequestKind, SLOTargets
from slo_core.workloads.jobs import Job
from slo_operator import fleetmetrics
from slo_operator.autoscaler import Autoscaler as OperatorAutoscaler
from slo_operator.autoscaler import Memory, metrics_url, tightest_tbt_s
from slo_operator.reconcile import Reconciler
from slo_operator.settings import OperatorSettings
from slo_sidecar.metrics import SidecarMetrics

PROFILE = load_profile("h100-llama3-8b-tp1")
SLO = SLOTargets(RequestKind.LATENCY, ttft_s=2.0, tbt_s=0.1, priority_class="gold")


def burst(start_s: float, n: int, gap_s: float) -> list[Job]:
    return [
        Job(f"j{start_s}-{i}", start_s + i * gap_s, SLO, 800, 150, max_tokens=512, tier="gold")
        for i in range(n)
    ]


def exposition(c: PodCounters) -> str:
    """A replica's counters as its sidecar exports them: the sidecar's own metrics, rendered."""
    m = SidecarMetrics()
    for tier, n in c.met.items():
        m.slo_met.labels(tier, tier).inc(n)
    for tier, n in c.missed.items():
        m.slo_missed.labels(tier, tier).inc(n)
    m.rejects.labels("-", "-", "deadline").inc(c.rejected)
    m.prompt_tokens.labels("gold", "gold").inc(c.prompt_tokens)
    m.output_tokens.labels("gold", "gold").inc(c.output_tokens)
    m.outstanding_tokens.set(c.outstanding_tokens)
    m.program_requests.set(c.program_requests)
    m.engine_waiting.set(c.waiting)
    return generate_latest(m.registry).decode()


def ready_pod(name: str, ip: str) -> dict[str, Any]:
    sidecar = {"name": "sidecar", "ports": [{"name": "metrics", "containerPort": 9090}]}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [sidecar]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


class RecordingLoop(ScalingLoop):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[ScaleStep | None] = []

    def step(self, *args: Any, **kw: Any) -> ScaleStep | None:
        out = super().step(*args, **kw)
        self.steps.append(out)
        return out


def test_one_counter_stream_gives_operator_and_simulator_the_same_signals_and_decisions() -> None:
    """A simulated burst and trickle: every period, the ready replicas' counters are rendered as sidecar
    /metrics and scraped by the operator's loop against an in-memory API; it measures the same signals
    and takes the same decisions as the simulator's autoscaler, period by period."""
    md = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    md["metadata"]["uid"] = "u"
    capacity = capacity_tokens_per_s(PROFILE, tbt_s=0.1)
    md["spec"]["autoscaling"] = {
        "capacityTokensPerS": capacity,
        "downWindowS": 30,
        "tierTargets": {"gold": 0.95},
        "minSamples": 5,
    }
    spec = AutoscalingSpec.model_validate(md["spec"]["autoscaling"])
    scaler = Autoscaler(
        params=spec.params(1, 4),
        startup_s=startup_time_s(PROFILE),
        capacity_tokens_per_s=capacity,
        tier_targets=spec.tier_targets,
        default_target=spec.attainment_target,
        period_s=10.0,
    )
    fleet = FleetSim(
        [ReplicaSpec(PROFILE)] * 4, "sarathi", "min-load", config=SimConfig(drain="all"), autoscaler=scaler
    )
    bronze = SLOTargets(RequestKind.LATENCY, ttft_s=0.5, tbt_s=0.05, priority_class="bronze")
    tight = [
        Job(f"b{i}", 20.0 + i * 0.5, bronze, 3000, 100, max_tokens=512, tier="bronze") for i in range(60)
    ]
    fleet.run(burst(0.0, 3000, 0.02) + burst(100.0, 60, 5.0) + tight)
    steps = [e.step for e in scaler.timeline]
    desired = [e.desired for e in scaler.timeline]
    assert max(desired) > 1 and desired[-1] < max(desired)  # it scaled up and back down: a real test
    tiers = {t.tier for s in steps if s is not None for t in s.signals.tiers}
    assert tiers == {"gold", "bronze"}
    assert any(t.met < t.finished for s in steps if s is not None for t in s.signals.tiers)

    api = LoopApi(md, 1, [])
    now = [0.0]
    texts: dict[str, str] = {}
    loop = RecordingLoop()
    operator = OperatorAutoscaler(
        Reconciler(api, OperatorSettings(priority=1)),  # type: ignore[arg-type]
        fetch=lambda url, _t: texts[url],
        clock=lambda: now[0],
    )
    operator._memory[("llm", "llama-8b")] = Memory(loop=loop)
    try:
        for event in scaler.timeline:
            now[0] = event.t_s
            api.replicas = (
                event.step.signals.ready + event.step.signals.starting if event.step else event.desired
            )
            api.pods, texts = [], {}
            for k, (name, counters) in enumerate(sorted(event.samples.items())):
                api.pods.append(ready_pod(name, f"10.0.0.{k}"))
                texts[f"http://10.0.0.{k}:9090/metrics"] = exposition(counters)
            status = operator.tick("llm", "llama-8b")
            assert status is not None and status["desiredReplicas"] == event.desired
        assert loop.steps == steps
    finally:
        operator.close()


def scrape(m: SidecarMetrics, t_s: float) -> PodCounters:
    return fleetmetrics.parse(generate_latest(m.registry).decode(), t_s)


def test_signals_come_from_the_sidecar_counters_over_the_period() -> None:
    a, b = SidecarMetrics(), SidecarMetrics()
    a.slo_result("gold", "gold", True)
    before = {"a": scrape(a, 0.0), "b": scrape(b, 0.0)}
    for _ in range(8):
        a.slo_result("gold", "gold", True)
    for _ in range(2):
        a.slo_result("gold", "gold", False)
    b.slo_result("bronze", "bronze", False)
    b.rejects.labels("bronze", "bronze", "queue_full").inc(3)
    a.prompt_tokens.labels("gold", "gold").inc(4000)
    a.output_tokens.labels("gold", "gold").inc(1000)
    b.prompt_tokens.labels("bronze", "bronze").inc(500)
    a.outstanding_tokens.set(1200)
    b.outstanding_tokens.set(300)
    b.program_requests.set(2)
    a.engine_waiting.set(5)
    now = {"a": scrape(a, 10.0), "b": scrape(b, 10.0), "new": scrape(SidecarMetrics(), 10.0)}
    s = window(
        before,
        now,
        ready=3,
        starting=1,
        capacity_tokens_per_s=900.0,
        target=lambda t: {"gold": 0.95}.get(t, 0.9),
    )
    tiers = {t.tier: (t.finished, t.met, t.target) for t in s.tiers}
    assert tiers == {"gold": (10, 8, 0.95), "bronze": (1, 0, 0.9)}
    assert s.rejected == 3 and s.demand_tokens_per_s == pytest.approx((4000 + 1000 + 500) / 10)
    assert (s.admitted_tokens, s.protected, s.queue_len) == (1500, 1, 5)
    assert (s.ready, s.starting, s.capacity_tokens_per_s) == (3, 1, 900.0)


def test_a_restarted_sidecar_counts_from_zero() -> None:
    m = SidecarMetrics()
    for _ in range(50):
        m.slo_result("gold", "gold", True)
    before = {"p": scrape(m, 0.0)}
    fresh = SidecarMetrics()
    for _ in range(4):
        fresh.slo_result("gold", "gold", False)
    s = window(
        before,
        {"p": scrape(fresh, 5.0)},
        ready=1,
        starting=0,
        capacity_tokens_per_s=1.0,
        target=lambda _: 0.9,
    )
    assert [(t.finished, t.met) for t in s.tiers] == [(4, 0)]


def test_a_response_without_sidecar_metrics_is_refused() -> None:
    with pytest.raises(ValueError, match="no slofleet_sidecar_"):
        fleetmetrics.parse("# HELP up x\n# TYPE up gauge\nup 1\n", 0.0)


def test_deletion_cost_orders_idle_before_busy_before_program_holders() -> None:
    idle = PodCounters(0.0)
    busy = PodCounters(0.0, outstanding_tokens=5000)
    program = PodCounters(0.0, outstanding_tokens=1, program_requests=1)
    costs = [deletion_cost(x) for x in (None, idle, busy, program)]
    assert costs == [0, 0, 5000, 1_000_000_001]
    assert (
        deletion_cost(PodCounters(0.0, outstanding_tokens=1e12, program_requests=1))
        == 2_000_000_000  # both parts capped: within int32, programs still above any load
    )


def test_the_metrics_port_is_the_sidecars_named_port() -> None:
    def pod(ports: list[dict], ip: str | None = "10.0.0.7") -> dict:
        return {
            "spec": {
                "containers": [
                    {"name": "vllm", "ports": [{"name": "http", "containerPort": 1}]},
                    {"name": "sidecar", "ports": ports},
                ]
            },
            "status": {"podIP": ip},
        }

    http = {"name": "http", "containerPort": 8000}
    assert metrics_url(pod([http])) == "http://10.0.0.7:8000/metrics"
    assert (
        metrics_url(pod([http, {"name": "metrics", "containerPort": 9090}])) == "http://10.0.0.7:9090/metrics"
    )
    assert metrics_url(pod([http], ip="fd00::1")) == "http://[fd00::1]:8000/metrics"
    assert metrics_url(pod([http], ip=None)) is None


def test_parameters_and_capacity_come_from_the_spec_and_policy() -> None:
    spec = AutoscalingSpec.model_validate(
        {"metric": "queue", "downWindowS": 60, "maxStepDown": 2, "tierTargets": {"gold": 0.99}}
    )
    p = spec.params(2, 6)
    assert (p.min_replicas, p.max_replicas, p.metric, p.down_window_s, p.max_step_down) == (
        2,
        6,
        "queue",
        60.0,
        2,
    )
    assert (spec.target("gold"), spec.target("other")) == (0.99, 0.9)
    policy = {
        "spec": {
            "tiers": [
                {"kind": "latency", "tbtS": 0.2},
                {"kind": "latency", "tbtS": 0.05},
                {"kind": "deadline"},
            ]
        }
    }
    assert tightest_tbt_s(policy) == 0.05 and tightest_tbt_s(None) == 0.1


class LoopApi:
    """Just what one scaling tick reads and writes, in memory: the ModelDeployment, its Deployment and
    pods, no HPA; scale writes and status patches are recorded."""

    def __init__(self, md: dict, replicas: int, pods: list[dict]) -> None:
        self.md, self.replicas, self.pods = md, replicas, pods
        self.scaled: list[int] = []
        self.field_manager = "test"

    def get(self, _v: str, plural: str, _ns: str, _name: str) -> dict | None:
        if plural == "modeldeployments":
            return self.md
        if plural == "deployments":
            return {"metadata": {"name": "llama-8b", "namespace": "llm"}, "spec": {"replicas": self.replicas}}
        return None  # the policy: default TBT

    def request(self, method: str, path: str, body: object = None, *_: object, **__: object) -> dict:
        if method == "PATCH" and path.endswith("/scale"):
            self.replicas = body["spec"]["replicas"]  # type: ignore[index]
            self.scaled.append(self.replicas)
            return {}
        if method == "PATCH" or method == "POST":  # pod-deletion-cost, Events
            return {}
        return {"items": self.pods if path.endswith("/pods") else []}

    def patch_status(self, _v: str, _p: str, _ns: str, _name: str, status: dict) -> dict:
        self.md.setdefault("status", {}).setdefault("autoscaling", {}).update(status["autoscaling"])
        return self.md


def test_a_fresh_operator_waits_a_full_down_window_before_removing_a_replica() -> None:
    md = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    md["metadata"]["uid"] = "u"
    md["spec"]["autoscaling"] = {"capacityTokensPerS": 1000, "downWindowS": 60}
    pods = [
        {
            "metadata": {"name": f"e-{i}"},
            "spec": {"containers": [{"name": "sidecar", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for i in range(3)
    ]
    api = LoopApi(md, 3, pods)
    idle = generate_latest(SidecarMetrics().registry).decode()  # no load at all: one replica would do
    now = [0.0]
    scaler = OperatorAutoscaler(
        Reconciler(api, OperatorSettings(priority=1)),  # type: ignore[arg-type]
        fetch=lambda _url, _t: idle,
        clock=lambda: now[0],
    )
    try:
        assert scaler.tick("llm", "llama-8b")["reason"] == "measuring"  # type: ignore[index]
        for t in (15.0, 30.0, 45.0):
            now[0] = t
            status = scaler.tick("llm", "llama-8b")
            assert status is not None and status["recommendation"] == 0 and status["desiredReplicas"] == 3
        assert api.scaled == []
        now[0] = 61.0  # the window holds only the idle recommendations now: one step down
        assert scaler.tick("llm", "llama-8b")["desiredReplicas"] == 2  # type: ignore[index]
        assert api.scaled == [2]
    finally:
        scaler.close()
