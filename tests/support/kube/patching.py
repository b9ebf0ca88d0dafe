"""Patch semantics of the Kubernetes API for the emulator: merge, JSON, strategic-merge, server-side apply.

Approximations that are faithful for what kubectl, Helm, kopf and the operator send: lists of maps are
merged by a small table of merge keys (the real server reads them from its OpenAPI schema).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

# Field name -> the merge keys of its list items (strategic merge and server-side apply list-maps).
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
}
# Lists of scalars merged as sets by strategic merge patch.
SET_LISTS = {"finalizers"}


class PatchError(ValueError):
    """A patch that cannot be applied (bad document, failed ``test`` op, missing path)."""


def _merge_keys(field: str, items: list[Any]) -> tuple[str, ...] | None:
    if field == "ports":  # container ports merge by containerPort, service ports by port
        sample = next((i for i in items if isinstance(i, dict)), {})
        return ("containerPort",) if "containerPort" in sample else ("port",)
    return MERGE_KEYS.get(field)


def _key_of(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(item, dict):
        return None
    return tuple(item.get(k) for k in keys)


# ---------------------------------------------------------------------------------------------- merge


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ----------------------------------------------------------------------------------------- JSON patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return doc


def _json_get(doc: Any, path: str) -> Any:
    return _walk(doc, _pointer(path))


def _json_set(doc: Any, path: str, value: Any, *, insert: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif insert:
            parent.insert(int(last), value)
        else:
            parent[int(last)] = value
    elif isinstance(parent, dict):
        if not insert and last not in parent:
            raise PatchError(f"path {path} does not exist")
        parent[last] = value
    else:
        raise PatchError(f"path {path} has no container")
    return doc


def _json_remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _walk(doc, parts[:-1])
    try:
        if isinstance(parent, list):
            return parent.pop(int(parts[-1]))
        return parent.pop(parts[-1])
    except (KeyError, IndexError, ValueError) as exc:
        raise PatchError(f"path {path} does not exist") from exc


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(target)
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "add":
            doc = _json_set(doc, path, copy.deepcopy(op.get("value")), insert=True)
        elif kind == "replace":
            doc = _json_set(doc, path, copy.deepcopy(op.get("value")), insert=False)
        elif kind == "remove":
            _json_remove(doc, path)
        elif kind == "move":
            value = _json_remove(doc, op["from"])
            doc = _json_set(doc, path, value, insert=True)
        elif kind == "copy":
            doc = _json_set(doc, path, copy.deepcopy(_json_get(doc, op["from"])), insert=True)
        elif kind == "test":
            if _json_get(doc, path) != op.get("value"):
                raise PatchError(f"test operation failed at {path}")
        else:
            raise PatchError(f"unknown JSON patch op {kind!r}")
    return doc


# ------------------------------------------------------------------------------------ strategic merge

_DIRECTIVE = re.compile(r"^\$(setElementOrder|deleteFromPrimitiveList|retainKeys)(/.*)?$")


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge patch: like merge patch, but lists of maps merge by key and honour ``$patch``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        match = _DIRECTIVE.match(key)
        if key == "$patch" or (match and match.group(1) != "deleteFromPrimitiveList"):
            continue
        if match:  # $deleteFromPrimitiveList/<field>
            name = (match.group(2) or "/")[1:]
            result[name] = [v for v in result.get(name, []) if v not in value]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _strategic_list(result.get(key), value, key)
        else:
            result[key] = strategic_merge(result.get(key), value, key)
    return result


def _strategic_list(current: Any, patch: list[Any], field: str) -> list[Any]:
    current = list(current) if isinstance(current, list) else []
    if field in SET_LISTS:
        return current + [v for v in patch if v not in current]
    keys = _merge_keys(field, patch)
    if keys is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    merged = list(current)
    for item in patch:
        key = _key_of(item, keys)
        idx = next((n for n, c in enumerate(merged) if _key_of(c, keys) == key), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                merged.pop(idx)
        elif idx is None:
            merged.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            merged[idx] = strategic_merge(merged[idx], item, field)
    return merged


# ---------------------------------------------------------------------------------- server-side apply


def _remove_dropped(base: Any, old: Any, new: Any, field: str = "") -> Any:
    """Remove from ``base`` what a manager applied before (``old``) but no longer applies (``new``)."""
    if isinstance(base, dict) and isinstance(old, dict):
        new = new if isinstance(new, dict) else {}
        result = dict(base)
        for key, old_value in old.items():
            if key not in new:
                result.pop(key, None)
            elif key in result:
                result[key] = _remove_dropped(result[key], old_value, new[key], key)
        return result
    if isinstance(base, list) and isinstance(old, list):
        keys = _merge_keys(field, old)
        if keys is None or not isinstance(new, list):
            return base
        new_keys = {_key_of(i, keys) for i in new}
        old_keys = {_key_of(i, keys) for i in old}
        return [i for i in base if _key_of(i, keys) in new_keys or _key_of(i, keys) not in old_keys]
    return base


def _apply_merge(base: Any, applied: Any, field: str = "") -> Any:
    if isinstance(applied, dict):
        result = dict(base) if isinstance(base, dict) else {}
        for key, value in applied.items():
            result[key] = _apply_merge(result.get(key), value, key)
        return result
    if isinstance(applied, list):
        keys = _merge_keys(field, applied)
        if keys is None or not isinstance(base, list) or not all(isinstance(i, dict) for i in applied):
            return copy.deepcopy(applied)
        merged = list(base)
        for item in applied:
            idx = next((n for n, c in enumerate(merged) if _key_of(c, keys) == _key_of(item, keys)), None)
            if idx is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[idx] = _apply_merge(merged[idx], item, field)
        return merged
    return copy.deepcopy(applied)


def server_side_apply(
    current: dict[str, Any] | None, applied: dict[str, Any], previous: Any
) -> dict[str, Any]:
    """Apply a manager's full intent: drop what it no longer sets, merge what it sets now."""
    base = copy.deepcopy(current) if current is not None else {}
    if previous is not None:
        base = _remove_dropped(base, previous, applied)
    return _apply_merge(base, applied)


# ---------------------------------------------------------------------------------------- selectors

_SET_EXPR = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate over a label map from a label selector string (equality- and set-based)."""
    tests: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_selector(selector or ""):
        if m := _SET_EXPR.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                tests.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                tests.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            tests.append(lambda lb, k=absent: k not in lb)
        else:
            tests.append(lambda lb, k=term: k in lb)
    return lambda labels: all(t(labels) for t in tests)


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """A predicate over an object from a field selector (``a.b=v``, ``a.b!=v``, comma-joined)."""
    tests: list[Callable[[dict[str, Any]], bool]] = []

    def lookup(obj: Any, path: str) -> str:
        for part in path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else None
        return "" if obj is None else str(obj)

    for term in _split_selector(selector or ""):
        negate = "!=" in term
        path, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        tests.append(lambda o, p=path, v=value, n=negate: (lookup(o, p) == v) != n)
    return lambda obj: all(t(obj) for t in tests)
