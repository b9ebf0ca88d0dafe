"""Small latency and deadline estimates shared by the seed-paper policies (Tempo, PROSERVE, SLOs-Serve, SA).

Every estimate reads the engine's fitted :class:`PerfProfile` (``T = t_c + max(floor, a·N) + b·Σchunk·ctx +
d·ΣKV``). The per-request "core" times follow PROSERVE §4.1 eq. 5–6 with the profile's coefficients:
prefill ``T̃_p = b·l_q·(l_kv + l_q) + a·l_q``, decode ``T̃_d = d·l_kv + a``; a batch adds ``t_c`` once
(eq. 7). ``latency_factor`` is the online-correction factor β of §4.1 (1.0 without feedback).
"""

from __future__ import annotations

import math

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import RequestView
from slo_core.slo import RequestKind

# Used only when an engine reports no profile: Llama-2-7B on one A100 (Vidur-derived coefficients in
# slo_core/data/vidur_derived_latency_coeffs.json, with a 3 ms constant overhead).
FALLBACK_PROFILE = PerfProfile(
    name="fallback-llama2-7b-a100",
    gpu="a100",
    model="Llama-2-7b-hf",
    tensor_parallel=1,
    t_c_ms=3.0,
    floor_ms=9.28,
    a_ms_per_token=0.06418,
    b_ms_per_token_ctx=3.62e-06,
    d_ms_per_kv_token=0.00032,
    kv_cache_tokens=200_000,
    max_model_len=4096,
    source="fallback",
)

# Output length assumed when a request states neither an output bound nor a finite max_tokens.
DEFAULT_OUTPUT_TOKENS = 256


def profile_or_fallback(profile: PerfProfile | None) -> PerfProfile:
    return profile if profile is not None else FALLBACK_PROFILE


def overhead_s(profile: PerfProfile) -> float:
    """PROSERVE's constant per-batch overhead t_c (seconds)."""
    return profile.t_c_ms / 1000.0


def prefill_core_s(profile: PerfProfile, chunk_tokens: float, ctx_before_tokens: float) -> float:
    """T̃_p of one prefill chunk (eq. 5): attention over the context it sees plus the linear term."""
    ms = profile.b_ms_per_token_ctx * chunk_tokens * (ctx_before_tokens + chunk_tokens)
    return (ms + profile.a_ms_per_token * chunk_tokens) / 1000.0


def decode_core_s(profile: PerfProfile, kv_tokens: float) -> float:
    """T̃_d of one decode token (eq. 6): KV read plus one token of linear work."""
    return (profile.d_ms_per_kv_token * kv_tokens + profile.a_ms_per_token) / 1000.0


def max_prefill_chunk(profile: PerfProfile, time_left_s: float, ctx_before_tokens: float) -> int:
    """Largest chunk l with T̃_p(l) ≤ time_left_s (solves b·l² + (a + b·ctx)·l ≤ T)."""
    if time_left_s <= 0:
        return 0
    t_ms = time_left_s * 1000.0
    b = profile.b_ms_per_token_ctx
    lin = profile.a_ms_per_token + b * ctx_before_tokens
    if b <= 0:
        return int(t_ms / lin) if lin > 0 else 1 << 30
    return max(0, int((-lin + math.sqrt(lin * lin + 4.0 * b * t_ms)) / (2.0 * b)))


def tokens_within_s(profile: PerfProfile, batch_s: float, sum_kv_tokens: float) -> int:
    """Tokens one iteration may process and still finish within ``batch_s`` (SLOs-Serve time2bs).

    Attention over prefill context is left out (small next to the linear term for chunks of a few
    hundred tokens); a batch that cannot even pay its overhead and KV reads gets zero.
    """
    left_ms = batch_s * 1000.0 - profile.t_c_ms - profile.d_ms_per_kv_token * sum_kv_tokens
    if left_ms < profile.floor_ms:
        return 0
    return int(left_ms / profile.a_ms_per_token) if profile.a_ms_per_token > 0 else 1 << 30


def expected_output_tokens(r: RequestView) -> int:
    """The output length a scheduler plans for: the predicted upper bound, else max_tokens."""
    if r.output_bound is not None:
        return max(r.output_bound, r.generated_tokens + 1)
    if r.max_tokens > 0:
        return max(r.max_tokens, r.generated_tokens + 1)
    return max(DEFAULT_OUTPUT_TOKENS, r.generated_tokens + 1)


def remaining_output_tokens(r: RequestView) -> int:
    return max(1, expected_output_tokens(r) - r.generated_tokens)


def remaining_prompt_tokens(r: RequestView) -> int:
    """Tokens still to (re)compute before the request decodes: its prompt, plus its output so far after
    a preemption; 0 once it is decoding.

    Engines count a decoding request's newest sampled token as not yet computed (vLLM's
    ``num_computed_tokens = num_tokens - 1``, and the simulator's engine alike), so "one token left"
    after the first output token is a decode step, not a prefill; a router fed by a state stream that
    reports decode as all computed gets the same answer.
    """
    left = r.prompt_tokens + r.generated_tokens - r.computed_tokens
    if left <= 1 and r.generated_tokens > 0:
        return 0
    return max(0, left)


def next_token_due_s(r: RequestView) -> float:
    """Absolute due time of the next output token (TDG deadline, PROSERVE eq. 3)."""
    if r.kind is RequestKind.LATENCY:
        return r.token_due_at_s(r.generated_tokens)
    if r.deadline_at_s is not None:
        return r.deadline_at_s
    return r.arrival_s + r.slo.effective_deadline_s


def first_token_due_s(r: RequestView) -> float:
    """Absolute due time of the first token (TTFT deadline; the whole deadline for non-latency kinds)."""
    if r.kind is RequestKind.LATENCY:
        return r.token_due_at_s(0)
    return next_token_due_s(r)


def tpot_target_s(r: RequestView, now_s: float, per_token_s: float) -> float | None:
    """The decode pace a request needs: its TBT, or for deadline kinds the slack spread over its tokens.

    Best-effort requests have none (None).
    """
    if r.kind is RequestKind.LATENCY:
        return r.slo.tbt_s
    if r.kind is RequestKind.BEST_EFFORT:
        return None
    left_s = next_token_due_s(r) - now_s - remaining_prompt_tokens(r) * 1e-4
    return max(per_token_s, left_s / remaining_output_tokens(r))
