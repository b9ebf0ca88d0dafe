"""Measure iteration times of a random-weight Llama-3-8B-shaped model on a real GPU (bf16, SDPA).

Run on a GPU machine with PyTorch and transformers (no vLLM, no weights download: random weights
have the same cost as trained ones). Writes a CSV of
``kind, batch, prompt_tokens, context_tokens, ms`` rows:
- prefill: one sequence of P prompt tokens (batch 1), forward pass with an empty cache;
- decode: one step for a batch of B sequences, each with a KV cache of C tokens.
Each row has two times: ``wall_ms`` (eager PyTorch, including per-kernel launch gaps, which vLLM's
CUDA graphs remove) and ``gpu_ms``, the sum of the GPU kernel times from torch.profiler — what a
CUDA-graph replay approaches, and the number to compare with a vLLM iteration.
Used by bench/fit_perf.py's H100 8B calibration check (see bench/results/perf_fidelity.md).
"""

from __future__ import annotations

import csv
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache

CONFIG = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)


def timed(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return samples[len(samples) // 2]


def kernel_ms(fn) -> float:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / 1000.0


def main(out_path: str) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIG, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    rows = []
    with torch.inference_mode():
        for p in (64, 128, 256, 512, 1024, 2048, 4096, 8192):
            ids = torch.randint(0, 32000, (1, p), device="cuda")

            def run(ids: torch.Tensor = ids) -> None:
                model.model(input_ids=ids, use_cache=False)

            ms, gpu = timed(run), kernel_ms(run)
            rows.append(("prefill", 1, p, p, round(ms, 3), round(gpu, 3)))
            print("prefill", p, round(ms, 2), round(gpu, 2), flush=True)
        for c in (256, 1024, 2048, 4096):
            for b in (1, 8, 16, 32, 64, 128):
                if b * c > 128 * 1024:
                    continue
                ctx = torch.randint(0, 32000, (b, c), device="cuda")
                cache = DynamicCache()
                model.model(input_ids=ctx, past_key_values=cache, use_cache=True)
                step_ids = torch.randint(0, 32000, (b, 1), device="cuda")
                base_len = cache.get_seq_length()

                def step(
                    step_ids: torch.Tensor = step_ids, cache: DynamicCache = cache, base_len: int = base_len
                ) -> None:
                    model.model(input_ids=step_ids, past_key_values=cache, use_cache=True)
                    cache.crop(base_len - cache.get_seq_length())

                ms, gpu = timed(step), kernel_ms(step)
                rows.append(("decode", b, c, c, round(ms, 3), round(gpu, 3)))
                print("decode", b, c, round(ms, 2), round(gpu, 2), flush=True)
                del cache, ctx
                torch.cuda.empty_cache()
    with open(out_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "batch", "prompt_tokens", "context_tokens", "wall_ms", "gpu_ms"])
        w.writerows(rows)
    print("gpu", torch.cuda.get_device_name(0), "torch", torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
