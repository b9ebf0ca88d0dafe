"""Per-iteration batch latency model (PROSERVE §4.1, SLOs-Serve §3.1.1).

    T(batch) = t_c + max(floor, a·N) + b·Σ(chunk·ctx) + d·ΣKV + s·P

N is the number of tokens processed in the iteration (prefill chunk tokens plus one per decoding
sequence); the linear term is floored because small batches are memory-bound; Σ(chunk·ctx) is the
prefill attention work (each chunk's length times the context it attends to, itself included); ΣKV
is the number of KV-cache tokens read by the decoding sequences; P is the number of prefill chunks in
the batch (a per-sequence prefill cost: Splitwise's batched prompts cost ~20 ms per prompt on top of
their tokens; 0 in profiles composed from kernel timings). Coefficients are fitted from real
GPU profiles by ``bench/fit_perf.py`` and shipped as JSON under ``slo_core/data/profiles``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PerfProfile:
    """Fitted latency coefficients of one (GPU, model, tensor-parallel) configuration.

    Times in milliseconds. ``kv_cache_tokens`` is how many tokens of KV cache fit in GPU memory at
    vLLM's default 0.9 memory utilization; ``max_model_len`` the context length served.
    """

    name: str
    gpu: str
    model: str
    tensor_parallel: int
    t_c_ms: float
    floor_ms: float
    a_ms_per_token: float
    b_ms_per_token_ctx: float
    d_ms_per_kv_token: float
    kv_cache_tokens: int
    max_model_len: int
    source: str = ""
    s_ms_per_prefill: float = 0.0

    def iteration_time_s(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_kv_tokens: Sequence[int]
    ) -> float:
        """Latency of one iteration: ``prefill_chunks`` are (chunk tokens, context incl. chunk)."""
        n_tokens = sum(c for c, _ in prefill_chunks) + len(decode_kv_tokens)
        chunk_ctx = sum(c * ctx for c, ctx in prefill_chunks)
        n_prefills = sum(1 for c, _ in prefill_chunks if c > 0)
        return self.iteration_time_from_sums_s(n_tokens, chunk_ctx, sum(decode_kv_tokens), n_prefills)

    def iteration_time_from_sums_s(
        self, n_tokens: int, sum_chunk_ctx: float, sum_kv_tokens: float, n_prefills: int = 0
    ) -> float:
        """The same model from pre-aggregated sums (the simulator's hot path)."""
        if n_tokens <= 0:
            return 0.0
        linear = max(self.floor_ms, self.a_ms_per_token * n_tokens)
        ms = (
            self.t_c_ms
            + linear
            + self.b_ms_per_token_ctx * sum_chunk_ctx
            + self.d_ms_per_kv_token * sum_kv_tokens
        )
        if n_prefills:
            ms += self.s_ms_per_prefill * n_prefills
        return ms / 1000.0


def sped_up(profile: PerfProfile, speedup: float) -> PerfProfile:
    """The same profile on a GPU ``speedup`` times as fast: every time coefficient divided by it (< 1:
    slower). engine-sim runs its profile this way (``--speedup``), the demo's simulator slows its engines
    alike, and a router scales a pod's named profile by the step-time correction the pod reports
    (``speedup = 1 / correction``), so all three estimate with the same coefficients."""
    if speedup == 1.0:
        return profile
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    return dataclasses.replace(
        profile,
        t_c_ms=profile.t_c_ms / speedup,
        floor_ms=profile.floor_ms / speedup,
        a_ms_per_token=profile.a_ms_per_token / speedup,
        b_ms_per_token_ctx=profile.b_ms_per_token_ctx / speedup,
        d_ms_per_kv_token=profile.d_ms_per_kv_token / speedup,
        s_ms_per_prefill=profile.s_ms_per_prefill / speedup,
        source=f"{profile.source} (speed-up ×{speedup:g})",
    )


class OnlineCorrection:
    """Momentum correction of estimates by measured/estimated ratios (PROSERVE §4.1).

    ``factor ← β·factor + (1−β)·(measured / estimated)``; corrected estimate = factor · estimate.
    The ratio of a single observation is clipped to [min_ratio, max_ratio] so one outlier (a GC
    pause, a stalled step) cannot wreck the estimator.
    """

    def __init__(self, momentum: float = 0.9, min_ratio: float = 0.2, max_ratio: float = 5.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.min_ratio = min_ratio
        self.max_ratio = max_ratio
        self.factor = 1.0
        self.observations = 0

    def observe(self, estimated_s: float, measured_s: float) -> float:
        """Fold one (estimated, measured) pair in; returns the new factor."""
        if estimated_s <= 0 or measured_s <= 0:
            return self.factor
        ratio = min(self.max_ratio, max(self.min_ratio, measured_s / estimated_s))
        self.factor = self.momentum * self.factor + (1.0 - self.momentum) * ratio
        self.observations += 1
        return self.factor

    def correct(self, estimated_s: float) -> float:
        return self.factor * estimated_s
