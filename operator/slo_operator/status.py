"""The status a ModelDeployment reports: phase, replica counts, conditions and endpoints. Pure.

Computed from what the operator observed (the policy's state, the engine Deployment's status) and the
previous status, whose ``lastTransitionTime`` stamps are kept while a condition's status does not change,
so recomputing an unchanged situation yields an identical status (and no write).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slo_operator.model import ModelDeploymentView
from slo_operator.settings import OperatorSettings


@dataclass(frozen=True)
class Blocker:
    """Whether anything stops the operator from converging (a missing or invalid policy, a child the API
    server refused): ``ok``, or why not as a condition reason and a message saying what to change."""

    ok: bool
    reason: str = "PolicyValid"
    message: str = ""


@dataclass(frozen=True)
class Observation:
    phase: str
    conditions: list[tuple[str, str, str, str]]  # (type, status, reason, message)
    replicas: int
    ready_replicas: int
    updated_replicas: int


def _deployment_progress(
    md: ModelDeploymentView, dep: dict[str, Any] | None
) -> tuple[int, int, int, bool, str]:
    """(replicas, ready, updated, rolled out, stall message) of the engine Deployment."""
    if dep is None:
        return md.replicas, 0, 0, False, ""
    st = dep.get("status") or {}
    want = int((dep.get("spec") or {}).get("replicas", md.replicas))
    ready = int(st.get("readyReplicas") or 0)
    updated = int(st.get("updatedReplicas") or 0)
    current = int(st.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation") or 1)
    stall = ""
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            stall = cond.get("message") or "the rollout exceeded its progress deadline"
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            stall = cond.get("message") or "pods could not be created"
    rolled_out = current and ready >= want and updated >= want
    return want, ready, updated, rolled_out, stall


def observe(md: ModelDeploymentView, blocker: Blocker, dep: dict[str, Any] | None) -> Observation:
    """Phase and conditions (type, status, reason, message) for what was observed."""
    want, ready, updated, rolled_out, stall = _deployment_progress(md, dep)
    counts = f"{ready}/{want} replicas ready"
    if not blocker.ok:
        degraded = ("Degraded", "True", blocker.reason, blocker.message)
    elif stall:
        degraded = ("Degraded", "True", "RolloutStalled", stall)
    else:
        degraded = ("Degraded", "False", "AsExpected", "")
    if rolled_out:
        ready_c = ("Ready", "True", "ReplicasReady", counts)
        progressing = ("Progressing", "False", "RolloutComplete", counts)
    else:
        why = "PolicyUnavailable" if dep is None and not blocker.ok else "ReplicasNotReady"
        ready_c = ("Ready", "False", why, counts)
        rolling = dep is not None and not stall
        progressing = (
            ("Progressing", "True", "RollingOut", f"{counts}; waiting for the engine pods")
            if rolling
            else ("Progressing", "False", "NotProgressing", counts)
        )
    if degraded[1] == "True":
        phase = "Degraded"
    elif rolled_out:
        phase = "Ready"
    elif dep is None:
        phase = "Pending"
    else:
        phase = "Progressing"
    return Observation(phase, [ready_c, progressing, degraded], want, ready, updated)


def _pod_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def endpoints(pods: list[dict[str, Any]], settings: OperatorSettings) -> list[dict[str, Any]]:
    """The engine pods that have an address: the sidecar's host:port and whether the pod is ready."""
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        ip = (pod.get("status") or {}).get("podIP")
        if ip and not pod["metadata"].get("deletionTimestamp"):
            address = f"{ip}:{settings.sidecar_http_port}"
            out.append({"pod": pod["metadata"]["name"], "address": address, "ready": _pod_ready(pod)})
    return out


def conditions(
    observed: list[tuple[str, str, str, str]], previous: dict[str, Any] | None, generation: int, now: str
) -> list[dict[str, Any]]:
    """Condition objects, keeping a condition's ``lastTransitionTime`` while its status does not change."""
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    out = []
    for ctype, cstatus, reason, message in observed:
        old = before.get(ctype) or {}
        stamp = old.get("lastTransitionTime") if old.get("status") == cstatus else None
        out.append(
            {
                "type": ctype,
                "status": cstatus,
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp or now,
                "observedGeneration": generation,
            }
        )
    return out


def same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether writing ``new`` would change nothing (fields absent from ``new`` are not compared)."""
    return all(old.get(key) == value for key, value in new.items())


def status(
    md: ModelDeploymentView,
    obs: Observation,
    settings: OperatorSettings,
    previous: dict[str, Any] | None,
    now: str,
    *,
    pods: list[dict[str, Any]] | None = None,
    config_map: str | None = None,
) -> dict[str, Any]:
    """The full status object of a ModelDeployment."""
    return {
        "phase": obs.phase,
        "observedGeneration": md.generation,
        "replicas": obs.replicas,
        "readyReplicas": obs.ready_replicas,
        "updatedReplicas": obs.updated_replicas,
        "endpoints": endpoints(pods or [], settings),
        "conditions": conditions(obs.conditions, previous, md.generation, now),
        "policyConfigMap": config_map,
        "profile": md.profile or f"none: {md.profile_reason}"[:1024],
    }
