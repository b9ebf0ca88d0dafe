"""What the emulated API server does with schemas: CRD structural schemas (defaulting, unknown-field
pruning, OpenAPI validation, CEL ``x-kubernetes-validations``) and strict validation of built-in kinds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jsonschema

K8S_VERSION = "1.32.0"


@dataclass
class Violation:
    """One rejected field: a dotted path, the reason (``FieldValueRequired``...) and a message."""

    path: str
    reason: str
    message: str


@dataclass
class CrdVersion:
    """A served version of a custom resource: its names, scope, schema and printer columns."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    short_names: list[str]
    categories: list[str]
    subresources: dict[str, Any]
    schema: dict[str, Any]
    printer_columns: list[dict[str, Any]] = field(default_factory=list)


def crd_versions(crd: dict[str, Any]) -> list[CrdVersion]:
    """The served versions a CustomResourceDefinition declares."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    result = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        result.append(
            CrdVersion(
                group=spec["group"],
                version=ver["name"],
                plural=names["plural"],
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=list(names.get("shortNames", [])),
                categories=list(names.get("categories", [])),
                subresources=dict(ver.get("subresources") or {}),
                schema=(ver.get("schema") or {}).get("openAPIV3Schema") or {"type": "object"},
                printer_columns=list(ver.get("additionalPrinterColumns") or []),
            )
        )
    return result


def established_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    """The status a real API server gives an accepted CRD (clients wait for ``Established``)."""
    conds = [
        {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
        for t, r, m in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    spec = crd.get("spec", {})
    stored = [v["name"] for v in spec.get("versions", []) if v.get("storage")]
    return {"acceptedNames": spec.get("names", {}), "conditions": conds, "storedVersions": stored}


# ---------------------------------------------------------------------------------------- defaulting


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Fill in ``default`` values of absent properties, recursively (the API server's defaulting)."""
    if isinstance(obj, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in list(obj):
                obj[key] = apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    """Paths of fields a structural schema does not declare (the server prunes or, if strict, rejects)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-embedded-resource"):
        return []
    found: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if root and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                found += unknown_fields(value, props[key], _join(path, key), root=False)
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, _join(path, key), root=False)
            elif props is not None or extra is False:
                found.append(_join(path, key))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for n, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], _join(path, n), root=False)
    return found


def prune(obj: Any, paths: list[str]) -> None:
    """Remove the given unknown-field paths (as returned by :func:`unknown_fields`) from ``obj``."""
    for path in paths:
        parts: list[str | int] = []
        for seg in path.replace("]", "").split("."):
            head, *idx = seg.split("[")
            parts.append(head)
            parts += [int(i) for i in idx]
        target = obj
        for part in parts[:-1]:
            target = target[part]
        del target[parts[-1]]


# ---------------------------------------------------------------------------------------- validation


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema (nullable, int-or-string)."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        out.pop("additionalProperties", None)
    # OpenAPI 3.0 states exclusive bounds as booleans beside minimum/maximum; Draft 7 as the bound itself.
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(flag), bool) and out.pop(flag) and bound in out:
            out[flag] = out.pop(bound)
    return out


def schema_violations(obj: dict[str, Any], schema: dict[str, Any]) -> list[Violation]:
    """OpenAPI validation of a custom resource (metadata excluded), as ``Violation`` records."""
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    js = _to_jsonschema(schema)
    for meta in ("apiVersion", "kind", "metadata"):
        js.get("properties", {}).pop(meta, None)
    validator = jsonschema.Draft7Validator(js)
    result = []
    for err in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path)):
        path = ""
        for part in err.absolute_path:
            path = _join(path, part)
        if err.validator == "required":
            missing = err.message.split("'")[1]
            result.append(Violation(_join(path, missing), "FieldValueRequired", "Required value"))
        elif err.validator == "enum":
            allowed = ", ".join(f'"{v}"' for v in err.validator_value)
            result.append(
                Violation(
                    path,
                    "FieldValueNotSupported",
                    f"Unsupported value: {err.instance!r}: supported values: {allowed}",
                )
            )
        else:
            result.append(
                Violation(path, "FieldValueInvalid", f"Invalid value: {err.instance!r}: {err.message}")
            )
    return result


@lru_cache(maxsize=256)
def _cel_program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_true(rule: str, value: Any, old: Any) -> bool:
    import celpy

    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    result = _cel_program(rule).evaluate(activation)
    if isinstance(result, Exception):  # CEL evaluation errors come back as values
        raise result
    return bool(result)


def cel_violations(obj: Any, schema: dict[str, Any], old: Any = None, path: str = "") -> list[Violation]:
    """Evaluate every ``x-kubernetes-validations`` rule on the values present (transition rules on update)."""
    result: list[Violation] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        expr = rule["rule"]
        if "oldSelf" in expr and old is None:
            continue
        try:
            ok = _cel_true(expr, obj, old)
            message = rule.get("message") or f"failed rule: {expr}"
        except Exception as exc:  # the real server reports evaluation errors as invalid too
            ok, message = False, f"rule evaluation error: {exc}"
        if not ok:
            where = _join(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else path
            result.append(Violation(where or "<root>", rule.get("reason") or "FieldValueInvalid", message))
    if isinstance(obj, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in obj and not (path == "" and name == "metadata"):
                sub_old = old.get(name) if isinstance(old, dict) else None
                result += cel_violations(obj[name], sub, sub_old, _join(path, name))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                result += cel_violations(value, extra, None, _join(path, key))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for n, item in enumerate(obj):
            result += cel_violations(item, schema["items"], None, _join(path, n))
    return result


def builtin_violations(obj: dict[str, Any]) -> list[str]:
    """Strict validation of a built-in kind with ``kubernetes-validate``; unknown kinds pass."""
    import kubernetes_validate

    body = copy.deepcopy(obj)
    body.get("metadata", {}).pop("managedFields", None)
    try:
        kubernetes_validate.validate(body, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return []
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{path}: {exc.message}" if path else exc.message]
    return []
