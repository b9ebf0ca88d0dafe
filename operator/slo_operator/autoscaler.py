"""The operator's goodput-aware scaling loop: one tick per ModelDeployment per period.

Its own asyncio task beside kopf, not a kopf timer: kopf puts a finalizer on every object with a timer,
so deleting a ModelDeployment would hang while the operator is down. Under peering it acts only while
no live peer has a higher priority (kopf's rule for pausing), read from the peering object.

A tick scrapes the ready engine pods' sidecar ``/metrics`` (:mod:`slo_operator.fleetmetrics`) and steps
the ModelDeployment's :class:`slo_core.scaling.ScalingLoop` — the signal window and decision the
simulator's autoscaler steps on the counters its replicas keep — for the replica count, and writes it
through the Deployment's ``scale`` subresource, within ``replicas.min``/``replicas.max``. Before a
scale-down it sets ``controller.kubernetes.io/pod-deletion-cost`` on the ready pods
(:func:`slo_core.scaling.deletion_cost` of their scrape), so the ReplicaSet removes the least-loaded
pod and keeps pods holding calls of in-flight programs.

It never fights another autoscaler: while a HorizontalPodAutoscaler (KEDA's included) targets the engine
Deployment it only reports ``External``. Stabilization is the HPA's (scale up to the lowest
recommendation of the up window, down to the highest of the down window) with step limits; a freshly
started operator remembers nothing, so it first waits a full down window before removing a replica.
Every decision is reported in ``status.autoscaling``, every replica change as an Event, and both as
``slofleet_operator_autoscale_*`` metrics.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from slo_core.crd.deployment import ModelDeploymentSpec
from slo_core.perf.profiles import load_profile
from slo_core.scaling import (
    FleetSignals,
    PodCounters,
    ScaleDecision,
    ScalingLoop,
    ScalingParams,
    deletion_cost,
)
from slo_core.sim.autoscale import capacity_tokens_per_s
from slo_operator import fleetmetrics
from slo_operator.kubeapi import ApiError, path
from slo_operator.model import MD_PLURAL, POLICY_PLURAL, view
from slo_operator.reconcile import GROUP_VERSION, Reconciler, utc_now

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SCRAPE_TIMEOUT_S = 2.0
SCRAPE_WORKERS = 16
DEFAULT_TBT_S = 0.1  # the capacity's TBT when the policy has no latency tier
Fetch = Callable[[str, float], str]


class HttpFetch:
    """GET a pod's metrics endpoint with a timeout on connect and read; connections pooled until close."""

    def __init__(self) -> None:
        self._pool = urllib3.PoolManager(num_pools=64, maxsize=1, retries=False)

    def __call__(self, url: str, timeout_s: float) -> str:
        resp = self._pool.request("GET", url, timeout=urllib3.Timeout(timeout_s))
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        return resp.data.decode("utf-8", errors="replace")

    def close(self) -> None:
        self._pool.clear()


class ScaleMetrics:
    """The loop's decisions as Prometheus metrics (served on the operator's --metrics-port)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, p, labels = self.registry, "slofleet_operator_autoscale_", ("namespace", "model_deployment")
        self.desired = Gauge(
            p + "desired_replicas", "replicas the last decision asked for", labels, registry=r
        )
        self.recommendation = Gauge(
            p + "recommended_replicas",
            "replicas the signals asked for before stabilization",
            labels,
            registry=r,
        )
        self.demand = Gauge(p + "demand_tokens_per_second", "work arriving (tokens/s)", labels, registry=r)
        self.changes = Counter(
            p + "changes_total", "replica changes written, by direction", [*labels, "direction"], registry=r
        )
        self.failures = Counter(
            p + "scrape_failures_total", "pod /metrics scrapes that failed", labels, registry=r
        )


@dataclass
class Memory:
    """What the loop keeps per ModelDeployment between ticks (lost on restart: see the module docstring)."""

    loop: ScalingLoop = field(default_factory=ScalingLoop)
    last_scale_time: str | None = None


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def metrics_url(pod: dict[str, Any]) -> str | None:
    """The sidecar's /metrics: its container port named ``metrics`` if it has one, else ``http``."""
    ip = (pod.get("status") or {}).get("podIP")
    ports: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == "sidecar":
            ports = {p.get("name"): int(p["containerPort"]) for p in c.get("ports") or [] if p.get("name")}
    port = ports.get("metrics") or ports.get("http")
    if not ip or not port:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"


