"""Server-side ``Table`` rendering, as ``kubectl get`` asks for it: the CRD's additionalPrinterColumns
(simple JSONPath: dotted fields, ``[n]`` and ``[?(@.key=="value")]``), or Name and Age for built-ins.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from kube.admission import Kind

_FILTER = re.compile(r'^\?\(@\.([\w.]+)\s*==\s*["\']([^"\']*)["\']\)$')
_TOKEN = re.compile(r"\.([\w-]+)|\[([^\]]+)\]")


def jsonpath(obj: Any, path: str) -> Any:
    """Evaluate the JSONPath subset that printer columns use; ``None`` when absent."""
    current = [obj]
    for m in _TOKEN.finditer(path.strip().removeprefix("$")):
        field, index = m.group(1), m.group(2)
        nxt: list[Any] = []
        for item in current:
            if field is not None and isinstance(item, dict) and field in item:
                nxt.append(item[field])
            elif index is not None and isinstance(item, list):
                if index.isdigit():
                    nxt += item[int(index) : int(index) + 1]
                elif f := _FILTER.match(index):
                    nxt += [
                        e
                        for e in item
                        if isinstance(e, dict) and str(jsonpath(e, "." + f.group(1))) == f.group(2)
                    ]
        current = nxt
    return current[0] if current else None


def _columns(kind: Kind) -> list[dict[str, Any]]:
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    printer = kind.crd.printer_columns if kind.crd is not None else []
    for col in printer:
        cols.append(
            {
                "name": col["name"],
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "description": col.get("description", ""),
                "priority": col.get("priority", 0),
            }
        )
    if not any(c.get("jsonPath") == ".metadata.creationTimestamp" for c in printer):
        cols.append({"name": "Age", "type": "date", "format": "", "description": "Age", "priority": 0})
    return cols


def age(timestamp: Any) -> Any:
    """A timestamp as the short age string the real server puts in date cells (``5s``, ``3m``, ``2h``)."""
    if not isinstance(timestamp, str):
        return timestamp
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    seconds = max(0, int((datetime.datetime.now(tz=datetime.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cells(kind: Kind, obj: dict[str, Any]) -> list[Any]:
    cells: list[Any] = [obj["metadata"]["name"]]
    printer = kind.crd.printer_columns if kind.crd is not None else []
    for col in printer:
        value = jsonpath(obj, col["jsonPath"])
        cells.append(age(value) if col.get("type") == "date" else value)
    if not any(c.get("jsonPath") == ".metadata.creationTimestamp" for c in printer):
        cells.append(age(obj["metadata"].get("creationTimestamp")))
    return cells


def table(kind: Kind, body: dict[str, Any], *, include_object: bool) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table for one object or a list."""
    items = body.get("items", [body])
    rows = []
    for obj in items:
        if include_object:
            embedded = obj
        else:
            embedded = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append({"cells": _cells(kind, obj), "object": embedded})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": body.get("metadata", {}).get("resourceVersion", "")},
        "columnDefinitions": _columns(kind),
        "rows": rows,
    }
