"""A Kubernetes API server emulator for tests: kmock 0.8's ``KubernetesEmulator`` extended until kopf,
the official client, kubectl 1.32 and Helm 4 work against it unchanged.

Pinned to ``kmock==0.8`` (it uses kmock internals). What it adds over kmock 0.8: resourceVersion, uid,
generation, generateName, 201 on create, namespaces from the URL, typed lists, watches that resume
from a resourceVersion, label and field selectors, PUT, merge / JSON / strategic-merge patches and
server-side apply (also creating), dryRun, CRDs that become served resources with defaulting, pruning,
OpenAPI and CEL validation, strict validation of built-in kinds, garbage collection by ownerReferences,
server-side tables for ``kubectl get``, and an audit log of every request with the user who made it.
It has no controllers and no kubelet, and it does not enforce RBAC (tests check the audit log).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import json
import random
import string
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import parsing
from kube import admission, discovery, patching, schemas, tables
from kube.admission import ApiError, Kind

CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")


@dataclass(frozen=True)
class AuditRecord:
    """One API request: who, which verb on which resource, and the status code it got."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str | None
    name: str | None
    code: int
    # (apiVersion, kind) of owners the written object blocks deletion of (blockOwnerDeletion: true):
    # the OwnerReferencesPermission admission plugin requires update on <owner>/finalizers for these.
    blocked_owners: tuple[tuple[str, str], ...] = ()


@dataclass
class Call:
    """A parsed resource request."""

    request: kmock.Request
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None
    verb: str = ""

    def param(self, key: str) -> str | None:
        return self.request.params.get(key)


def _blocked_owners(call: Call) -> tuple[tuple[str, str], ...]:
    if call.verb not in ("create", "update", "patch"):
        return ()
    try:
        body = json.loads(call.request.text or "{}")
    except ValueError:
        try:
            body = yaml.safe_load(call.request.text)
        except yaml.YAMLError:
            return ()
    refs = ((body or {}).get("metadata") or {}).get("ownerReferences") if isinstance(body, dict) else None
    return tuple(
        (str(r.get("apiVersion")), str(r.get("kind")))
        for r in refs or []
        if isinstance(r, dict) and r.get("blockOwnerDeletion")
    )


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(path: str) -> tuple[str, str, list[str]] | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        return "", parts[1], parts[2:]
    if len(parts) >= 3 and parts[0] == "apis":
        return parts[1], parts[2], parts[3:]
    return None


