"""kopf handlers: ModelDeployments converge on create/update/resume; SLOPolicy and Deployment events
re-converge the ModelDeployments they concern (found through a kopf index of ModelDeployments by policy).

kopf keeps its bookkeeping in ``slofleet.io/`` annotations (never in status, which the CRD schema
defines), and turns only warnings from handlers into Kubernetes Events; the operator posts its own Events
for phase transitions.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import kopf

from slo_core.wire.k8s import API_GROUP, API_VERSION, MANAGED_BY, MANAGED_BY_LABEL
from slo_operator.kubeapi import ApiError, load_configuration
from slo_operator.model import MD_PLURAL, POLICY_PLURAL
from slo_operator.reconcile import Reconciler, safe

log = logging.getLogger(__name__)

RETRY_DELAY_S = 10.0
MANAGED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event about ``body`` (kopf posts it in the background)."""
    kopf.event(kopf.Body(body), type=type_, reason=reason, message=message)


def login(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """kopf's credentials from the same place as the operator's own client (in-cluster or a kubeconfig)."""
    cfg = load_configuration(kubeconfig)
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def _owner(body: dict[str, Any]) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "ModelDeployment" and ref.get("controller"):
            return str(ref["name"])
    return None


def build_registry(reconciler: Reconciler, kubeconfig: str | None = None) -> kopf.OperatorRegistry:
    """A fresh registry with every handler of the operator bound to ``reconciler``."""
    registry = kopf.OperatorRegistry()
    seen_policies: dict[tuple[str, str], int] = {}
    seen_lock = threading.Lock()

    @kopf.on.startup(id="configure", registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=API_GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.networking.request_timeout = reconciler.settings.request_timeout_s
        settings.watching.server_timeout = 300

    @kopf.on.login(id="login", registry=registry)
    def credentials(**_: Any) -> kopf.ConnectionInfo:
        return login(kubeconfig)

    @kopf.index(API_GROUP, API_VERSION, MD_PLURAL, id="md_by_policy", registry=registry)
    def md_by_policy(namespace: str, name: str, spec: Any, **_: Any) -> dict[tuple[str, str], str]:
        return {(namespace, str(spec.get("policyRef") or "default")): name}

    @kopf.on.resume(API_GROUP, API_VERSION, MD_PLURAL, id="converge", registry=registry)
    @kopf.on.create(API_GROUP, API_VERSION, MD_PLURAL, id="converge", registry=registry)
    @kopf.on.update(API_GROUP, API_VERSION, MD_PLURAL, id="converge", registry=registry)
    def model_deployment(namespace: str, name: str, **_: Any) -> None:
        try:
            reconciler.converge(namespace, name)
        except ApiError as exc:
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc

    @kopf.on.event(API_GROUP, API_VERSION, POLICY_PLURAL, id="slo_policy", registry=registry)
    def slo_policy(
        event: Any,
        body: Any,
        namespace: str,
        name: str,
        md_by_policy: kopf.Index[tuple[str, str], str],
        **_: Any,
    ) -> None:
        deployments = sorted(md_by_policy.get((namespace, name), []))
        deleted = event.get("type") == "DELETED"
        if not deleted:
            safe(
                lambda: reconciler.report_policy(dict(body), len(deployments)),
                f"SLOPolicy {namespace}/{name}",
            )
        generation = -1 if deleted else int(body.get("metadata", {}).get("generation") or 1)
        with seen_lock:
            changed = seen_policies.get((namespace, name)) != generation
            seen_policies[(namespace, name)] = generation
        router = reconciler.settings.router_policy
        if name == router and reconciler.settings.router_namespace in (None, namespace):
            # the router's policy: every deployment behind it may now agree with it, or not
            deployments = sorted(
                {md for (ns, _), names in md_by_policy.items() if ns == namespace for md in names}
            )
        if changed:  # a spec edit, a new or a deleted policy: re-render every deployment that follows it
            for md in deployments:
                safe(lambda md=md: reconciler.converge(namespace, md), f"ModelDeployment {namespace}/{md}")

    @kopf.on.event(
        "apps", "v1", "deployments", id="engine_deployment", labels=MANAGED_LABELS, registry=registry
    )
    def engine_deployment(event: Any, body: Any, namespace: str, **_: Any) -> None:
        owner = _owner(dict(body))
        if owner is not None:  # a deleted Deployment is re-created; otherwise only the status is refreshed
            apply = event.get("type") == "DELETED"
            safe(
                lambda: reconciler.converge(namespace, owner, apply=apply),
                f"ModelDeployment {namespace}/{owner}",
            )

    return registry
