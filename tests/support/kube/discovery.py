"""Discovery and OpenAPI documents of the emulated API server, built from the served resources.

The OpenAPI v3 documents are minimal: one PATCH operation per kind that declares ``fieldValidation``,
which is what kubectl reads to decide that the server validates fields itself (server-side strict
validation, done by the emulator with the CRD schemas and kubernetes-validate).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kmock

K8S_SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}

Resources = Iterable[tuple[kmock.resource, kmock.ResourceInfo]]

_SUB_VERBS = {"status": ["get", "patch", "update"], "scale": ["get", "patch", "update"]}


def group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def api_versions() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def _versions(resources: Resources) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for res, _ in resources:
        if res.group and res.version and res.version not in groups.setdefault(res.group, []):
            groups[res.group].append(res.version)
    return groups


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in sorted(versions)]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(resources: Resources) -> dict[str, Any]:
    groups = _versions(resources)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(g, vs) for g, vs in sorted(groups.items())],
    }


def api_group(resources: Resources, group: str) -> dict[str, Any] | None:
    versions = _versions(resources).get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}


def api_resource_list(resources: Resources, group: str, version: str) -> dict[str, Any] | None:
    entries: list[dict[str, Any]] = []
    for res, info in resources:
        if res.group != group or res.version != version or not res.plural:
            continue
        base = {
            "name": res.plural,
            "singularName": info.singular or res.plural,
            "namespaced": bool(info.namespaced),
            "kind": info.kind or res.plural.capitalize(),
            "verbs": sorted(info.verbs) or ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        if info.shortnames:
            base["shortNames"] = sorted(info.shortnames)
        if info.categories:
            base["categories"] = sorted(info.categories)
        entries.append(base)
        for sub in sorted(info.subresources):
            entries.append(
                {
                    "name": f"{res.plural}/{sub}",
                    "singularName": "",
                    "namespaced": bool(info.namespaced),
                    "kind": base["kind"],
                    "verbs": _SUB_VERBS.get(sub, ["get", "create"]),
                }
            )
    if not entries and group:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": sorted(entries, key=lambda e: e["name"]),
    }


def openapi_root(resources: Resources) -> dict[str, Any]:
    paths = {}
    for gv in sorted({("api/v1" if not r.group else f"apis/{r.group}/{r.version}") for r, _ in resources}):
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash=emulated"}
    return {"paths": paths}


def openapi_group_version(resources: Resources, group: str, version: str) -> dict[str, Any]:
    prefix = f"/apis/{group}/{version}" if group else "/api/v1"
    paths: dict[str, Any] = {}
    for res, info in resources:
        if res.group != group or res.version != version or not res.plural:
            continue
        scope = "/namespaces/{namespace}" if info.namespaced else ""
        gvk = {"group": group, "version": version, "kind": info.kind or res.plural.capitalize()}
        param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        operation = {
            "operationId": f"patch{gvk['kind']}",
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": [param],
            "responses": {"200": {"description": "OK"}},
        }
        paths[f"{prefix}{scope}/{res.plural}/{{name}}"] = {"patch": operation}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (emulated)", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }
