"""Readable validation errors: pydantic's error list as ``path: what is wrong and what to change`` lines."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import ValidationError

# A validator message may start with the field it is about ("tbtS: a latency tier needs tbtS ..."):
# that field joins the path so every message names the exact key to edit.
_FIELD_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_]*): (.+)$", re.DOTALL)
_SCALARS = (str, int, float, bool)


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    """``("spec", "tiers", 2, "tbtS")`` as ``spec.tiers[2].tbtS``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(document)"


def _message(kind: str, msg: str, value: object) -> str:
    if kind == "missing":
        return "required field is missing; add it"
    if kind == "extra_forbidden":
        return "unknown field; remove it or fix its spelling (keys are camelCase, e.g. ttftS, priorityClass)"
    if kind.startswith("value_error") or kind == "assertion_error":
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if isinstance(value, _SCALARS):
        shown = value[:77] + "..." if isinstance(value, str) and len(value) > 80 else value
        return f"{msg[0].lower()}{msg[1:]} (got {shown!r})"
    return f"{msg[0].lower()}{msg[1:]}"


def validation_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per error, naming the field path (YAML keys) and what to change."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if isinstance(p, int) or not _is_internal_tag(p)]
        text = _message(err["type"], err["msg"], err.get("input"))
        m = _FIELD_PREFIX.match(text)
        if m and err["type"].startswith("value_error"):
            loc.append(m.group(1))
            text = m.group(2)
        line = f"{field_path(loc, prefix)}: {text}"
        if line not in lines:
            lines.append(line)
    return lines


def _is_internal_tag(part: str) -> bool:
    """pydantic adds union member and validator tags (``int``, ``function-after[...]``) to locations."""
    return part in ("int", "str", "float", "bool") or "[" in part
