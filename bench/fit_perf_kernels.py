"""The kernel-based 8B profiles of ``bench/fit_perf.py`` (its docstring explains the recipe)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Any

import numpy as np

from slo_core import data
from slo_core.perf.fit import Fit, FloatArray, Points, fit_points
from slo_core.perf.fit import residual_stats as residuals
from slo_core.perf.shapes import LLAMA3_8B, Shape, kv_capacity

GPU_RESULTS = Path(__file__).resolve().parent / "gpu" / "results"
H100_MODEL_CSV = GPU_RESULTS / "h100_llama3_8b_measured.csv"
H100_ATTN_CSV = GPU_RESULTS / "h100_attention_measured.csv"
VIDUR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def profile_doc(
    *,
    name: str,
    gpu: str,
    shape: Shape,
    tp: int,
    fit: Fit,
    extra_t_c_ms: float,
    source: str,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    kv_tokens, kv_how = kv_capacity(shape, gpu, tp)
    return {
        "name": name,
        "gpu": gpu,
        "model": shape.name,
        "tensor_parallel": tp,
        "t_c_ms": fit.t_c_ms + extra_t_c_ms,
        "floor_ms": fit.floor_ms,
        "a_ms_per_token": fit.a_ms_per_token,
        "b_ms_per_token_ctx": fit.b_ms_per_token_ctx,
        "d_ms_per_kv_token": fit.d_ms_per_kv_token,
        "s_ms_per_prefill": fit.s_ms_per_prefill,
        "kv_cache_tokens": kv_tokens,
        "max_model_len": shape.max_model_len,
        "source": source,
        "provenance": {
            **provenance,
            "knee_tokens": fit.knee_tokens,
            "kv_cache": kv_how,
            "fitted_by": "bench/fit_perf.py",
        },
    }


def _read_gz_csv(name: str) -> list[dict[str, str]]:
    with gzip.open(data.path(name), "rt", newline="") as fh:
        return list(csv.DictReader(fh))


def vidur_linear(gpu: str, model: str, tp: int, layers: int) -> tuple[FloatArray, FloatArray]:
    """(num_tokens, ms) of the whole model's linear/norm ops: layers × Σ per-layer ops + embedding."""
    by_n: dict[int, list[float]] = {}
    for r in _read_gz_csv("vidur_mlp_medians.csv.gz"):
        if (r["gpu"], r["model"], int(r["num_tensor_parallel_workers"])) != (gpu, model, tp):
            continue
        per_layer = sum(float(r[f"time_stats.{op}.median"]) for op in VIDUR_OPS)
        by_n.setdefault(int(r["num_tokens"]), []).append(
            layers * per_layer + float(r["time_stats.emb.median"])
        )
    ns = np.asarray(sorted(by_n), dtype=np.float64)
    return ns, np.asarray([np.median(by_n[int(n)]) for n in ns], dtype=np.float64)


def linear_fit(ns: FloatArray, ms: FloatArray) -> Fit:
    zero = np.zeros_like(ns)
    return fit_points(Points(ns, zero, zero, ms), use=("t_c", "a"))


def vidur_attention_a100() -> dict[str, float]:
    """Per-layer A100 attention coefficients (32 query / 4 KV heads per GPU)."""
    rows = _read_gz_csv("vidur_a100_attention_70b_tp2_medians.csv.gz")
    dec = [r for r in rows if r["is_prefill"] == "False"]
    pre = [r for r in rows if r["is_prefill"] == "True"]
    b = np.asarray([float(r["batch_size"]) for r in dec])
    kv = np.asarray([float(r["kv_cache_size"]) for r in dec])
    y = np.asarray([float(r["time_stats.attn_decode.median"]) for r in dec])
    dfit = fit_points(Points(b, np.zeros_like(b), b * kv, y), use=("t_c", "d"), knees=np.asarray([1.0]))
    c = np.asarray([float(r["prefill_chunk_size"]) for r in pre])
    ctx = c + np.asarray([float(r["kv_cache_size"]) for r in pre])
    y = np.asarray([float(r["time_stats.attn_prefill.median"]) for r in pre])
    pfit = fit_points(Points(c, c * ctx, np.zeros_like(c), y), use=("t_c", "b"), knees=np.asarray([1.0]))
    return {
        "decode_const_ms": dfit.t_c_ms,
        "d_ms_per_kv_token": dfit.d_ms_per_kv_token,
        "b_ms_per_token_ctx": pfit.b_ms_per_token_ctx,
    }


def h100_attention() -> dict[str, float]:
    """Per-layer H100 attention coefficients from our measurement (32 query / 8 KV heads)."""
    with H100_ATTN_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    dec = [r for r in rows if r["kind"] == "decode"]
    pre = [r for r in rows if r["kind"] == "prefill"]
    b = np.asarray([float(r["batch"]) for r in dec])
    kv = np.asarray([float(r["context_tokens"]) for r in dec])
    y = np.asarray([float(r["ms_per_layer"]) for r in dec])
    dfit = fit_points(Points(b, np.zeros_like(b), b * kv, y), use=("t_c", "d"), knees=np.asarray([1.0]))
    p = np.asarray([float(r["context_tokens"]) for r in pre])
    y = np.asarray([float(r["ms_per_layer"]) for r in pre])
    pfit = fit_points(Points(p, p * p, np.zeros_like(p), y), use=("t_c", "b"), knees=np.asarray([1.0]))
    return {
        "decode_const_ms": dfit.t_c_ms,
        "d_ms_per_kv_token": dfit.d_ms_per_kv_token,
        "b_ms_per_token_ctx": pfit.b_ms_per_token_ctx,
    }