def tightest_tbt_s(policy: dict[str, Any] | None) -> float:
    tbts = [
        float(t["tbtS"])
        for t in ((policy or {}).get("spec") or {}).get("tiers") or []
        if t.get("kind") == "latency" and t.get("tbtS")
    ]
    return min(tbts, default=DEFAULT_TBT_S)


class Autoscaler:
    """Ticks of the scaling loop, one ModelDeployment at a time (see the module docstring)."""

    def __init__(
        self,
        reconciler: Reconciler,
        *,
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = utc_now,
        metrics: ScaleMetrics | None = None,
    ) -> None:
        self.reconciler, self.api = reconciler, reconciler.api
        self._http = HttpFetch() if fetch is None else None
        self.fetch: Fetch = fetch or self._http  # type: ignore[assignment]
        self.clock, self.wall = clock, wall
        self.metrics = metrics or ScaleMetrics()
        self._memory: dict[tuple[str, str], Memory] = {}
        self._guard = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(SCRAPE_WORKERS, thread_name_prefix="scrape")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close()

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._memory.pop((namespace, name), None)

    def _mem(self, namespace: str, name: str) -> Memory:
        with self._guard:
            return self._memory.setdefault((namespace, name), Memory())

    # ------------------------------------------------------------------------------------- the loop

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ModelDeployment each period until ``stop`` is set (a tick in flight completes)."""
        period = self.reconciler.settings.scale_period_s
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self.active):
                    await asyncio.to_thread(self.pass_once)
            except ApiError as err:
                log.warning("scaling loop: %s", err)
            except Exception:  # a bug must not end the loop for every ModelDeployment
                log.exception("scaling loop: unexpected error")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    def active(self) -> bool:
        """Standalone: always. Under peering: unless a live peer has a higher priority (as kopf pauses)."""
        settings = self.reconciler.settings
        if settings.peering is None:
            return True
        if settings.namespaces:
            where = path("kopf.dev/v1", "kopfpeerings", settings.namespaces[0], settings.peering)
        else:
            where = path("kopf.dev/v1", "clusterkopfpeerings", None, settings.peering)
        try:
            peers = (self.api.request("GET", where).get("status") or {}).values()
        except ApiError:
            return False  # cannot tell: leave the replicas alone
        now = datetime.datetime.now(tz=datetime.UTC)
        for peer in peers:
            try:
                seen = datetime.datetime.fromisoformat(str(peer["lastseen"]))
                alive = seen + datetime.timedelta(seconds=int(peer.get("lifetime", 60))) > now
                if alive and int(peer.get("priority", 0)) > settings.priority:
                    return False
            except (KeyError, TypeError, ValueError):
                continue
        return True

    def pass_once(self) -> None:
        """One tick for every ModelDeployment the operator watches."""
        scopes = self.reconciler.settings.namespaces or (None,)
        for ns in scopes:
            items = self.api.request("GET", path(GROUP_VERSION, MD_PLURAL, ns)).get("items") or []
            for body in items:
                meta = body["metadata"]
                try:
                    self.tick_body(body)
                except ApiError as err:
                    log.warning("autoscaling %s/%s: %s", meta.get("namespace"), meta.get("name"), err)

    # ------------------------------------------------------------------------------------- a tick

    def tick(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One period of one ModelDeployment; returns the status.autoscaling it reported (None: gone)."""
        body = self.api.get(GROUP_VERSION, MD_PLURAL, namespace, name)
        if body is None:
            self.forget(namespace, name)
            return None
        return self.tick_body(body)

    def tick_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """:meth:`tick` on a ModelDeployment as just read."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if body["metadata"].get("deletionTimestamp"):
            self.forget(namespace, name)
            return None
        try:
            spec = ModelDeploymentSpec.model_validate(body.get("spec") or {})
            md = view(body)
        except (ValidationError, ValueError):
            return None  # the reconciler reports an invalid spec
        lo, hi = spec.replicas.min, spec.replicas.max
        if lo == hi:
            self.forget(namespace, name)
            return self._report(
                body, {"mode": "Fixed", "desiredReplicas": lo, "reason": "replicas.min == max"}
            )
        if self.reconciler._autoscaled(md):
            self.forget(namespace, name)
            why = "a HorizontalPodAutoscaler targets the Deployment; its replicas are the HPA's"
            return self._report(body, {"mode": "External", "reason": why})
        dep = self.api.get("apps/v1", "deployments", namespace, name)
        if dep is None:
            return None  # the reconciler creates it (at replicas.min)
        params = spec.autoscaling.params(lo, hi)
        capacity, why_not = self._capacity(spec, namespace, md.policy)
        if capacity is None and params.metric == "goodput":
            return self._report(body, {"mode": "Blocked", "reason": why_not})
        current = int((dep.get("spec") or {}).get("replicas", lo))
        pods = [p for p in self.reconciler._pods(md) if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in pods if _ready(p)]
        now = self.clock()
        samples = self._scrape(ready, now, namespace, name)
        mem = self._mem(namespace, name)
        step = mem.loop.step(
            params,
            samples,
            now_s=now,
            current=current,
            ready_pods=len(ready),
            capacity_tokens_per_s=capacity or 1.0,
            target=spec.autoscaling.target,
        )
        if step is None:  # no window yet; and it waits a full down window before removing anything
            return self._report(
                body,
                {"mode": params.metric.capitalize(), "desiredReplicas": current, "reason": "measuring"},
                mem,
            )
        signals, decision = step.signals, step.decision
        if decision.desired != current:
            self._scale(
                body=body, dep=dep, current=current, decision=decision, ready=ready, samples=samples, mem=mem
            )
        return self._report(body, self._describe(params, signals, decision), mem)

    def _capacity(self, spec: ModelDeploymentSpec, namespace: str, policy: str) -> tuple[float | None, str]:
        if spec.autoscaling.capacity_tokens_per_s is not None:
            return spec.autoscaling.capacity_tokens_per_s, ""
        name, why = spec.chosen_profile()
        if name is None:
            return None, f"no replica capacity: set autoscaling.capacityTokensPerS or spec.profile ({why})"
        body = self.api.get(GROUP_VERSION, POLICY_PLURAL, namespace, policy)
        return capacity_tokens_per_s(load_profile(name), tightest_tbt_s(body)), ""

    def _scrape(
        self, pods: list[dict[str, Any]], now: float, namespace: str, name: str
    ) -> dict[str, PodCounters]:
        urls = {p["metadata"]["name"]: metrics_url(p) for p in pods}
        jobs = {pod: self._pool.submit(self.fetch, url, SCRAPE_TIMEOUT_S) for pod, url in urls.items() if url}
        out: dict[str, PodCounters] = {}
        for pod, job in jobs.items():
            try:
                out[pod] = fleetmetrics.parse(job.result(), now)
            except Exception as exc:  # a pod that does not answer is left out of the window
                self.metrics.failures.labels(namespace, name).inc()
                log.info("%s/%s: scraping pod %s failed: %s", namespace, name, pod, exc)
        return out

    # ------------------------------------------------------------------------------------ actions

    def _scale(
        self,
        *,
        body: dict[str, Any],
        dep: dict[str, Any],
        current: int,
        decision: ScaleDecision,
        ready: list[dict[str, Any]],
        samples: dict[str, PodCounters],
        mem: Memory,
    ) -> None:
        meta = dep["metadata"]
        ns, name = meta["namespace"], meta["name"]
        down = decision.desired < current
        if down:  # the ReplicaSet removes the lowest cost first: the least-loaded pod, never a program's
            for pod in ready:
                cost = str(deletion_cost(samples.get(pod["metadata"]["name"])))
                if ((pod["metadata"].get("annotations") or {}).get(DELETION_COST)) != cost:
                    patch = {"metadata": {"annotations": {DELETION_COST: cost}}}
                    where = path("v1", "pods", ns, pod["metadata"]["name"])
                    self.api.request("PATCH", where, patch, "application/merge-patch+json")
        with self.reconciler._lock(ns, name):  # never between the reconciler's read and its apply
            fresh = self.api.get("apps/v1", "deployments", ns, name)
            if fresh is None or int((fresh.get("spec") or {}).get("replicas", -1)) != current:
                return  # changed under us: decide again next period
            where = path("apps/v1", "deployments", ns, name) + "/scale"
            self.api.request(
                "PATCH", where, {"spec": {"replicas": decision.desired}}, "application/merge-patch+json"
            )
        mem.last_scale_time = self.wall()
        direction = "down" if down else "up"
        self.metrics.changes.labels(ns, name, direction).inc()
        message = f"{current} → {decision.desired} replicas: {decision.reason}"
        self.post_event(body, "ScaledDown" if down else "ScaledUp", message[:1000])
        log.info("ModelDeployment %s/%s: %s", ns, name, message)

    def post_event(self, body: dict[str, Any], reason: str, message: str) -> None:
        """A Normal Event about the ModelDeployment, posted here (the loop runs outside kopf's handlers)."""
        meta = body["metadata"]
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion", GROUP_VERSION),
                "kind": body.get("kind", "ModelDeployment"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": "Normal",
            "source": {"component": self.reconciler.settings.field_manager},
            "reportingComponent": self.reconciler.settings.field_manager,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.request("POST", path("v1", "events", meta["namespace"]), event)
        except ApiError as err:
            log.warning("Event %s about %s/%s not posted: %s", reason, meta["namespace"], meta["name"], err)

    @staticmethod
    def _describe(params: ScalingParams, s: FleetSignals, d: ScaleDecision) -> dict[str, Any]:
        return {
            "mode": params.metric.capitalize(),
            "desiredReplicas": d.desired,
            "recommendation": d.recommendation,
            "reason": d.reason[:1024],
            "ready": s.ready,
            "starting": s.starting,
            "demandTokensPerS": round(s.demand_tokens_per_s, 1),
            "admittedTokens": round(s.admitted_tokens, 1),
            "capacityTokensPerS": round(s.capacity_tokens_per_s, 1),
            "rejected": s.rejected,
            "tiers": [
                {"tier": t.tier, "finished": t.finished, "met": t.met, "target": t.target} for t in s.tiers
            ],
        }

    def _report(self, body: dict[str, Any], new: dict[str, Any], mem: Memory | None = None) -> dict[str, Any]:
        """Write status.autoscaling when it changed; every key absent from ``new`` is removed."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if mem is not None and mem.last_scale_time:
            new["lastScaleTime"] = mem.last_scale_time
        old = (body.get("status") or {}).get("autoscaling") or {}
        if "desiredReplicas" in new:
            self.metrics.desired.labels(ns, name).set(new["desiredReplicas"])
        if "recommendation" in new:
            self.metrics.recommendation.labels(ns, name).set(new["recommendation"])
            self.metrics.demand.labels(ns, name).set(new["demandTokensPerS"])
        if old != new:
            patch = {**{k: None for k in old if k not in new}, **new}
            try:
                self.api.patch_status(GROUP_VERSION, MD_PLURAL, ns, name, {"autoscaling": patch})
            except ApiError as err:
                log.warning("ModelDeployment %s/%s: status.autoscaling not written: %s", ns, name, err)
        return new