@attrs.define(kw_only=True)
class ApiEmulator(kmock.KubernetesEmulator):
    """The emulated API server. ``users`` maps bearer tokens to user names for the audit log."""

    users: dict[str, str] = attrs.field(factory=dict)
    audit: list[AuditRecord] = attrs.field(factory=list, init=False)
    _rv: int = attrs.field(default=100, init=False)
    _log: list[tuple[int, str, str, str, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _tick: asyncio.Event | None = attrs.field(default=None, init=False)
    _applied: dict[tuple[str, str], Any] = attrs.field(factory=dict, init=False)
    _crds: dict[tuple[str, str, str], schemas.CrdVersion] = attrs.field(factory=dict, init=False)
    # fault injection: while a path contains one of these, it is answered 500 (an API-server blip)
    failing_paths: set[str] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        for ns in ("default", "kube-system"):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            self._store(self._kind(NAMESPACES), None, body)

    # ------------------------------------------------------------------------------------ routing

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path
        if any(part in path for part in self.failing_paths):
            return self._error(ApiError(500, "InternalError", "injected fault: the API server failed"))
        if path == "/version":
            return aiohttp.web.json_response(discovery.K8S_SERVER_VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return aiohttp.web.Response(text="ok")
        if path.startswith("/openapi/v3"):
            return self._openapi(path)
        if path.startswith("/openapi/v2"):
            return aiohttp.web.Response(status=404, text="not served; use /openapi/v3")
        if path.rstrip("/") == "/api":
            return aiohttp.web.json_response(discovery.api_versions())
        if path.rstrip("/") == "/apis":
            return aiohttp.web.json_response(discovery.api_group_list(self._resource_items()))
        parsed = _parse(path)
        if parsed is None and path.startswith("/apis/") and path.count("/") == 2:
            parsed = (path.split("/")[2], "", [])
        if parsed is None:
            return await super()._handle(request)
        group, version, rest = parsed
        if not rest:
            return self._discovery(group, version)
        call = self._call(request, group, version, rest)
        if call is None:
            return self._error(ApiError(404, "NotFound", f"the server could not find the URL {path}"))
        return await self._serve(call)

    def _call(self, request: kmock.Request, group: str, version: str, rest: list[str]) -> Call | None:
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), "/".join(rest[2:]) or None
        return Call(request, group, version, plural, namespace, name, sub)

    def _discovery(self, group: str, version: str) -> aiohttp.web.StreamResponse:
        items = list(self._resource_items())
        if group == "" or version:
            doc: dict[str, Any] | None = discovery.api_resource_list(items, group, version)
        else:
            doc = discovery.api_group(items, group)
        if doc is None:
            return self._error(ApiError(404, "NotFound", "the server could not find the requested resource"))
        return aiohttp.web.json_response(doc)

    def _openapi(self, path: str) -> aiohttp.web.StreamResponse:
        items = list(self._resource_items())
        rest = path.removeprefix("/openapi/v3").strip("/")
        if not rest:
            return aiohttp.web.json_response(discovery.openapi_root(items))
        parts = rest.split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        return aiohttp.web.json_response(discovery.openapi_group_version(items, group, version))

    def _resource_items(self) -> list[tuple[kmock.resource, kmock.ResourceInfo]]:
        return [(res, self.resources[res]) for res in self.resources]

    def _kind(self, res: kmock.resource) -> Kind:
        info = self.resources[res]
        return Kind(
            group=res.group or "",
            version=res.version or "",
            plural=res.plural or "",
            kind=info.kind or "",
            namespaced=bool(info.namespaced),
            subresources=set(info.subresources),
            crd=self._crds.get((res.group or "", res.version or "", res.plural or "")),
        )

    def _user(self, request: kmock.Request) -> str:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip()
        if token:  # kubectl sends no token over plain HTTP: it is named by its user agent then
            return self.users.get(token, token)
        return request.headers.get("User-Agent", "anonymous").split("/")[0]

    def _error(self, err: ApiError) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(err.status(), status=err.code)

    # ----------------------------------------------------------------------------------- dispatch

    async def _serve(self, call: Call) -> aiohttp.web.StreamResponse:
        method = call.request.method.value.upper()
        watch = call.param("watch") in ("true", "1")
        call.verb = {
            "GET": "watch" if watch else ("get" if call.name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if call.name else "deletecollection",
        }.get(method, method.lower())
        res = kmock.resource(call.group, call.version, call.plural)
        code = 200
        try:
            if res not in self.resources:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            kind = self._kind(res)
            if call.request.headers.get("Content-Type", "").startswith("application/vnd.kubernetes.protobuf"):
                raise ApiError(
                    415, "UnsupportedMediaType", "protobuf bodies are not supported by the emulator"
                )
            if call.verb == "watch":
                self._record(call, 200)
                return await self._watch(call, kind, res)
            code, body, headers = self._dispatch(call, kind, res)
            if self._wants_table(call) and call.verb in ("get", "list"):
                body = tables.table(kind, body, include_object=call.param("includeObject") == "Object")
            response = aiohttp.web.json_response(body, status=code, headers=headers)
        except ApiError as err:
            code = err.code
            response = self._error(err)
        self._record(call, code)
        return response

    def _record(self, call: Call, code: int) -> None:
        self.audit.append(
            AuditRecord(
                user=self._user(call.request),
                verb=call.verb,
                group=call.group,
                resource=call.plural,
                subresource=call.subresource or "",
                namespace=call.namespace,
                name=call.name,
                code=code,
                blocked_owners=_blocked_owners(call),
            )
        )

    @staticmethod
    def _wants_table(call: Call) -> bool:
        return "as=Table" in call.request.headers.get("Accept", "")

    def _dispatch(self, call: Call, kind: Kind, res: kmock.resource) -> tuple[int, Any, dict[str, str]]:
        warnings: list[str] = []
        if call.subresource == "scale":
            return self._scale(call, kind, res, warnings)
        if call.verb == "list":
            return 200, self._list(call, kind, res), {}
        if call.verb == "get":
            return 200, self._require(kind, res, call.namespace, call.name), {}
        if call.verb == "create":
            return 201, self._create(call, kind, res, self._body(call), warnings), self._warn(warnings)
        if call.verb == "update":
            return 200, self._update(call, kind, res, warnings), self._warn(warnings)
        if call.verb == "patch":
            return self._patch(call, kind, res, warnings)
        if call.verb == "delete":
            return 200, self._delete(call, kind, res), {}
        if call.verb == "deletecollection":
            for obj in self._list(call, kind, res)["items"]:
                self._delete_object(kind, res, obj, dry_run=call.param("dryRun") is not None)
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}, {}
        raise ApiError(405, "MethodNotAllowed", f"{call.verb} is not supported")

    def _scale(
        self, call: Call, kind: Kind, res: kmock.resource, warnings: list[str]
    ) -> tuple[int, Any, dict[str, str]]:
        """The ``scale`` subresource of Deployments (autoscaling/v1 Scale): get, merge patch, update."""
        if kind.plural != "deployments":
            raise ApiError(404, "NotFound", f"{kind.plural} have no scale subresource in the emulator")
        obj = self._require(kind, res, call.namespace, call.name)
        if call.verb in ("patch", "update"):
            body = self._body(call)
            ctype = call.request.headers.get("Content-Type", "").split(";")[0].strip()
            if call.verb == "patch" and ctype != "application/merge-patch+json":
                raise ApiError(
                    415, "UnsupportedMediaType", f"scale patches here are merge patches, not {ctype}"
                )
            replicas = (body.get("spec") or {}).get("replicas") if isinstance(body, dict) else None
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise ApiError(
                    422, "Invalid", f"spec.replicas: must be a non-negative integer, got {replicas!r}"
                )
            new = copy.deepcopy(obj)
            new["spec"]["replicas"] = replicas
            whole = dataclasses.replace(call, subresource=None)
            obj = self._write(whole, kind, res, obj, new, warnings)
            # the writer now owns spec.replicas: an apply that leaves it out no longer removes it
            for (uid, _), applied in self._applied.items():
                if uid == obj["metadata"]["uid"] and isinstance(applied.get("spec"), dict):
                    applied["spec"].pop("replicas", None)
        selector = ",".join(f"{k}={v}" for k, v in obj["spec"]["selector"].get("matchLabels", {}).items())
        meta = obj["metadata"]
        scale = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "spec": {"replicas": obj["spec"].get("replicas", 1)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0), "selector": selector},
        }
        return 200, scale, self._warn(warnings)

    @staticmethod
    def _warn(warnings: list[str]) -> dict[str, str]:
        return {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else {}

    def _body(self, call: Call) -> dict[str, Any]:
        text = call.request.text
        try:
            body = json.loads(text) if text.strip().startswith(("{", "[")) else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"cannot decode the body: {exc}") from exc
        if not isinstance(body, dict | list):
            raise ApiError(400, "BadRequest", "the body must be an object")
        return body  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------ storage

    def _key(self, kind: Kind, res: kmock.resource, ns: str | None, name: str) -> tuple[Any, ...]:
        return (res, ns if kind.namespaced else None, name)

    def _find(
        self, kind: Kind, res: kmock.resource, ns: str | None, name: str | None
    ) -> dict[str, Any] | None:
        key = self._key(kind, res, ns, name or "")
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def _require(self, kind: Kind, res: kmock.resource, ns: str | None, name: str | None) -> dict[str, Any]:
        obj = self._find(kind, res, ns, name)
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{kind.qualified} "{name}" not found',
                {"name": name, "group": kind.group, "kind": kind.plural},
            )
        return obj

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, res: kmock.resource, kind_: str, obj: dict[str, Any]) -> None:
        self._log.append((self._rv, res.group or "", res.plural or "", kind_, copy.deepcopy(obj)))
        if self._tick is not None:
            self._tick.set()
            self._tick = asyncio.Event()

    def _store(self, kind: Kind, old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
        res = kmock.resource(kind.group, kind.version, kind.plural)
        meta = new["metadata"]
        if old is not None and {**old, "metadata": {**old["metadata"], "resourceVersion": None}} == {
            **new,
            "metadata": {**meta, "resourceVersion": None},
        }:
            return old  # a no-op write changes nothing, not even the resourceVersion
        meta["resourceVersion"] = self._next_rv()
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
        if kind.plural == "customresourcedefinitions" and kind.group == "apiextensions.k8s.io":
            new["status"] = schemas.established_status(new, _now())
            self._serve_crd(new)
        key = self._key(kind, res, meta.get("namespace"), meta["name"])
        if key in self._objects:
            self._objects[key].history.append(copy.deepcopy(new))
        else:
            self._objects[key] = copy.deepcopy(new)
        self._emit(res, "ADDED" if old is None else "MODIFIED", new)
        return new

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        for ver in schemas.crd_versions(crd):
            res = kmock.resource(ver.group, ver.version, ver.plural)
            self._crds[(ver.group, ver.version, ver.plural)] = ver
            self.resources[res] = kmock.ResourceInfo(
                namespaced=ver.namespaced,
                kind=ver.kind,
                singular=ver.singular,
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
                shortnames=set(ver.short_names),
                categories=set(ver.categories),
                subresources=set(ver.subresources),
            )

    def _unserve_crd(self, crd: dict[str, Any]) -> None:
        for ver in schemas.crd_versions(crd):
            res = kmock.resource(ver.group, ver.version, ver.plural)
            kind = self._kind(res)
            for key, obj in list(self._objects.items()):
                if key[0] == res and not obj.deleted:
                    self._remove(kind, res, copy.deepcopy(obj.raw))
            self._crds.pop((ver.group, ver.version, ver.plural), None)
            del self.resources[res]

    # ---------------------------------------------------------------------------------- verbs

    def _list(self, call: Call, kind: Kind, res: kmock.resource) -> dict[str, Any]:
        labels = patching.label_matcher(call.param("labelSelector"))
        fields = patching.field_matcher(call.param("fieldSelector"))
        items = []
        for key, obj in self._objects.items():
            if key[0] != res or obj.deleted or (call.namespace and key[1] != call.namespace):
                continue
            raw = obj.raw
            if labels(raw.get("metadata", {}).get("labels") or {}) and fields(raw):
                items.append(copy.deepcopy(raw))
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _create(
        self, call: Call, kind: Kind, res: kmock.resource, body: dict[str, Any], warnings: list[str]
    ) -> dict[str, Any]:
        if call.subresource:
            raise ApiError(
                405, "MethodNotAllowed", f"create on {call.plural}/{call.subresource} is not supported"
            )
        meta = body.setdefault("metadata", {})
        if call.namespace and meta.get("namespace") not in (None, call.namespace):
            raise ApiError(
                400, "BadRequest", "the namespace of the provided object does not match the request"
            )
        if kind.namespaced:
            meta["namespace"] = call.namespace or meta.get("namespace") or "default"
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        if not meta.get("name"):
            raise admission.invalid(
                kind,
                "",
                [
                    schemas.Violation(
                        "metadata.name", "FieldValueRequired", "name or generateName is required"
                    )
                ],
            )
        if self._find(kind, res, meta.get("namespace"), meta["name"]) is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": kind.group, "kind": kind.plural},
            )
        obj = admission.admit(
            kind, None, body, subresource=None, strict=self._strict(call), warnings=warnings
        )
        if call.param("dryRun"):
            return obj
        return self._store(kind, None, obj)

    def _strict(self, call: Call) -> bool:
        return call.param("fieldValidation") == "Strict"

    def _update(self, call: Call, kind: Kind, res: kmock.resource, warnings: list[str]) -> dict[str, Any]:
        body = self._body(call)
        old = self._find(kind, res, call.namespace, call.name)
        if old is None:
            if call.subresource:
                self._require(kind, res, call.namespace, call.name)
            return self._create(call, kind, res, body, warnings)  # PUT creates, as for most kinds
        self._check_rv(kind, old, body)
        return self._write(call, kind, res, old, body, warnings)

    def _check_rv(self, kind: Kind, old: dict[str, Any], body: Any) -> None:
        wanted = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            name = old["metadata"]["name"]
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "group": kind.group, "kind": kind.plural},
            )

    def _write(
        self, call: Call, kind: Kind, res: kmock.resource, old: dict[str, Any], new: Any, warnings: list[str]
    ) -> dict[str, Any]:
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the patched object is not an object")
        if call.subresource not in (None, "status"):
            raise ApiError(405, "MethodNotAllowed", f"{call.subresource} is not supported by the emulator")
        obj = admission.admit(
            kind, old, new, subresource=call.subresource, strict=self._strict(call), warnings=warnings
        )
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if call.param("dryRun"):
            return obj
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(kind, res, obj)
            self._collect_garbage()
            return obj
        return self._store(kind, old, obj)

    def _patch(
        self, call: Call, kind: Kind, res: kmock.resource, warnings: list[str]
    ) -> tuple[int, Any, dict[str, str]]:
        ctype = call.request.headers.get("Content-Type", "").split(";")[0].strip()
        body = self._body(call)
        old = self._find(kind, res, call.namespace, call.name)
        if ctype == "application/apply-patch+yaml":
            manager = call.param("fieldManager")
            if not manager:
                raise ApiError(400, "BadRequest", "PATCH with apply requires a fieldManager")
            body.setdefault("metadata", {}).setdefault("name", call.name)
            if old is None:
                if call.subresource:
                    self._require(kind, res, call.namespace, call.name)
                created = self._create(call, kind, res, copy.deepcopy(body), warnings)
                if not call.param("dryRun"):
                    self._applied[(created["metadata"]["uid"], manager)] = body
                return 201, created, self._warn(warnings)
            previous = self._applied.get((old["metadata"]["uid"], manager))
            new = patching.server_side_apply(old, body, previous)
            result = self._write(call, kind, res, old, new, warnings)
            if not call.param("dryRun"):
                self._applied[(old["metadata"]["uid"], manager)] = body
            return 200, result, self._warn(warnings)
        if old is None:
            self._require(kind, res, call.namespace, call.name)
            raise AssertionError("unreachable")
        try:
            if ctype == "application/json-patch+json":
                new = patching.json_patch(old, body)  # type: ignore[arg-type]
            elif ctype == "application/merge-patch+json":
                self._check_rv(kind, old, body)
                new = patching.merge_patch(old, body)
            elif ctype == "application/strategic-merge-patch+json":
                if kind.crd is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "strategic merge patch is not supported for custom resources",
                    )
                self._check_rv(kind, old, body)
                new = patching.strategic_merge(old, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the patch type {ctype!r} is not supported")
        except patching.PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from exc
        return 200, self._write(call, kind, res, old, new, warnings), self._warn(warnings)

    def _delete(self, call: Call, kind: Kind, res: kmock.resource) -> dict[str, Any]:
        obj = self._require(kind, res, call.namespace, call.name)
        options = {}
        if call.request.text.strip():
            options = self._body(call)
        policy = call.param("propagationPolicy") or options.get("propagationPolicy") or "Background"
        dry_run = bool(call.param("dryRun") or options.get("dryRun"))
        if policy == "Orphan" and not dry_run:
            self._orphan(obj["metadata"]["uid"])
        return self._delete_object(kind, res, obj, dry_run=dry_run)

    def _delete_object(
        self, kind: Kind, res: kmock.resource, obj: dict[str, Any], *, dry_run: bool
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        if dry_run or meta.get("deletionTimestamp"):
            return obj
        if meta.get("finalizers"):
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._store(kind, obj, new)
        self._remove(kind, res, obj)
        self._collect_garbage()
        return obj

    def _remove(self, kind: Kind, res: kmock.resource, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self._objects[self._key(kind, res, meta.get("namespace"), meta["name"])].delete()
        meta["resourceVersion"] = self._next_rv()
        self._emit(res, "DELETED", obj)
        if kind.plural == "customresourcedefinitions" and kind.group == "apiextensions.k8s.io":
            self._unserve_crd(obj)
        if kind.plural == "namespaces" and not kind.group:
            for key, item in list(self._objects.items()):
                if key[1] == meta["name"] and not item.deleted:
                    self._delete_object(self._kind(key[0]), key[0], copy.deepcopy(item.raw), dry_run=False)

    # --------------------------------------------------------------------------- garbage collector

    def _live(self) -> list[tuple[Any, dict[str, Any]]]:
        return [(key, obj.raw) for key, obj in self._objects.items() if not obj.deleted]

    def _orphan(self, uid: str) -> None:
        for key, raw in self._live():
            refs = raw["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                new = copy.deepcopy(raw)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid] or None
                if new["metadata"]["ownerReferences"] is None:
                    del new["metadata"]["ownerReferences"]
                self._store(self._kind(key[0]), raw, new)

    def _collect_garbage(self) -> None:
        """Delete every object all of whose owners are gone (background propagation)."""
        changed = True
        while changed:
            changed = False
            uids = {raw["metadata"].get("uid") for _, raw in self._live()}
            for key, raw in self._live():
                refs = raw["metadata"].get("ownerReferences") or []
                if (
                    refs
                    and not raw["metadata"].get("deletionTimestamp")
                    and not any(r.get("uid") in uids for r in refs)
                ):
                    self._delete_object(self._kind(key[0]), key[0], copy.deepcopy(raw), dry_run=False)
                    changed = True

    # -------------------------------------------------------------------------------------- watch

    async def _watch(self, call: Call, kind: Kind, res: kmock.resource) -> aiohttp.web.StreamResponse:
        raw_request = call.request._raw_request
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw_request)
        labels = patching.label_matcher(call.param("labelSelector"))
        fields = patching.field_matcher(call.param("fieldSelector"))

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata", {})
            if call.namespace and meta.get("namespace") != call.namespace:
                return False
            if call.name and meta.get("name") != call.name:
                return False
            return labels(meta.get("labels") or {}) and fields(obj)

        since = call.param("resourceVersion")
        timeout = float(call.param("timeoutSeconds") or 3600)
        deadline = time.monotonic() + timeout
        index = len(self._log)
        if since and since != "0":
            index = next((n for n, entry in enumerate(self._log) if entry[0] > int(since)), len(self._log))
        else:
            for obj in self._list(call, kind, res)["items"]:
                if matches(obj):
                    await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        if self._tick is None:
            self._tick = asyncio.Event()
        try:
            while time.monotonic() < deadline:
                tick = self._tick
                while index < len(self._log):
                    _, group, plural, etype, obj = self._log[index]
                    index += 1
                    if group == (res.group or "") and plural == res.plural and matches(obj):
                        await response.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                try:
                    await asyncio.wait_for(tick.wait(), timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        await response.write_eof()
        return response


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock 0.8's path parser fails on ``/api/v1/namespaces``; this one understands every resource URL."""
    parsed = _parse(path)
    if parsed is None:
        return parsing.ParsedPath()
    group, version, rest = parsed
    namespace = None
    if rest and rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    rest = rest + [None] * (2 - len(rest)) if len(rest) < 2 else rest  # type: ignore[list-item]
    return parsing.ParsedPath(group, version, rest[0], namespace, rest[1], "/".join(rest[2:]) or None)


parsing.parse_path = _parse_path  # kmock==0.8 internals: the request parser calls it through the module
