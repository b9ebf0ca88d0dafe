"""pydantic JSON Schema → Kubernetes structural OpenAPI v3 schema.

Kubernetes accepts only a subset of JSON Schema in a CRD: no ``$ref``, no ``anyOf`` with ``null`` (an
optional field is simply not required), ``exclusiveMinimum`` as a boolean next to ``minimum``, no
``additionalProperties: false`` next to ``properties`` (unknown fields are pruned or rejected by the
API server), free-form objects marked ``x-kubernetes-preserve-unknown-fields``, and int-or-string as
``x-kubernetes-int-or-string``. Descriptions, defaults, enums, bounds and CEL rules are kept.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_DROP = {"title", "$defs"}
_SCALAR_TYPES = ({"type": "integer"}, {"type": "string"})


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a ``$ref`` (the referencing node's own keys, e.g. its description, win)."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target = defs[ref.removeprefix("#/$defs/")]
    merged = {**_resolve(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}
    return merged


def _collapse_any_of(node: Schema, defs: dict[str, Schema]) -> Schema:
    """``X | None`` becomes X; ``int | str`` becomes Kubernetes int-or-string."""
    options = [_resolve(o, defs) for o in node["anyOf"] if o.get("type") != "null"]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if rest.get("default", 0) is None:
        del rest["default"]
    if len(options) == 1:
        return {**options[0], **rest}
    types = sorted(o.get("type", "") for o in options)
    if types == ["integer", "string"] and all(len(o) == 1 for o in options):
        return {"x-kubernetes-int-or-string": True, "anyOf": [dict(t) for t in _SCALAR_TYPES], **rest}
    raise ValueError(f"cannot express this union in a structural schema: {node}")


def structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    """One schema node, rewritten for Kubernetes (recursively)."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        node = _collapse_any_of(node, defs)
        if "x-kubernetes-int-or-string" in node:
            return {k: v for k, v in node.items() if k not in _DROP}
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = structural(value, defs)
            # False: Kubernetes forbids it next to properties; the API server rejects unknown fields.
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return _ordered(out)


# A stable, readable key order for the generated YAML.
_ORDER = [
    "description",
    "type",
    "enum",
    "default",
    "format",
    "pattern",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "required",
    "properties",
    "items",
    "additionalProperties",
]


def _ordered(node: Schema) -> Schema:
    rank = {k: i for i, k in enumerate(_ORDER)}
    return dict(sorted(node.items(), key=lambda kv: (rank.get(kv[0], len(_ORDER)), kv[0])))


def openapi_schema(json_schema: Schema) -> Schema:
    """A whole pydantic ``model_json_schema(by_alias=True)`` as a structural schema."""
    return structural(json_schema, json_schema.get("$defs", {}))
