"""Whether each engine pod's vLLM scheduler plugin is applying its policy or has fallen back to vLLM's
stock order, reported on the ModelDeployment (condition ``PluginDegraded`` and an Event).

How the operator learns it: it reads ``slofleet_plugin_degraded`` from the plugin's metrics port (the
container port named ``plugin-metrics`` of each pod, which the chart's NetworkPolicy opens to the
operator and to Prometheus), every ``check_s``. Pods never write to the API server (they have no token
at all), so nothing in a pod can change a ModelDeployment. A pod whose port does not answer (starting,
or gone) is not counted either way.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from slo_core.wire.k8s import API_GROUP, API_VERSION
from slo_operator.kubeapi import ApiError, KubeApi, path
from slo_operator.model import MD_PLURAL, view
from slo_operator.reconcile import Reconciler, safe

log = logging.getLogger(__name__)

PORT_NAME = "plugin-metrics"
GAUGE = "slofleet_plugin_degraded"
Condition = tuple[str, str, str, str]


def degraded_in(metrics_text: str) -> bool | None:
    """The gauge's value in a Prometheus exposition (None: not there)."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == GAUGE:
            return any(s.value >= 1 for s in family.samples)
    return None


def plugin_url(pod: dict[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or pod["metadata"].get("deletionTimestamp"):
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == PORT_NAME:
                return f"http://{ip}:{port['containerPort']}/metrics"
    return None


def scrape(url: str, timeout_s: float = 2.0) -> bool | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http to a pod IP
            return degraded_in(resp.read(1 << 20).decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError):
        return None


@dataclass(frozen=True)
class Health:
    """Pods whose plugin reported degraded, and how many reported at all."""

    degraded: tuple[str, ...]
    reporting: int

    def condition(self) -> Condition:
        if self.degraded:
            names = ", ".join(self.degraded)
            return (
                "PluginDegraded",
                "True",
                "StockOrder",
                f"the vLLM scheduler plugin of {len(self.degraded)}/{self.reporting} pods ({names}) fell "
                "back to vLLM's stock order (SLO scheduling off there); the vLLM container's log says why",
            )
        return ("PluginDegraded", "False", "AsExpected", f"{self.reporting} pods' plugins apply the policy")


def post_event(api: KubeApi, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A core/v1 Event about a ModelDeployment, posted directly (this job runs outside kopf's handlers,
    whose event poster needs their context)."""
    meta = body["metadata"]
    now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1000],
        "source": {"component": "slofleet-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    api.request("POST", path("v1", "events", meta["namespace"]), event)


class PluginHealth:
    """The last health seen per ModelDeployment; :meth:`condition` is what status writes include."""

    def __init__(self, scrape_fn: Callable[[str], bool | None] = scrape) -> None:
        self.scrape = scrape_fn
        self.seen: dict[tuple[str, str], Health] = {}

    def condition(self, namespace: str, name: str) -> Condition | None:
        health = self.seen.get((namespace, name))
        return health.condition() if health is not None else None

    def observe(self, pods: list[dict[str, Any]]) -> Health | None:
        results = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            url = plugin_url(pod)
            if url is not None and (value := self.scrape(url)) is not None:
                results.append((pod["metadata"]["name"], value))
        if not results:
            return None
        return Health(tuple(name for name, bad in results if bad), len(results))

    def check(self, reconciler: Reconciler) -> None:
        """One pass over every ModelDeployment in scope: a changed health rewrites status, with an Event."""
        api, settings = reconciler.api, reconciler.settings
        group = f"{API_GROUP}/{API_VERSION}"
        scopes = settings.namespaces or (None,)
        for ns in scopes:
            for body in api.request("GET", path(group, MD_PLURAL, ns)).get("items") or []:
                try:
                    md = view(body)
                except ValueError:
                    continue
                health = self.observe(reconciler._pods(md))
                key = (md.namespace, md.name)
                before = self.seen.get(key)
                if health is None or health == before:
                    continue
                self.seen[key] = health
                was_bad = bool(before and before.degraded)
                if bool(health.degraded) != was_bad:
                    message = health.condition()[3]
                    if health.degraded:
                        log.warning("ModelDeployment %s/%s: %s", md.namespace, md.name, message)
                        post_event(api, body, "Warning", "PluginDegraded", message)
                    elif before is not None:
                        post_event(api, body, "Normal", "PluginRecovered", message)
                where = f"ModelDeployment {md.namespace}/{md.name}"
                safe(functools.partial(reconciler.converge, md.namespace, md.name, apply=False), where)


async def watch_plugins_forever(health: PluginHealth, reconciler: Reconciler, check_s: float) -> None:
    """The operator's background job: a pass every ``check_s``; an API error is retried next time."""
    while True:
        try:
            await asyncio.to_thread(health.check, reconciler)
        except ApiError as err:
            log.warning("plugin health: %s (retrying in %.0f s)", err, check_s)
        except Exception:  # a background job never dies silently: say why, try again next time
            log.exception("plugin health failed (retrying in %.0f s)", check_s)
        await asyncio.sleep(check_s)
