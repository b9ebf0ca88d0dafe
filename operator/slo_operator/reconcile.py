"""Converge one ModelDeployment: read it and its policy, apply its children, write its status.

Every path (the ModelDeployment changed, its policy changed, its Deployment changed) calls
:meth:`Reconciler.converge`, which reads the current state fresh, so it is idempotent and safe to repeat:
re-applying unchanged children and re-writing an unchanged status change nothing on the server.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from slo_core.crd.compat import mismatch_message, missing_tiers
from slo_core.wire.k8s import API_GROUP, API_VERSION
from slo_operator import render, status
from slo_operator.kubeapi import PLURALS, ApiError, KubeApi, NotOwned
from slo_operator.model import MD_PLURAL, POLICY_PLURAL, ModelDeploymentView, view
from slo_operator.policy import PolicyInvalid, policy_config
from slo_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
HF_TOKEN_LABEL = "slofleet.io/hf-token"  # noqa: S105 - a label name, not a credential
ENGINE_SA_LABEL = "slofleet.io/engine-service-account"
# (object body, event type Normal/Warning, reason, message)
EventFn = Callable[[dict[str, Any], str, str, str], None]


def utc_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _no_events(_body: dict[str, Any], _type: str, _reason: str, _message: str) -> None:
    return None


class Reconciler:
    """Converges ModelDeployments and reports SLOPolicy validity; one lock per object."""

    def __init__(
        self,
        api: KubeApi,
        settings: OperatorSettings,
        events: EventFn = _no_events,
        clock: Callable[[], str] = utc_now,
    ) -> None:
        self.api, self.settings, self.events, self.clock = api, settings, events, clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        # (namespace, name) -> a condition observed outside converge (the plugins' health), or None
        self.extra_condition: Callable[[str, str], tuple[str, str, str, str] | None] = lambda _ns, _n: None

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    # ------------------------------------------------------------------------------------ policy

    def policy_state(self, namespace: str, name: str) -> tuple[status.Blocker, render.PolicyConfig | None]:
        body = self.api.get(GROUP_VERSION, POLICY_PLURAL, namespace, name)
        if body is None:
            message = (
                f'SLOPolicy "{name}" not found in namespace "{namespace}": create it, or set spec.policyRef '
                "to an existing SLOPolicy"
            )
            return status.Blocker(False, "PolicyNotFound", message), None
        if body["metadata"].get("deletionTimestamp"):
            return status.Blocker(False, "PolicyNotFound", f'SLOPolicy "{name}" is being deleted'), None
        try:
            config = policy_config(body)
        except PolicyInvalid as exc:
            return status.Blocker(False, "PolicyInvalid", f'SLOPolicy "{name}" is invalid: {exc}'), None
        return status.Blocker(True), config

    def report_policy(self, body: dict[str, Any], deployments: int) -> None:
        """Write an SLOPolicy's own status: Ready, or Invalid with every problem in the Degraded condition."""
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return
        try:
            policy_config(body)
            problem = ""
        except PolicyInvalid as exc:
            problem = str(exc)
        generation = int(meta.get("generation") or 1)
        conds = [
            ("Ready", "False", "PolicyInvalid", problem) if problem else ("Ready", "True", "PolicyValid", ""),
            ("Degraded", "True", "PolicyInvalid", problem)
            if problem
            else ("Degraded", "False", "AsExpected", ""),
        ]
        old = body.get("status") or {}
        new = {
            "observedGeneration": generation,
            "phase": "Invalid" if problem else "Ready",
            "conditions": status.conditions(conds, old, generation, self.clock()),
            "deployments": deployments,
        }
        if status.same(old, new):
            return
        self.api.patch_status(GROUP_VERSION, POLICY_PLURAL, meta["namespace"], meta["name"], new)
        if old.get("phase") != new["phase"]:
            if problem:
                self.events(body, "Warning", "PolicyInvalid", problem[:1000])
            else:
                self.events(
                    body, "Normal", "PolicyValid", "the policy is valid and rendered for its deployments"
                )

    def secret_state(self, md: ModelDeploymentView) -> status.Blocker:
        """Whether the Hugging Face token Secret may be mounted: it must carry the label
        ``slofleet.io/hf-token: "true"``, so creating a ModelDeployment does not give access to every
        Secret of the namespace. Only the labels are read; the value never leaves the API server here."""
        name = md.source.hf_token_secret
        if not name:
            return status.Blocker(True)
        body = self.api.get("v1", "secrets", md.namespace, name)
        labels = ((body or {}).get("metadata") or {}).get("labels") or {}
        if body is not None and labels.get(HF_TOKEN_LABEL) == "true":
            return status.Blocker(True)
        why = "does not exist" if body is None else f'is not labelled {HF_TOKEN_LABEL}="true"'
        return status.Blocker(
            False,
            "SecretNotAllowed",
            f'hfTokenSecret "{name}" {why}: only Secrets labelled for it are mounted into engine pods '
            f"(kubectl -n {md.namespace} label secret {name} {HF_TOKEN_LABEL}=true)",
        )

    def service_account_state(self, md: ModelDeploymentView) -> status.Blocker:
        """Whether the engine pods may run as spec.pod.serviceAccountName: the ServiceAccount must carry
        ``slofleet.io/engine-service-account: "true"``, so a ModelDeployment cannot borrow any identity of
        the namespace (a cloud workload identity, a token) through the operator's rights."""
        name = md.pod_settings.service_account_name
        if not name:
            return status.Blocker(True)
        body = self.api.get("v1", "serviceaccounts", md.namespace, name)
        labels = ((body or {}).get("metadata") or {}).get("labels") or {}
        if body is not None and labels.get(ENGINE_SA_LABEL) == "true":
            return status.Blocker(True)
        why = "does not exist" if body is None else f'is not labelled {ENGINE_SA_LABEL}="true"'
        return status.Blocker(
            False,
            "ServiceAccountNotAllowed",
            f'serviceAccountName "{name}" {why}: engine pods run only as ServiceAccounts labelled for it '
            f"(kubectl -n {md.namespace} label serviceaccount {name} {ENGINE_SA_LABEL}=true)",
        )

    def router_compat(self, md: ModelDeploymentView, md_policy: dict[str, Any] | None) -> status.Blocker:
        """Whether the router in front forwards only tiers this ModelDeployment's policy knows."""
        router, ns = self.settings.router_policy, self.settings.router_namespace
        if not router or md_policy is None or (ns and ns != md.namespace) or router == md.policy:
            return status.Blocker(True)
        body = self.api.get(GROUP_VERSION, POLICY_PLURAL, md.namespace, router)
        if body is None:  # the router is not ready without its policy: nothing reaches the pods yet
            return status.Blocker(True)
        missing = missing_tiers(body.get("spec") or {}, md_policy.get("spec") or {})
        if not missing:
            return status.Blocker(True)
        return status.Blocker(False, "RouterTierMismatch", mismatch_message(router, md.policy, missing))

    # -------------------------------------------------------------------------------- deployment

    def converge(self, namespace: str, name: str, apply: bool = True) -> str | None:
        """Bring one ModelDeployment's children and status up to date; returns its phase (None: gone)."""
        with self._lock(namespace, name):
            body = self.api.get(GROUP_VERSION, MD_PLURAL, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            try:
                md = view(body)
            except ValueError as exc:
                return self._write_invalid_spec(body, str(exc))
            blocker, config = self.policy_state(namespace, md.policy)
            if config is not None:
                secret = self.secret_state(md)
                secret = secret if not secret.ok else self.service_account_state(md)
                if not secret.ok:  # nothing mounts a Secret not labelled for it; existing pods stay
                    blocker, config = secret, None
            compat = status.Blocker(True)
            if config is not None:  # the children are fine; requests of some tiers would fail
                md_policy = self.api.get(GROUP_VERSION, POLICY_PLURAL, namespace, md.policy)
                compat = self.router_compat(md, md_policy)
            if config is not None and apply:
                try:
                    dep = self._apply_children(md, config)
                except ApiError as err:  # say why in status, then let kopf retry
                    refused = (
                        status.Blocker(False, "NotOwned", err.message)
                        if isinstance(err, NotOwned)
                        else status.Blocker(False, "ApplyFailed", f"the API server refused {err.message}")
                    )
                    dep = self.api.get("apps/v1", "deployments", namespace, name)
                    self._write_status(body, md, refused, dep, self._pods(md) if dep is not None else [])
                    raise
            else:  # without a usable policy the existing pods keep their last good configuration
                dep = self.api.get("apps/v1", "deployments", namespace, name)
            pods = self._pods(md) if dep is not None else []
            return self._write_status(body, md, blocker if not blocker.ok else compat, dep, pods)

    def _apply_children(self, md: ModelDeploymentView, config: render.PolicyConfig) -> dict[str, Any] | None:
        """Server-side apply every child; returns the Deployment as stored (with its status)."""
        dep = None
        autoscaled = self._autoscaled(md)
        replicas = None if autoscaled else self._scaled_replicas(md)
        for obj in render.children(md, config, self.settings, autoscaled=autoscaled, replicas=replicas):
            meta = obj["metadata"]
            existing = self.api.get(obj["apiVersion"], PLURALS[obj["kind"]], md.namespace, meta["name"])
            if existing is not None and not render.owned_by(existing, md):
                raise NotOwned(
                    f'{obj["kind"]} "{meta["name"]}" already exists and is not owned by this '
                    "ModelDeployment; the operator never adopts it. Delete or rename it, or rename the "
                    "ModelDeployment"
                )
            try:
                applied = self.api.apply(obj)
            except ApiError as err:
                what = f'{obj["kind"]} "{obj["metadata"]["name"]}"'
                raise ApiError(err.code, err.reason, f"{what}: {err.message}") from err
            if obj["kind"] == "Deployment":
                dep = applied
        return dep

    def _scaled_replicas(self, md: ModelDeploymentView) -> int | None:
        """Between replicas.min and max the scaling loop owns the count: keep the Deployment's, bounded."""
        if md.max_replicas <= md.replicas:
            return None
        dep = self.api.get("apps/v1", "deployments", md.namespace, md.name)
        if dep is None:
            return md.replicas
        current = int((dep.get("spec") or {}).get("replicas", md.replicas))
        return max(md.replicas, min(md.max_replicas, current))

    def _autoscaled(self, md: ModelDeploymentView) -> bool:
        """Whether an HPA (or KEDA, which makes one) scales the engine Deployment: then replicas are its."""
        path = f"/apis/autoscaling/v2/namespaces/{md.namespace}/horizontalpodautoscalers"
        items = self.api.request("GET", path).get("items") or []
        return any(render.targets(hpa, md) for hpa in items)

    def _pods(self, md: ModelDeploymentView) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in render.selector_labels(md).items())
        path = f"/api/v1/namespaces/{md.namespace}/pods"
        return list(self.api.request("GET", path, query=[("labelSelector", selector)]).get("items") or [])

    def _write_status(
        self,
        body: dict[str, Any],
        md: ModelDeploymentView,
        blocker: status.Blocker,
        dep: dict[str, Any] | None,
        pods: list[dict[str, Any]],
    ) -> str:
        obs = status.observe(md, blocker, dep)
        if (extra := self.extra_condition(md.namespace, md.name)) is not None:
            obs = dataclasses.replace(obs, conditions=[*obs.conditions, extra])
        old = body.get("status") or {}
        config_map = render.config_map_name(md) if dep is not None else None
        new = status.status(md, obs, self.settings, old, self.clock(), pods=pods, config_map=config_map)
        if not status.same(old, new):
            self.api.patch_status(GROUP_VERSION, MD_PLURAL, md.namespace, md.name, new)
            log.info("ModelDeployment %s/%s: phase %s", md.namespace, md.name, new["phase"])
        if old.get("phase") != new["phase"]:
            self._announce(body, new)
        return str(new["phase"])

    def _write_invalid_spec(self, body: dict[str, Any], problem: str) -> str:
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        old = body.get("status") or {}
        conds = [
            ("Ready", "False", "InvalidSpec", problem),
            ("Progressing", "False", "InvalidSpec", problem),
            ("Degraded", "True", "InvalidSpec", problem),
        ]
        new = {
            **old,
            "phase": "Failed",
            "observedGeneration": generation,
            "conditions": status.conditions(conds, old, generation, self.clock()),
        }
        if not status.same(old, new):
            self.api.patch_status(GROUP_VERSION, MD_PLURAL, meta["namespace"], meta["name"], new)
        if old.get("phase") != "Failed":
            self._announce(body, new)
        return "Failed"

    def _announce(self, body: dict[str, Any], new: dict[str, Any]) -> None:
        """A Kubernetes Event for a phase transition, with the reason of the condition that explains it."""
        by_type = {c["type"]: c for c in new["conditions"]}
        phase = new["phase"]
        if phase in ("Degraded", "Failed"):
            cond = by_type["Degraded"]
            self.events(body, "Warning", cond["reason"], cond["message"][:1000])
        elif phase == "Ready":
            self.events(body, "Normal", "Ready", by_type["Ready"]["message"])
        else:
            self.events(body, "Normal", phase, by_type.get("Progressing", by_type["Ready"])["message"])


def safe(fn: Callable[[], Any], what: str) -> None:
    """Run ``fn``; log an API refusal instead of raising (for event handlers, which kopf does not retry)."""
    try:
        fn()
    except ApiError as exc:
        log.warning("%s: %s", what, exc)
