"""RBAC as the real API server would apply it, for the emulator's audit log (which does not enforce it).

``denied`` lists every recorded request that a set of PolicyRules would refuse; ``unused`` lists the
granted (group, resource, verb) triples no request needed, so a role can be held to least privilege.
A server-side apply that created its object (201) needs ``create`` as well as ``patch``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kube.emulator import AuditRecord


def needed(record: AuditRecord) -> list[tuple[str, str, str]]:
    """The (apiGroup, resource[/subresource], verb) permissions one request needs."""
    resource = f"{record.resource}/{record.subresource}" if record.subresource else record.resource
    verbs = [record.verb]
    if record.verb == "patch" and record.code == 201:
        verbs.append("create")
    out = [(record.group, resource, verb) for verb in verbs]
    # OwnerReferencesPermission (OpenShift, hardened clusters): blockOwnerDeletion needs update on the
    # owner's finalizers subresource.
    for api_version, kind in record.blocked_owners:
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        out.append((group, f"{OWNER_PLURALS.get(kind, kind.lower() + 's')}/finalizers", "update"))
    return out


OWNER_PLURALS = {"ModelDeployment": "modeldeployments"}


def granted(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, resource, verb))
    return out


def wildcards(rules: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rules that use ``*`` anywhere (least privilege forbids them)."""
    return [r for r in rules if any("*" in r.get(k, []) for k in ("apiGroups", "resources", "verbs"))]


def denied(records: Iterable[AuditRecord], rules: Iterable[dict[str, Any]]) -> list[tuple[str, str, str]]:
    allowed = granted(rules)
    missing: list[tuple[str, str, str]] = []
    for record in records:
        for need in needed(record):
            if need not in allowed and need not in missing:
                missing.append(need)
    return missing


def unused(records: Iterable[AuditRecord], rules: Iterable[dict[str, Any]]) -> list[tuple[str, str, str]]:
    used = {need for record in records for need in needed(record)}
    return sorted(granted(rules) - used)


def denied_in_scope(
    records: Iterable[AuditRecord],
    cluster_rules: Iterable[dict[str, Any]],
    roles: dict[str, list[dict[str, Any]]],
) -> list[tuple[str | None, str, str, str]]:
    """Like :func:`denied`, where a namespaced request may also be allowed by a Role in its namespace
    (``roles`` maps namespace to rules); cluster-scoped requests need the ClusterRole."""
    cluster = granted(cluster_rules)
    local = {ns: granted(rules) for ns, rules in roles.items()}
    missing: list[tuple[str | None, str, str, str]] = []
    for record in records:
        for need in needed(record):
            allowed = need in cluster or need in local.get(record.namespace or "", set())
            if not allowed and (record.namespace, *need) not in missing:
                missing.append((record.namespace, *need))
    return missing
