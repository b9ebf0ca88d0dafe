"""Discovery in Kubernetes: engine pods by label, ModelDeployments for /v1/models, API keys from Secrets.

The official (synchronous) client runs in worker threads: each watch lists, then watches from the
list's resourceVersion, and starts over on any error (a 410 Gone, a dropped connection) after a short
backoff. Every change is applied on the router's event loop, so the endpoint table has one writer.

Pods are selected by the operator's labels (``app.kubernetes.io/name=slofleet-engine``); a pod is an
endpoint while it is Ready, has an IP and is not being deleted. What to reach and what it serves come
from the annotations the operator writes on the pod template (``slofleet.io/http-port``,
``grpc-port``, ``served-model``, ``context-length``, ``gpu-class``, ``lora-adapters``). Tenant keys are
re-read from the Secrets the SLOPolicy references every ``secrets_every_s``; key values are never logged.

With ``policy_name`` the router follows that SLOPolicy object (in its namespace) instead of a file: it
is re-read every ``policy_every_s``, and each new version that validates (the same checks as
``slofleet validate``) replaces tiers, tenants and the routing policy; an invalid version is logged
with what to change and the last good one stays in force. Until the first good version is read the
router is not ready.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from slo_core.wire.k8s import ANNOTATION_PREFIX as NOTE
from slo_core.wire.k8s import API_GROUP, API_VERSION, ENGINE_SELECTOR, MD_LABEL
from slo_router.config import RouterConfig
from slo_router.endpoints import EndpointSpec, EndpointState
from slo_router.tenants import keys_from_secret_data

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 20


def pod_endpoint(pod: dict[str, Any]) -> EndpointSpec | None:
    """The endpoint a pod offers, or None while it cannot take traffic."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    notes = meta.get("annotations") or {}
    ip = status.get("podIP")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    if not ip or not ready or meta.get("deletionTimestamp"):
        return None
    http_port = notes.get(NOTE + "http-port", "8000")
    grpc_port = notes.get(NOTE + "grpc-port")
    served = notes.get(NOTE + "served-model")
    lora = tuple(a for a in notes.get(NOTE + "lora-adapters", "").split(",") if a)
    context = notes.get(NOTE + "context-length")
    mode = "engine" if notes.get(NOTE + "mode") == "engine" else "proxy"
    return EndpointSpec(
        endpoint_id=f"{meta.get('namespace', 'default')}/{meta['name']}",
        http_url=f"http://{ip}:{http_port}",
        grpc_target=f"{ip}:{grpc_port}" if grpc_port else None,
        models=(served,) if served else (),
        max_context_tokens=int(context) if context and context.isdigit() else 1 << 30,
        gpu_class=notes.get(NOTE + "gpu-class", ""),
        lora_adapters=lora,
        deployment=(meta.get("labels") or {}).get(MD_LABEL, ""),
        mode=mode,
    )


def deployment_models(md: dict[str, Any]) -> list[str]:
    """Model names a ModelDeployment serves: its served name and its LoRA adapters."""
    spec = md.get("spec") or {}
    served = (spec.get("model") or {}).get("servedName")
    lora = [a.get("name") for a in (spec.get("capabilities") or {}).get("loraAdapters") or []]
    return [n for n in (served, *lora) if n]


def secret_keys(secret: dict[str, Any], key: str, tenant: str) -> dict[str, str]:
    """The API keys one Secret key holds for ``tenant`` (one key per line)."""
    raw = (secret.get("data") or {}).get(key)
    if raw is None:
        text = (secret.get("stringData") or {}).get(key)
        return keys_from_secret_data(tenant, [text]) if text else {}
    try:
        return keys_from_secret_data(tenant, [base64.b64decode(raw).decode("utf-8")])
    except (binascii.Error, UnicodeDecodeError):
        log.warning(
            "Secret %s key %s of tenant %s is not base64 UTF-8 text; ignored",
            (secret.get("metadata") or {}).get("name"),
            key,
            tenant,
        )
        return {}


class KubeDiscovery:
    """Keeps ``state.endpoints``, ``state.catalog`` and ``state.keys`` in step with the cluster."""

    def __init__(
        self,
        state: Any,
        *,
        namespace: str | None = None,
        api_client: Any = None,
        secrets_namespace: str = "default",
        secrets_every_s: float = 10.0,
        backoff_s: float = 1.0,
        file_keys: dict[str, str] | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        policy_name: str | None = None,
        policy_every_s: float = 5.0,
        adjust: Callable[[RouterConfig], RouterConfig] = lambda config: config,
        peers_selector: str | None = None,
    ) -> None:
        self.state = state
        self.namespace = namespace
        self.secrets_namespace = namespace or secrets_namespace
        self.secrets_every_s = secrets_every_s
        self.backoff_s = backoff_s
        self.watch_timeout_s = watch_timeout_s
        self._api_client = api_client
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mds: dict[str, list[str]] = {}
        self.file_keys: dict[str, str] = dict(file_keys or {})
        self.policy_name = policy_name
        self.policy_every_s = policy_every_s
        self.adjust = adjust
        # Router replicas (pods matching peers_selector): each enforces 1/N of every tenant's rate, so
        # the fleet of routers admits the rate the policy states, however many replicas run.
        self.peers_selector = peers_selector
        self._peers: set[str] = set()
        self._secrets_due = threading.Event()  # set: re-read the Secrets now (the tenants changed)
        self.policy_source = f"{self.secrets_namespace}/{policy_name}" if policy_name else ""
        if policy_name:  # closed until the policy is read; set before the app takes any request
            state.policy_loaded = False
            state.policy_source = self.policy_source
        # not ready, and no key refused, until the policy's key Secrets and the pods were read once
        state.keys_loaded = False
        state.endpoints_listed = False

    # ------------------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        import kubernetes

        if self._api_client is None:
            self._api_client = _default_client()
        self._loop = asyncio.get_running_loop()
        core = kubernetes.client.CoreV1Api(self._api_client)
        custom = kubernetes.client.CustomObjectsApi(self._api_client)
        ns = self.namespace
        pods = (lambda **kw: core.list_namespaced_pod(ns, **kw)) if ns else core.list_pod_for_all_namespaces
        mds = (
            (
                lambda **kw: custom.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, ns, "modeldeployments", **kw
                )
            )
            if ns
            else (
                lambda **kw: custom.list_cluster_custom_object(
                    API_GROUP, API_VERSION, "modeldeployments", **kw
                )
            )
        )
        workers = [
            threading.Thread(
                target=self._watch,
                args=(pods, ENGINE_SELECTOR, self._pods_listed, self._pod_event),
                name="kube-pods",
                daemon=True,
            ),
            threading.Thread(
                target=self._watch,
                args=(mds, None, self._mds_listed, self._md_event),
                name="kube-mds",
                daemon=True,
            ),
            threading.Thread(target=self._refresh_secrets, args=(core,), name="kube-secrets", daemon=True),
        ]
        if self.peers_selector:
            workers.append(
                threading.Thread(
                    target=self._watch,
                    args=(pods, self.peers_selector, self._peers_listed, self._peer_event),
                    name="kube-peers",
                    daemon=True,
                )
            )
        if self.policy_name:
            workers.append(
                threading.Thread(target=self._follow_policy, args=(custom,), name="kube-policy", daemon=True)
            )
        for w in workers:
            w.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._stop.set()
            self._secrets_due.set()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    # --------------------------------------------------------------------- watch threads

    def _watch(
        self,
        list_fn: Callable[..., Any],
        selector: str | None,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
    ) -> None:
        import kubernetes

        kw = {"label_selector": selector} if selector else {}
        while not self._stop.is_set():
            try:
                resp = list_fn(_preload_content=False, **kw)
                listing = json.loads(resp.data)
                self._post(on_list, listing.get("items") or [])
                rv = (listing.get("metadata") or {}).get("resourceVersion")
                while not self._stop.is_set():
                    w = kubernetes.watch.Watch()
                    for ev in w.stream(
                        list_fn,
                        resource_version=rv,
                        timeout_seconds=self.watch_timeout_s,
                        _request_timeout=self.watch_timeout_s + 10,
                        **kw,
                    ):
                        if self._stop.is_set():
                            w.stop()
                            break
                        obj = ev.get("raw_object") or {}
                        if ev.get("type") == "ERROR":
                            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        self._post(on_event, ev["type"], obj)
            except Exception as exc:  # any failure: list again after a pause
                if self._stop.is_set():
                    return
                log.warning("kubernetes watch failed (%s); listing again", type(exc).__name__)
                self._stop.wait(self.backoff_s)

    def _refresh_secrets(self, core: Any) -> None:
        """Re-read every tenant's key Secret. A read that fails (an API-server blip, a 403) keeps the
        tenant's last good keys, says so in a log line and ``slofleet_router_key_reads_failed``; only
        a Secret that was read and holds no keys (or a tenant the policy dropped) removes keys."""
        last_good: dict[str, dict[str, str]] = {}
        while not self._stop.is_set():
            keys: dict[str, str] = dict(self.file_keys)
            secrets = dict(sorted(self.state.config.key_secrets.items()))
            for tenant in [t for t in last_good if t not in secrets]:
                del last_good[tenant]
            for tenant, (name, key) in secrets.items():
                try:
                    secret = self._api_client.sanitize_for_serialization(
                        core.read_namespaced_secret(name, self.secrets_namespace)
                    )
                except Exception as exc:
                    kept = last_good.get(tenant, {})
                    log.warning(
                        "cannot read Secret %s for tenant %s (%s %s); keeping its last good %d keys",
                        name,
                        tenant,
                        type(exc).__name__,
                        getattr(exc, "status", "") or "",
                        len(kept),
                    )
                    self._post(self._note_key_read_failed, tenant)
                else:
                    last_good[tenant] = secret_keys(secret, key, tenant)
                for k, t in last_good.get(tenant, {}).items():
                    keys.setdefault(k, t)
            self._post(self._set_keys, keys, secrets)
            self._secrets_due.wait(self.secrets_every_s)
            self._secrets_due.clear()

    def _follow_policy(self, custom: Any) -> None:
        """Re-read the named SLOPolicy; apply each new version that validates, keep the last good one."""
        from slo_core.crd.loads import policy_from_object
        from slo_router.config import from_policy

        ns, name = self.secrets_namespace, self.policy_name
        source = f"SLOPolicy {self.policy_source}"
        seen: str | None = None
        problem = ""
        while not self._stop.is_set():
            try:
                obj = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, "slopolicies", name)
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if version != seen:
                    seen = version
                    policy = policy_from_object(obj, source)
                    require_keys = self.state.config.require_keys
                    config = self.adjust(from_policy(policy.spec, require_keys=require_keys))
                    self._post(self._set_policy, config, version)
                problem = ""
            except ValueError as exc:  # this version is invalid: say what to change, keep the last good
                log.error(
                    "%s (resourceVersion %s) not applied; the last good version stays: %s", source, seen, exc
                )
            except Exception as exc:  # not found, forbidden, API server unreachable: try again later
                parts = (type(exc).__name__, getattr(exc, "status", None), getattr(exc, "reason", None))
                now = " ".join(str(p) for p in parts if p)
                if now != problem:
                    problem = now
                    log.warning(
                        "cannot read %s (%s); retrying every %.0f s", source, now, self.policy_every_s
                    )
            self._stop.wait(self.policy_every_s)

    # ------------------------------------------------------------- applied on the event loop

    def _set_policy(self, config: RouterConfig, version: str) -> None:
        first = not self.state.policy_loaded
        source = self.policy_source
        try:
            self.state.apply_config(config, source)
        except ValueError as exc:  # e.g. a routing parameter the policy rejects
            log.error("SLOPolicy %s (resourceVersion %s) not applied: %s", source, version, exc)
            return
        log.info(
            "%s SLOPolicy %s (resourceVersion %s): %d tiers, %d tenants, routing %s",
            "following" if first else "updated to",
            source,
            version,
            len(config.tiers),
            len(config.tenants),
            config.routing_policy,
        )
        self._secrets_due.set()

    def _note_key_read_failed(self, tenant: str) -> None:
        metrics = getattr(self.state, "metrics", None)
        if metrics is not None:
            metrics.key_reads_failed.labels(tenant).inc()

    def _set_keys(self, keys: dict[str, str], read_for: dict[str, tuple[str, str]]) -> None:
        before = len(self.state.keys)
        self.state.keys.replace(keys)
        if len(keys) != before:
            log.info("API keys: %d known (from Secrets)", len(keys))
        # the first read of the Secrets the policy in force names ends startup's key gate (a read
        # made for the config before the policy arrived does not: its tenants are not the policy's)
        if self.state.policy_loaded and read_for == dict(self.state.config.key_secrets):
            self.state.keys_loaded = True

    def _pods_listed(self, pods: list[dict[str, Any]]) -> None:
        table: dict[str, EndpointState] = self.state.endpoints
        specs = {s.endpoint_id: s for s in map(pod_endpoint, pods) if s is not None}
        for gone in [k for k in table if k not in specs]:
            del table[gone]
        for spec in specs.values():
            self._upsert(spec)
        self.state.endpoints_listed = True

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        spec = None if kind == "DELETED" else pod_endpoint(pod)
        if spec is None:
            if self.state.endpoints.pop(key, None) is not None:
                log.info("pod %s left the fleet", key)
            return
        self._upsert(spec)

    def _upsert(self, spec: EndpointSpec) -> None:
        table: dict[str, EndpointState] = self.state.endpoints
        current = table.get(spec.endpoint_id)
        if current is None:
            table[spec.endpoint_id] = EndpointState(spec)
            log.info("pod %s joined the fleet (%s)", spec.endpoint_id, ",".join(spec.models) or "any model")
        elif current.spec != spec:
            current.spec = spec

    def _peers_listed(self, pods: list[dict[str, Any]]) -> None:
        self._peers = {_key(p) for p in pods if _ready(p)}
        self._publish_share()

    def _peer_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind != "DELETED" and _ready(pod):
            self._peers.add(_key(pod))
        else:
            self._peers.discard(_key(pod))
        self._publish_share()

    def _publish_share(self) -> None:
        replicas = max(1, len(self._peers))  # this replica counts even before its own pod is Ready
        share = 1.0 / replicas
        if share != self.state.limiter.share:
            self.state.limiter.set_share(share)
            log.info("%d router replicas ready: each enforces 1/%d of a tenant's rate", replicas, replicas)

    def _mds_listed(self, mds: list[dict[str, Any]]) -> None:
        self._mds = {_key(md): deployment_models(md) for md in mds}
        self._publish_catalog()

    def _md_event(self, kind: str, md: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._mds.pop(_key(md), None)
        else:
            self._mds[_key(md)] = deployment_models(md)
        self._publish_catalog()

    def _publish_catalog(self) -> None:
        catalog: dict[str, str] = {}
        for key, names in sorted(self._mds.items()):
            for n in names:
                catalog.setdefault(n, key.split("/", 1)[1])
        self.state.catalog.clear()
        self.state.catalog.update(catalog)


def _ready(pod: dict[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    conds = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    return ready and not meta.get("deletionTimestamp")


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def _default_client() -> Any:
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    except kubernetes.config.ConfigException:
        return kubernetes.config.new_client_from_config()


async def watch_kubernetes(state: Any, *, namespace: str | None = None, **kw: Any) -> None:
    """Background job for the app factory (``slofleet router --kubernetes``)."""
    await KubeDiscovery(state, namespace=namespace, **kw).run()
