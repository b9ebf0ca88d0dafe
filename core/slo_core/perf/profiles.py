"""Shipped performance profiles: ``load_profile(name_or_path)`` and ``list_profiles()``.

Each profile is one JSON file under ``slo_core/data/profiles`` written by ``bench/fit_perf.py``: the
:class:`~slo_core.perf.model.PerfProfile` fields at the top level and a ``provenance`` object (source
files, method, fitting residuals, how the KV-cache capacity was derived) that loading ignores.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from slo_core.data import DATA_DIR
from slo_core.perf.model import PerfProfile

PROFILES_DIR = DATA_DIR / "profiles"
_FIELDS = tuple(f.name for f in fields(PerfProfile))
_REQUIRED = tuple(f for f in _FIELDS if f not in ("source", "s_ms_per_prefill"))


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted (e.g. ``h100-llama3-8b-tp1``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def profile_document(name_or_path: str | Path) -> dict[str, Any]:
    """The whole JSON document of a shipped profile name or a path to a profile file."""
    path = _resolve(name_or_path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"profile file {path} must hold a JSON object")
    return doc


def load_profile(name_or_path: str | Path) -> PerfProfile:
    """A shipped profile by name, or a profile JSON file by path.

    Aliases such as ``h100/llama-3-8b`` resolve to the shipped name (:func:`canonical_name`). Raises
    ValueError naming the valid profiles when ``name_or_path`` is none of these, and when the file
    lacks a field; FileNotFoundError when a ``.json`` path names no file.
    """
    doc = profile_document(name_or_path)
    missing = [f for f in _REQUIRED if f not in doc]
    if missing:
        raise ValueError(f"profile {str(name_or_path)!r} lacks field(s) {', '.join(missing)}")
    values = {f: doc[f] for f in _FIELDS if f in doc}
    for f in ("tensor_parallel", "kv_cache_tokens", "max_model_len"):
        values[f] = int(values[f])
    values.setdefault("s_ms_per_prefill", 0.0)
    for f in (
        "t_c_ms",
        "floor_ms",
        "a_ms_per_token",
        "b_ms_per_token_ctx",
        "d_ms_per_kv_token",
        "s_ms_per_prefill",
    ):
        values[f] = float(values[f])
        if values[f] < 0:
            raise ValueError(f"profile {str(name_or_path)!r}: {f} must be non-negative, got {values[f]}")
    return PerfProfile(**values)


def canonical_name(alias: str) -> str:
    """``h100/llama-3-8b`` or ``H100-Llama-3-8B-TP1`` → ``h100-llama3-8b-tp1`` (TP1 unless stated)."""
    name = re.sub(r"[/_\s]+", "-", alias.strip().lower())
    name = re.sub(r"llama-(\d)", r"llama\1", name)
    if not re.search(r"-tp\d+$", name):
        name += "-tp1"
    return name


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    as_path = Path(text).expanduser()
    if as_path.is_file():
        return as_path
    for candidate in (text, canonical_name(text)):
        shipped = PROFILES_DIR / f"{candidate}.json"
        if shipped.is_file():
            return shipped
    if isinstance(name_or_path, Path) or text.endswith(".json"):
        raise FileNotFoundError(f"no profile file at {as_path}")
    raise ValueError(f"unknown performance profile {text!r}; valid names: {', '.join(list_profiles())}")


def model_family(model: str) -> str | None:
    """``meta-llama/Llama-3.1-8B-Instruct`` → ``llama3-8b`` (family, major version and size), else None."""
    m = re.search(r"llama[-_ ]?(\d)(?:\.\d+)?[-_ ](?:[a-z]+[-_ ])?(\d+)b", model.lower())
    return f"llama{m.group(1)}-{m.group(2)}b" if m else None


def gpu_family(gpu_type: str) -> str:
    """``H100-80GB`` / ``NVIDIA-H100-80GB-HBM3`` → ``h100`` (the first a/h/b/l + digits token)."""
    m = re.search(r"(?<![a-z0-9])([a-z]\d{2,3})(?![0-9])", gpu_type.lower())
    return m.group(1) if m else gpu_type.lower()


def choose_profile(gpu_type: str, model: str, tensor_parallel: int) -> tuple[str | None, str]:
    """The shipped profile matching a GPU type, a model id and a tensor-parallel size, and why.

    ``(name, reason)``; ``name`` is None when no shipped profile was fitted on that GPU, model family and
    TP size (a profile fitted on other hardware would misstate every latency, so none is guessed).
    """
    family = model_family(model)
    gpu = gpu_family(gpu_type)
    if family is None:
        return None, f"no shipped profile: the model {model!r} is not one the profiles were fitted on"
    name = f"{gpu}-{family}-tp{tensor_parallel}"
    if name in list_profiles():
        return name, f"chosen from gpu {gpu_type!r}, model {model!r}, tensor parallel {tensor_parallel}"
    return None, f"no shipped profile {name!r} (shipped: {', '.join(list_profiles())})"