def a100_llama3_8b(overhead_ms: float) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = LLAMA3_8B
    ns, ms = vidur_linear("a100", "Meta-Llama-3-8B", 1, shape.layers)
    lin = linear_fit(ns, ms)
    att = vidur_attention_a100()
    b = att["b_ms_per_token_ctx"] * shape.layers * (shape.q_heads / 32)
    d = att["d_ms_per_kv_token"] * shape.layers * (shape.kv_heads / 4)
    attn_const = att["decode_const_ms"] * shape.layers
    fit = Fit(lin.t_c_ms + attn_const, lin.a_ms_per_token, b, d, lin.knee_tokens)
    zero = np.zeros_like(ns)
    doc = profile_doc(
        name="a100-llama3-8b-tp1",
        gpu="a100",
        shape=shape,
        tp=1,
        fit=fit,
        extra_t_c_ms=overhead_ms,
        source="Vidur kernels Meta-Llama-3-8B A100 TP1 (composed)",
        provenance={
            "sources": [
                "slo_core/data/vidur_mlp_medians.csv.gz",
                "slo_core/data/vidur_a100_attention_70b_tp2_medians.csv.gz",
            ],
            "method": (
                "linear ops: layers x sum of per-layer op medians + embedding, fitted t_c + a*max(knee, N); "
                "attention per layer from the 70B TP2 A100 profile, b x (32/32 query heads), "
                "d x (8/4 KV heads), x 32 layers; decode attention constant x 32 layers added to t_c; "
                "plus cpu_overhead_ms"
            ),
            "cpu_overhead_ms": overhead_ms,
            "attention_per_layer_a100": att,
            "residuals": {"linear_ops": residuals(lin, Points(ns, zero, zero, ms))},
        },
    )
    return doc, {"decode_b1_ms": fit.t_c_ms + overhead_ms + fit.floor_ms}


def vidur_transfer_h100_8b() -> tuple[FloatArray, FloatArray]:
    """H100 Llama-3-8B linear ops: Vidur's H100 Llama-2-7B × the A100 Llama-3-8B / Llama-2-7B ratio."""
    layers = LLAMA3_8B.layers
    n7, h7 = vidur_linear("h100", "Llama-2-7b-hf", 1, layers)
    n8a, a8 = vidur_linear("a100", "Meta-Llama-3-8B", 1, layers)
    n7a, a7 = vidur_linear("a100", "Llama-2-7b-hf", 1, layers)
    common = np.intersect1d(np.intersect1d(n7, n8a), n7a)
    ms = np.asarray([h7[n7 == x][0] * a8[n8a == x][0] / a7[n7a == x][0] for x in common])
    return common, ms


def h100_llama3_8b(overhead_ms: float) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = LLAMA3_8B
    att = h100_attention()
    ns, ms = vidur_transfer_h100_8b()
    lin = linear_fit(ns, ms)
    b = att["b_ms_per_token_ctx"] * shape.layers
    d = att["d_ms_per_kv_token"] * shape.layers
    fit = Fit(lin.t_c_ms + att["decode_const_ms"] * shape.layers, lin.a_ms_per_token, b, d, lin.knee_tokens)
    # check against our whole-model H100 measurement (GPU kernel time): prefill rows, and decode rows
    # only at small batch and context (transformers' decode path expands KV heads and adds
    # per-sequence work that vLLM does not)
    with H100_MODEL_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    use = [
        r
        for r in rows
        if r["kind"] == "prefill" or (int(r["context_tokens"]) == 256 and int(r["batch"]) <= 8)
    ]
    prefill = [r["kind"] == "prefill" for r in use]
    n = np.asarray(
        [float(r["prompt_tokens"]) if p else float(r["batch"]) for r, p in zip(use, prefill, strict=True)]
    )
    s = np.asarray([float(r["prompt_tokens"]) ** 2 if p else 0.0 for r, p in zip(use, prefill, strict=True)])
    k = np.asarray(
        [
            0.0 if p else float(r["batch"]) * float(r["context_tokens"])
            for r, p in zip(use, prefill, strict=True)
        ]
    )
    measured = Points(n, s, k, np.asarray([float(r["gpu_ms"]) for r in use]))
    check = residuals(fit, measured)
    check["note"] = (
        "profile kernel part (no cpu_overhead_ms) vs measured gpu_ms; "
        "transformers also computes logits for every prompt token"
    )
    zero = np.zeros_like(ns)
    doc = profile_doc(
        name="h100-llama3-8b-tp1",
        gpu="h100",
        shape=shape,
        tp=1,
        fit=fit,
        extra_t_c_ms=overhead_ms,
        source="Vidur H100 transfer + H100 attention measurement (derived)",
        provenance={
            "sources": [
                "slo_core/data/vidur_mlp_medians.csv.gz",
                "bench/gpu/results/h100_attention_measured.csv",
                "bench/gpu/results/h100_llama3_8b_measured.csv (check only)",
            ],
            "method": (
                "linear ops: Vidur H100 Llama-2-7B per-op sums x (A100 Meta-Llama-3-8B / A100 Llama-2-7B) at "
                "each num_tokens, fitted t_c + a*max(knee, N); b, d and the decode attention constant from "
                "our one-layer H100 attention timings x 32 layers; plus cpu_overhead_ms"
            ),
            "cpu_overhead_ms": overhead_ms,
            "attention_per_layer_h100": att,
            "residuals": {"linear_ops": residuals(lin, Points(ns, zero, zero, ms))},
            "h100_measurement_check": check,
        },
    )
    return doc, {"measured": check}
