"""The operator's Kubernetes I/O: get, server-side apply and status patches, over the official client.

Synchronous on purpose: kopf runs synchronous handlers in its thread pool. Every call has a timeout.
Server-side apply with a fixed field manager makes re-applying an unchanged object a no-op on the server.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from kubernetes import client, config

log = logging.getLogger(__name__)

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "ConfigMap": "configmaps",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "ModelDeployment": "modeldeployments",
    "SLOPolicy": "slopolicies",
}


class ApiError(Exception):
    """A request the API server refused: its HTTP status, reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message


class NotOwned(ApiError):
    """An object with a child's name exists and is not this ModelDeployment's: it is never adopted."""

    def __init__(self, message: str) -> None:
        super().__init__(409, "NotOwned", message)


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """Credentials from ``kubeconfig``, else in-cluster ones in a pod, else ``$KUBECONFIG`` (read now)."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG")
        config.load_kube_config(config_file=path, client_configuration=cfg)
    return cfg


def path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")


class KubeApi:
    """A few verbs on any kind, by API version and plural; JSON in, JSON out."""

    def __init__(self, configuration: client.Configuration, field_manager: str, timeout_s: float) -> None:
        self._client = client.ApiClient(configuration)
        self.field_manager = field_manager
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        resource_path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        params = self._client.param_serialize(
            method=method,
            resource_path=resource_path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self._client.call_api(*params[:4], _request_timeout=self.timeout_s)
        raw = resp.read()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw.decode(errors="replace")[:500]}
        if resp.status >= 400:
            raise ApiError(resp.status, str(data.get("reason", resp.reason)), str(data.get("message", "")))
        return data

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path(api_version, plural, namespace, name))
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` (creates it when missing); the operator owns the fields it sets."""
        meta = obj["metadata"]
        where = path(obj["apiVersion"], PLURALS[obj["kind"]], meta.get("namespace"), meta["name"])
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return self.request("PATCH", where, json.dumps(obj), "application/apply-patch+yaml", query)

    def patch_status(
        self, api_version: str, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        where = path(api_version, plural, namespace, name) + "/status"
        return self.request("PATCH", where, {"status": status}, "application/merge-patch+json")
