"""Time one Llama-3-8B attention layer on a real GPU: decode over a KV cache, and causal prefill.

The transformers decode path in ``measure_llama_h100.py`` expands grouped KV heads and has no
flash-decoding kernel, so its KV cost is not vLLM's. Here one layer's decode attention is timed the
way a grouped-query decode kernel does it: the 4 query heads sharing a KV head are 4 query rows of
one non-causal attention over that head's cache (bf16, SDPA flash / memory-efficient kernels, no
head expansion). Shape: 32 query heads, 8 KV heads, head dim 128. Times are CUDA-event medians.

Run on a GPU machine with PyTorch: ``python3 bench/gpu/measure_attention_h100.py OUT.csv``.
Columns: ``kind`` (decode | prefill), ``batch``, ``context_tokens`` (decode: KV per sequence;
prefill: prompt tokens), ``ms_per_layer``.
"""

from __future__ import annotations

import csv
import sys

import torch
import torch.nn.functional as F

Q_HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
GROUP = Q_HEADS // KV_HEADS


def median_ms(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def decode_ms(batch: int, ctx: int) -> float:
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(batch, KV_HEADS, GROUP, HEAD_DIM, device=dev, dtype=dt)
    k = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device=dev, dtype=dt)
    v = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device=dev, dtype=dt)
    return median_ms(lambda: F.scaled_dot_product_attention(q, k, v))


def prefill_ms(tokens: int) -> float:
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, Q_HEADS, tokens, HEAD_DIM, device=dev, dtype=dt)
    k = torch.randn(1, Q_HEADS, tokens, HEAD_DIM, device=dev, dtype=dt)
    v = torch.randn(1, Q_HEADS, tokens, HEAD_DIM, device=dev, dtype=dt)
    return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "h100_attention_measured.csv"
    rows: list[tuple[str, int, int, float]] = []
    with torch.inference_mode():
        for batch in (1, 8, 32, 64, 128, 256):
            for ctx in (256, 1024, 2048, 4096, 8192):
                if batch * ctx > 256 * 4096:
                    continue
                rows.append(("decode", batch, ctx, decode_ms(batch, ctx)))
                torch.cuda.empty_cache()
        for tokens in (512, 1024, 2048, 4096, 8192):
            rows.append(("prefill", 1, tokens, prefill_ms(tokens)))
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "batch", "context_tokens", "ms_per_layer"])
        for kind, b, c, ms in rows:
            w.writerow([kind, b, c, f"{ms:.4f}"])
    print(torch.cuda.get_device_name(0), torch.__version__)
    for r in rows:
        print(*r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
