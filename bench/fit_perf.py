"""Fit the shipped performance profiles and write the fidelity table.

    .venv/bin/python bench/fit_perf.py            # writes core/slo_core/data/profiles/*.json,
                                                  # bench/results/perf_fidelity.{md,csv}

Model (slo_core.perf.model): T = t_c + max(floor, a·N) + b·Σ(chunk·ctx) + d·ΣKV + s·P, coefficients ≥ 0.

* Llama-2-70B (H100 TP4, H100 TP8, A100 TP4): fitted directly on Splitwise's measured prompt and
  token iteration times (slo_core.perf.fidelity explains the inputs), least relative absolute error
  (the MAPE the table reports), every term including s (cost per prefill chunk). Also writes
  bench/results/perf_residuals.png: the residual of every measured iteration by batch shape.
* Llama-3-8B on A100 TP1: composed from Vidur's per-layer kernel medians: the linear ops of
  Meta-Llama-3-8B (A100, TP1) give t_c, a and the knee; the attention terms come from Vidur's A100
  attention profile (Llama-2-70B TP2: 32 query / 4 KV heads per GPU, per layer), b scaled by query
  heads (32/32) and d by KV heads (8/4), times 32 layers.
* Llama-3-8B on H100 TP1 (in no shared data set; derived): linear ops transferred from Vidur's H100
  Llama-2-7B kernels by the A100 Llama-3-8B / Llama-2-7B ratio at each token count (the same stack as
  the A100 profile); attention b, d and the decode constant from our one-layer H100 attention timing
  (bench/gpu/results/h100_attention_measured.csv, bench/gpu/measure_attention_h100.py). Checked
  against our whole-model H100 measurement of the exact shape (h100_llama3_8b_measured.csv).
* Both 8B profiles are GPU kernel time; the CPU-side per-step overhead of vLLM with CUDA graphs is in
  no shipped data and is added as ``--cpu-overhead-ms`` (an assumption, recorded in the JSON).

KV capacity: (GPU memory × TP × 0.9 − weight bytes) / KV bytes per token, bf16 weights and cache.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from fit_perf_kernels import a100_llama3_8b, h100_llama3_8b, profile_doc

from slo_core.perf.fidelity import (
    SPLITWISE_FILE,
    SPLITWISE_FIT,
    all_points,
    phase_points,
    splitwise_configs,
)
from slo_core.perf.fit import ape, fit_points
from slo_core.perf.fit import residual_stats as residuals
from slo_core.perf.shapes import LLAMA2_70B

ROOT = Path(__file__).resolve().parents[1]
PROFILES_DIR = ROOT / "core" / "slo_core" / "data" / "profiles"
RESULTS_DIR = ROOT / "bench" / "results"


# ---- Llama-2-70B: Splitwise --------------------------------------------------------------------------

SPLITWISE_PROFILES = {
    "h100-llama2-70b-tp4": ("h100", "h100-80gb", 4),
    "h100-llama2-70b-tp8": ("h100", "h100-80gb", 8),
    "a100-llama2-70b-tp4": ("a100", "a100-80gb", 4),
}


def leave_one_out_mape(configs: list[Any]) -> float:
    """Refit without each (prompt, batch, tokens) setting and predict its two iterations."""
    errors: list[float] = []
    for i in range(len(configs)):
        train = configs[:i] + configs[i + 1 :]
        held = all_points([configs[i]])
        fit = fit_points(all_points(train), **SPLITWISE_FIT)
        errors.extend(ape(fit.predict_ms(held), held.time_ms).tolist())
    return float(np.mean(errors))


def splitwise_profile(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    gpu, hardware, tp = SPLITWISE_PROFILES[name]
    configs = splitwise_configs("llama2-70b", hardware, tp)
    pts = all_points(configs)
    fit = fit_points(pts, **SPLITWISE_FIT)
    per_phase = {ph: residuals(fit, phase_points(configs, ph)) for ph in ("prompt", "token")}
    loo = leave_one_out_mape(configs)
    doc = profile_doc(
        name=name,
        gpu=gpu,
        shape=LLAMA2_70B,
        tp=tp,
        fit=fit,
        extra_t_c_ms=0.0,
        source=f"Splitwise llama2-70b {hardware} TP{tp} (fitted)",
        provenance={
            "sources": [f"slo_core/data/{SPLITWISE_FILE}"],
            "method": "least relative absolute error (min MAPE, linear program), non-negative, knee grid, "
            "on median prompt_time and token_time; s: ms per prefill chunk in the batch",
            "splitwise": {"model": "llama2-70b", "hardware": hardware, "tensor_parallel": tp},
            "residuals": {"all": residuals(fit, pts), **per_phase, "leave_one_out_mape_pct": round(loo, 3)},
        },
    )
    row = {
        "profile": name,
        "settings": len(configs),
        "prompt_mape_pct": per_phase["prompt"]["mape_pct"],
        "token_mape_pct": per_phase["token"]["mape_pct"],
        "all_mape_pct": residuals(fit, pts)["mape_pct"],
        "loo_mape_pct": round(loo, 3),
        "max_ape_pct": residuals(fit, pts)["max_ape_pct"],
        "s_ms_per_prefill": round(fit.s_ms_per_prefill, 3),
    }
    return doc, row | {"_residuals": _residual_rows(fit, configs)}


def _residual_rows(fit: Any, configs: list[Any]) -> list[tuple[str, float]]:
    """(batch shape, signed % error) of every measured iteration, prompt rows then token rows."""
    out: list[tuple[str, float]] = []
    for ph in ("prompt", "token"):
        pts = phase_points(configs, ph)
        err = 100.0 * (fit.predict_ms(pts) - pts.time_ms) / pts.time_ms
        for c, e in zip(configs, err, strict=True):
            tail = f" T{c.generated_tokens}" if ph == "token" else ""
            label = f"{ph} P{c.prompt_tokens} B{c.batch}{tail}"
            out.append((label, float(e)))
    return out


def write_residual_plot(rows: list[dict[str, Any]]) -> Path:
    """Signed residuals per batch shape, one marker series per profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, _ in rows[0]["_residuals"]]
    fig, ax = plt.subplots(figsize=(14, 5.5))
    for k, r in enumerate(rows):
        ys = [e for _, e in r["_residuals"]]
        ax.scatter(np.arange(len(ys)) + (k - 1) * 0.2, ys, s=18, label=r["profile"])
    ax.axhline(0.0, color="black", lw=0.8)
    for lim in (-5.0, 5.0):
        ax.axhline(lim, color="grey", lw=0.6, ls="--")
    ax.set_xticks(np.arange(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("predicted − measured (% of measured)")
    ax.set_title("Iteration-time model vs Splitwise, by batch shape (P prompt tokens, B batch, T generated)")
    ax.legend()
    fig.tight_layout()
    path = RESULTS_DIR / "perf_residuals.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- output ------------------------------------------------------------------------------------------

TABLE_COLUMNS = (
    "profile",
    "settings",
    "prompt_mape_pct",
    "token_mape_pct",
    "all_mape_pct",
    "loo_mape_pct",
    "max_ape_pct",
    "s_ms_per_prefill",
)


def write_profile(doc: dict[str, Any]) -> Path:
    PROFILES_DIR.mkdir(parents=True, exist_ok=True)
    path = PROFILES_DIR / f"{doc['name']}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def write_table(rows: list[dict[str, Any]], notes: list[str]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with (RESULTS_DIR / "perf_fidelity.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = [
        "# Performance-model fidelity against Splitwise's measured iteration times",
        "",
        "Produced by `.venv/bin/python bench/fit_perf.py`",
        "(which also writes `core/slo_core/data/profiles/*.json`).",
        "MAPE = mean absolute percentage error (%) of the shipped profile's predicted iteration time",
        "against Splitwise's median `prompt_time` (one prefill of B×P tokens) and `token_time` (mean decode",
        "iteration of B sequences while they generate T tokens) over its (P, B, T) settings;",
        "`all` pools both; `leave-one-out` refits without each setting and predicts it",
        "(an out-of-sample figure).",
        "Model: T = t_c + max(floor, a·N) + b·Σ(chunk·ctx) + d·ΣKV + s·P (P: prefill chunks in the batch),",
        "fitted for least relative absolute error. Target (issue 20): ≤ 5% `all` MAPE on every row.",
        "Residuals by batch shape: `perf_residuals.png`.",
        "",
        "| profile | settings | prompt MAPE % | token MAPE % | all MAPE % | leave-one-out MAPE % "
        "| max APE % | s ms/prefill |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['settings']} | {r['prompt_mape_pct']:.2f} | {r['token_mape_pct']:.2f} | "
            f"{r['all_mape_pct']:.2f} | {r['loo_mape_pct']:.2f} | {r['max_ape_pct']:.1f} | "
            f"{r['s_ms_per_prefill']:.1f} |"
        )
    lines += ["", *notes, ""]
    (RESULTS_DIR / "perf_fidelity.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-overhead-ms",
        type=float,
        default=1.0,
        help="per-step CPU overhead added to the kernel-time 8B profiles (ms; an assumption)",
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for name in SPLITWISE_PROFILES:
        doc, row = splitwise_profile(name)
        print(f"wrote {write_profile(doc).relative_to(ROOT)}")
        rows.append(row)
    a100_doc, _ = a100_llama3_8b(args.cpu_overhead_ms)
    print(f"wrote {write_profile(a100_doc).relative_to(ROOT)}")
    h100_doc, h100_info = h100_llama3_8b(args.cpu_overhead_ms)
    print(f"wrote {write_profile(h100_doc).relative_to(ROOT)}")
    notes = notes_text(a100_doc, h100_doc, h100_info)
    print(f"wrote {write_residual_plot(rows).relative_to(ROOT)}")
    write_table(rows, notes)
    for r in rows:
        print(" ".join(f"{k}={r[k]}" for k in TABLE_COLUMNS))
    print(
        f"h100-llama3-8b-tp1 kernel part vs our H100 measurement: {h100_info['measured']['mape_pct']}% MAPE"
    )
    return 0


def notes_text(a100: dict[str, Any], h100: dict[str, Any], h100_info: dict[str, Any]) -> list[str]:
    def coeffs(d: dict[str, Any]) -> str:
        return (
            f"t_c {d['t_c_ms']:.2f} ms, floor {d['floor_ms']:.2f} ms, a {d['a_ms_per_token']:.5f} ms/token, "
            f"b {d['b_ms_per_token_ctx']:.3g} ms/token², d {d['d_ms_per_kv_token']:.3g} ms/KV token, "
            f"KV cache {d['kv_cache_tokens']} tokens"
        )

    m = h100_info["measured"]
    return [
        "## The 8B profiles (no Splitwise rows exist for them)",
        "",
        f"- `a100-llama3-8b-tp1`: {coeffs(a100)}. Composed from Vidur kernel medians (see the JSON's",
        "  `provenance.method`): GPU kernel time plus an assumed per-step CPU overhead "
        f"({a100['provenance']['cpu_overhead_ms']} ms).",
        f"- `h100-llama3-8b-tp1` (derived; in no shared data set): {coeffs(h100)}. Linear ops transferred",
        "  from Vidur's H100 Llama-2-7B kernels by the A100 Llama-3-8B / Llama-2-7B ratio (same recipe and",
        "  stack as the A100 profile); attention from our one-layer H100 timings (bench/gpu/results/).",
        "  Check against our whole-model H100 measurement of the exact shape (GPU kernel time,",
        f"  transformers): {m['mape_pct']:.1f}% MAPE (max {m['max_ape_pct']:.1f}%, {m['points']} points);",
        "  transformers is slower (unfused ops, logits for every prompt token), so the profile is lower",
        "  at large prompts.",
        "",
        "## Caveats",
        "",
        "- The 70B rows are in-sample for `all`; leave-one-out is the honest out-of-sample figure.",
        "- Before issue 20 the model had no per-prefill term and was fitted by least squares: `all` MAPE",
        "  5.67 / 8.56 / 7.25 % (leave-one-out 6.64 / 10.64 / 7.86 %) for the three rows above. Each batched",
        "  prompt costs ~20–30 ms on top of its tokens in Splitwise's data (B×512-token batches are slower",
        "  than one B·512-token prompt); `s` carries that. The single-prompt rows at 128–256 tokens (and",
        "  TP8's noisy prompt rows, not monotone in tokens) still set `max APE`.",
        "- Splitwise TP2 rows are not shipped: the A100 TP2 prompt times are not monotone in batch",
        "  (B=64 faster than B=32), and a 70B model at TP2 leaves little KV cache.",
        "- Splitwise's 70B measurements run about 2x slower than Vidur's kernel sums for the same GPU/TP",
        "  (H100 TP4 decode at B=1: 28 ms vs 14 ms of kernels); the 8B profiles follow the kernel data, so",
        "  comparing 8B and 70B profiles mixes two serving stacks.",
        "- A100 8B prefill attention comes from Vidur's A100 attention profile, whose prefill kernel runs",
        "  at ~60 TFLOP/s (FlashAttention-2 on an A100 reaches ~3x that); the H100 attention is our own",
        f"  timing of PyTorch SDPA. An 8k-token prefill: A100 {_prefill_ms(a100, 8192):.0f} ms "
        f"(attention {a100['b_ms_per_token_ctx'] * 8192**2:.0f}),",
        f"  H100 {_prefill_ms(h100, 8192):.0f} ms (attention {h100['b_ms_per_token_ctx'] * 8192**2:.0f}): "
        "a ratio above the usual 2-3x, so",
        "  A100 8B prompt-heavy results are pessimistic.",
        "- Σ(chunk·ctx) counts a whole-prompt prefill as P² (the simulator's convention), while causal",
        "  attention does about P²/2; the fits absorb the factor, so b is only meaningful with that sum.",
    ]


def _prefill_ms(doc: dict[str, Any], tokens: int) -> float:
    linear = max(doc["floor_ms"], doc["a_ms_per_token"] * tokens)
    return float(doc["t_c_ms"] + linear + doc["b_ms_per_token_ctx"] * tokens * tokens)


if __name__ == "__main__":
    sys.exit(main())
