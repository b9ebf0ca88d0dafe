"""Object semantics the API server applies on every write: identity, status subresource, generation,
name rules, CRD and custom-resource validation. Pure functions over dicts, used by the emulator.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from kube import schemas

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


@dataclass
class ApiError(Exception):
    """An API error answered as a ``Status`` object."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


@dataclass
class Kind:
    """What the server knows about the resource a request addresses."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: set[str]
    crd: schemas.CrdVersion | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def tracks_generation(self) -> bool:
        return self.crd is not None or "status" in self.subresources


def invalid(kind: Kind, name: str, violations: list[schemas.Violation]) -> ApiError:
    text = ", ".join(f"{v.path}: {v.message}" for v in violations)
    causes = [{"reason": v.reason, "message": v.message, "field": v.path} for v in violations]
    return ApiError(
        422,
        "Invalid",
        f'{kind.kind}.{kind.group or "core"} "{name}" is invalid: {text}',
        {"name": name, "group": kind.group, "kind": kind.kind, "causes": causes},
    )


def _check_name(kind: Kind, name: str) -> None:
    rule = _DNS_LABEL_1035 if kind.plural in ("services", "namespaces") else _DNS_SUBDOMAIN
    limit = 63 if kind.plural in ("services", "namespaces") else 253
    if not rule.match(name) or len(name) > limit:
        what = "DNS-1035 label" if limit == 63 else "DNS-1123 subdomain"
        raise invalid(
            kind, name, [schemas.Violation("metadata.name", "FieldValueInvalid", f"must be a {what}")]
        )


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def admit(
    kind: Kind,
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    subresource: str | None,
    strict: bool,
    warnings: list[str],
) -> dict[str, Any]:
    """The object to store for a write of ``new`` over ``old`` (``None`` on create). Raises ApiError."""
    new = copy.deepcopy(new)
    if subresource == "status" and old is not None:
        status = new.get("status")
        new = copy.deepcopy(old)
        if status is None:
            new.pop("status", None)
        else:
            new["status"] = status
    meta = new.setdefault("metadata", {})
    new["apiVersion"], new["kind"] = kind.api_version, kind.kind
    if old is not None:
        for key in ("name", "namespace", *_SERVER_META):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        if "status" in kind.subresources and subresource != "status":
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
    else:
        for key in _SERVER_META:
            meta.pop(key, None)
        if "status" in kind.subresources:
            new.pop("status", None)
    if not kind.namespaced:
        meta.pop("namespace", None)
    _check_name(kind, meta.get("name", ""))
    if kind.crd is not None:
        _admit_custom(kind, old, new, strict=strict, warnings=warnings)
    elif strict:
        problems = schemas.builtin_violations(new)
        if problems:
            raise ApiError(400, "BadRequest", f"strict decoding error: {'; '.join(problems)}")
    for ref in meta.get("ownerReferences") or []:
        missing = [k for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
        if missing:
            violation = schemas.Violation(
                "metadata.ownerReferences", "FieldValueRequired", f"{missing} required"
            )
            raise invalid(kind, meta["name"], [violation])
    if kind.tracks_generation:
        if old is None:
            meta["generation"] = 1
        elif _spec_part(old) != _spec_part(new):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
    return new


def _admit_custom(
    kind: Kind, old: dict[str, Any] | None, new: dict[str, Any], *, strict: bool, warnings: list[str]
) -> None:
    assert kind.crd is not None
    schema = kind.crd.schema
    unknown = schemas.unknown_fields(new, schema)
    if unknown and strict:
        fields = ", ".join(f'unknown field "{p}"' for p in unknown)
        raise ApiError(400, "BadRequest", f"strict decoding error: {fields}")
    if unknown:
        warnings += [f'unknown field "{p}"' for p in unknown]
        schemas.prune(new, unknown)
    schemas.apply_defaults(new, schema)
    name = new["metadata"].get("name", "")
    violations = schemas.schema_violations(new, schema)
    if violations:
        raise invalid(kind, name, violations)
    violations = schemas.cel_violations(
        {k: v for k, v in new.items() if k != "metadata"},
        schema,
        {k: v for k, v in old.items() if k != "metadata"} if old is not None else None,
    )
    if violations:
        raise invalid(kind, name, violations)
