"""Coverage and tightness of output-length bounds, against the mean-length and max_tokens baselines.

For each stage (at submission, then after g = 50, 200, 500 generated tokens, over the requests that
are still running, i.e. true length > g): coverage = share of true lengths ≤ bound, and the median
and p90 of bound / true. True lengths are capped at the request's max_tokens (what it could emit).
``qrf_text_free`` gives the forest only token counts (the simulator's case). Baselines:
``mean_length`` = the training mean, relaxed to g + N once generation passes it (what the
``gmax-no-analyzer`` ablation does); ``max_tokens`` = the cap itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from slo_core.predict.estimator import BoundQuery, OutputBoundEstimator
from slo_core.predict.training import LengthRow

CHECKPOINTS_TOKENS: tuple[int, ...] = (50, 200, 500)
_CHUNK = 256


def _stage(bound: np.ndarray, true: np.ndarray) -> dict[str, float | int]:
    if len(true) == 0:
        return {"n": 0, "coverage": float("nan"), "median_ratio": float("nan"), "p90_ratio": float("nan")}
    ratio = bound / true
    return {
        "n": len(true),
        "coverage": round(float((true <= bound).mean()), 4),
        "median_ratio": round(float(np.median(ratio)), 3),
        "p90_ratio": round(float(np.percentile(ratio, 90)), 3),
    }


def _bounds(est: OutputBoundEstimator, queries: list[BoundQuery]) -> np.ndarray:
    out: list[int] = []
    for i in range(0, len(queries), _CHUNK):
        out += est.bounds(queries[i : i + _CHUNK])
    return np.asarray(out, dtype=np.float64)


def latency_ms_per_request(
    est: OutputBoundEstimator, queries: Sequence[BoundQuery], batch: int, repeats: int
) -> float:
    """Mean wall time per request of ``est.bounds`` in batches of ``batch`` over the same first 64
    queries for every batch size (median over ``repeats`` passes), in milliseconds."""
    sample = list(queries[:64])
    passes: list[float] = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for i in range(0, len(sample), batch):
            est.bounds(sample[i : i + batch])
        passes.append((time.perf_counter() - t0) / len(sample))
    return round(float(np.median(passes)) * 1e3, 4)


def _qrf_stages(
    est: OutputBoundEstimator, queries: list[BoundQuery], true: np.ndarray
) -> dict[str, dict[str, float | int]]:
    """Submission bounds, then refinements at each checkpoint for the requests still running."""
    b0 = _bounds(est, queries)
    out = {"submission": _stage(b0, true)}
    for g in CHECKPOINTS_TOKENS:
        alive = np.flatnonzero(true > g)
        refined = [
            dataclasses.replace(queries[i], generated_tokens=g, bound_at_start=int(b0[i])) for i in alive
        ]
        out[f"after_{g}"] = _stage(_bounds(est, refined), true[alive])
    return out


def evaluate(
    est: OutputBoundEstimator,
    rows: Sequence[LengthRow],
    *,
    mean_tokens: float,
    default_max_tokens: int = 4096,
    latency_repeats: int = 5,
) -> dict[str, Any]:
    """All figures of ``slofleet predictor eval`` as a JSON-ready dict."""
    caps = np.asarray([r.max_tokens or default_max_tokens for r in rows], dtype=np.float64)
    true = np.minimum(np.asarray([r.output_tokens for r in rows], dtype=np.float64), caps)
    queries = [
        BoundQuery(r.prompt, r.prompt_tokens, r.kind, int(c), model=r.model)
        for r, c in zip(rows, caps, strict=True)
    ]
    step = est.params.refine_every_tokens
    mean_b = np.minimum(np.full(len(rows), max(1.0, round(mean_tokens))), caps)
    qrf = _qrf_stages(est, queries, true)
    text_free = _qrf_stages(est, [dataclasses.replace(q, prompt_text=None) for q in queries], true)
    mean = {"submission": _stage(mean_b, true)}
    cap = {"submission": _stage(caps, true)}
    for g in CHECKPOINTS_TOKENS:
        alive = np.flatnonzero(true > g)
        t = true[alive]
        relaxed = np.where(mean_b[alive] <= g, np.minimum(g + step, caps[alive]), mean_b[alive])
        mean[f"after_{g}"] = _stage(relaxed, t)
        cap[f"after_{g}"] = _stage(caps[alive], t)
    latency = {f"batch_{n}": latency_ms_per_request(est, queries, n, latency_repeats) for n in (1, 64)}
    return {
        "rows": len(rows),
        "quantile": est.params.quantile,
        "refine_every_tokens": step,
        "default_max_tokens": default_max_tokens,
        "mean_tokens": round(mean_tokens, 1),
        "qrf": qrf,
        "qrf_text_free": text_free,
        "mean_length": mean,
        "max_tokens": cap,
        "latency_ms_per_request": latency,
    }


def format_report(result: dict[str, Any]) -> str:
    """A fixed-width table of :func:`evaluate`'s result."""
    lines = [
        f"rows={result['rows']} quantile={result['quantile']} "
        f"max_tokens(default)={result['default_max_tokens']}",
        f"{'method':<14} {'stage':<11} {'n':>6} {'coverage':>9} {'median b/t':>11} {'p90 b/t':>9}",
    ]
    for method in ("qrf", "qrf_text_free", "mean_length", "max_tokens"):
        for stage, s in result[method].items():
            lines.append(
                f"{method:<14} {stage:<11} {s['n']:>6} {s['coverage']:>9.3f} "
                f"{s['median_ratio']:>11.2f} {s['p90_ratio']:>9.2f}"
            )
    lat = result["latency_ms_per_request"]
    lines.append("latency ms/request: " + ", ".join(f"{k}={v:.3f}" for k, v in lat.items()))
    return "\n".join(lines)
