"""Splitwise's measured iteration times as model inputs, and the model's error on them.

Splitwise (``splitwise_perf_model.csv.gz``, see data/SOURCES.md) reports, per (model, GPU, TP,
prompt size P, batch B, generated tokens T), ``prompt_time``: one prefill iteration of B prompts of
P tokens, and ``token_time``: the mean decode iteration of B sequences while they generate T tokens.
As model inputs a prompt row is N = B·P, Σ(chunk·ctx) = B·P², ΣKV = 0, B prefill chunks, and a token
row is N = B, Σ(chunk·ctx) = 0, ΣKV = B·(P + T/2), no prefill chunk (the mean KV length over the
decode; the model is linear in ΣKV, so the mean iteration time is the time at the mean KV).
Repeated measurements are reduced to medians.
"""

from __future__ import annotations

import csv
import gzip
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo_core import data
from slo_core.perf.fit import ALL_COLUMNS, FloatArray, Points, ape
from slo_core.perf.model import PerfProfile

SPLITWISE_FILE = "splitwise_perf_model.csv.gz"
PHASES = ("prompt", "token")


@dataclass(frozen=True, slots=True)
class SplitwiseConfig:
    """One measured setting: prompt tokens, batch size, generated tokens; median times (ms)."""

    prompt_tokens: int
    batch: int
    generated_tokens: int
    prompt_time_ms: float
    token_time_ms: float


def splitwise_configs(model: str, hardware: str, tensor_parallel: int) -> list[SplitwiseConfig]:
    """The measured settings of one (model, hardware, TP), medians over repeats, sorted."""
    groups: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
    with gzip.open(data.path(SPLITWISE_FILE), "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            if (row["model"], row["hardware"], int(row["tensor_parallel"])) != (
                model,
                hardware,
                tensor_parallel,
            ):
                continue
            key = (int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"]))
            groups[key].append((float(row["prompt_time"]), float(row["token_time"])))
    if not groups:
        raise ValueError(f"no Splitwise rows for {model} on {hardware} TP{tensor_parallel}")
    out = []
    for (p, b, t), times in sorted(groups.items()):
        arr = np.asarray(times)
        out.append(SplitwiseConfig(p, b, t, float(np.median(arr[:, 0])), float(np.median(arr[:, 1]))))
    return out


def phase_points(configs: list[SplitwiseConfig], phase: str) -> Points:
    """Model inputs and measured times of the prompt or token iterations of ``configs``."""
    p = np.asarray([c.prompt_tokens for c in configs], dtype=np.float64)
    b = np.asarray([c.batch for c in configs], dtype=np.float64)
    t = np.asarray([c.generated_tokens for c in configs], dtype=np.float64)
    zero = np.zeros_like(p)
    if phase == "prompt":
        y = np.asarray([c.prompt_time_ms for c in configs], dtype=np.float64)
        return Points(b * p, b * p * p, zero, y, b)
    if phase == "token":
        y = np.asarray([c.token_time_ms for c in configs], dtype=np.float64)
        return Points(b, zero, b * (p + t / 2.0), y, zero)
    raise ValueError(f"unknown phase {phase!r}; choose one of {PHASES}")


def all_points(configs: list[SplitwiseConfig]) -> Points:
    """Prompt and token iterations together (prompt rows first)."""
    parts = [phase_points(configs, ph) for ph in PHASES]
    return Points(
        np.concatenate([q.n_tokens for q in parts]),
        np.concatenate([q.chunk_ctx for q in parts]),
        np.concatenate([q.kv_tokens for q in parts]),
        np.concatenate([q.time_ms for q in parts]),
        np.concatenate([q.prefills for q in parts]),
    )


# How the shipped 70B profiles are fitted: every term, least relative absolute error (least MAPE)
SPLITWISE_FIT: dict[str, Any] = {"use": ALL_COLUMNS, "loss": "l1"}


def profile_predict_ms(profile: PerfProfile, pts: Points) -> FloatArray:
    """The profile's iteration time (ms) at each point."""
    return np.asarray(
        [
            1000.0 * profile.iteration_time_from_sums_s(int(n), float(s), float(k), int(q))
            for n, s, k, q in zip(pts.n_tokens, pts.chunk_ctx, pts.kv_tokens, pts.prefills, strict=True)
        ],
        dtype=np.float64,
    )


def profile_mape(profile: PerfProfile, configs: list[SplitwiseConfig]) -> dict[str, float]:
    """MAPE (%) of ``profile`` on the prompt iterations, the token iterations, and both."""
    errors = {
        ph: ape(profile_predict_ms(profile, phase_points(configs, ph)), phase_points(configs, ph).time_ms)
        for ph in PHASES
    }
    errors["all"] = np.concatenate([errors[ph] for ph in PHASES])
    return {k: float(np.mean(v)) for k, v in errors.items()}
