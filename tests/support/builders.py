"""Builders of what policies see (request, engine and replica snapshots), SLO targets and perf profiles.

One set for every test: each builder fills what a case does not turn on with plain defaults and takes
the rest by keyword, so a test states only what matters to it (a test file may bind its own defaults
with ``functools.partial``). Defaults are small and round, never tuned to make a test pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EngineView, ReplicaCapabilities, ReplicaView, RequestView
from slo_core.slo import RequestKind, SLOTargets

# ---- SLO targets -----------------------------------------------------------------------------------


def latency(
    ttft_s: float = 2.0, tbt_s: float = 0.1, *, weight: float = 1.0, priority_class: str = "default"
) -> SLOTargets:
    """A streaming request's targets: first token within ``ttft_s``, then one every ``tbt_s``."""
    return SLOTargets(
        RequestKind.LATENCY,
        ttft_s=ttft_s,
        tbt_s=tbt_s,
        priority_class=priority_class,
        priority_weight=weight,
    )


def deadline(
    deadline_s: float = 20.0, *, weight: float = 1.0, priority_class: str = "default", compound: bool = False
) -> SLOTargets:
    """A deadline request's targets (a compound program's, with ``compound``): done within ``deadline_s``."""
    return SLOTargets(
        RequestKind.COMPOUND if compound else RequestKind.DEADLINE,
        deadline_s=deadline_s,
        priority_class=priority_class,
        priority_weight=weight,
    )


LAT = latency()
DL = deadline()
CP = deadline(60.0, compound=True)
BE = SLOTargets(RequestKind.BEST_EFFORT)

# ---- performance profiles --------------------------------------------------------------------------


def profile(
    *,
    t_c_ms: float = 0.0,
    floor_ms: float = 10.0,
    a_ms_per_token: float = 0.0,
    b_ms_per_token_ctx: float = 0.0,
    d_ms_per_kv_token: float = 0.0,
    kv_cache_tokens: int = 1 << 20,
    max_model_len: int = 1 << 16,
) -> PerfProfile:
    """A hand-made profile (PerfProfile's coefficients, in ms); by default 10 ms an iteration, ample KV."""
    return PerfProfile(
        "test",
        "test-gpu",
        "test-model",
        1,
        t_c_ms=t_c_ms,
        floor_ms=floor_ms,
        a_ms_per_token=a_ms_per_token,
        b_ms_per_token_ctx=b_ms_per_token_ctx,
        d_ms_per_kv_token=d_ms_per_kv_token,
        kv_cache_tokens=kv_cache_tokens,
        max_model_len=max_model_len,
    )


STEP_10MS = profile()
"""Every iteration takes 10 ms whatever it holds: times in a test are counts of steps."""
SMALL_GPU = profile(
    t_c_ms=5.0,
    floor_ms=10.0,
    a_ms_per_token=0.1,
    b_ms_per_token_ctx=1e-5,
    d_ms_per_kv_token=1e-4,
    kv_cache_tokens=100_000,
    max_model_len=8192,
)
"""Prefill, context and KV costs of an 8B-class model on a small cache and an 8192-token context."""
FAST_GPU = dataclasses.replace(
    SMALL_GPU,
    t_c_ms=2.0,
    floor_ms=8.0,
    b_ms_per_token_ctx=1e-6,
    d_ms_per_kv_token=1e-5,
    kv_cache_tokens=200_000,
)
"""Like SMALL_GPU with a lower fixed cost, cheaper context and twice the KV cache."""

# ---- snapshots -------------------------------------------------------------------------------------


def request(
    rid: str = "r",
    slo: SLOTargets = DL,
    *,
    arrival_s: float = 0.0,
    prompt: int = 100,
    max_tokens: int = 1000,
    gen: int = 0,
    prefilled: bool = False,
    bound: int | None = None,
    due: bool = False,
    **fields: Any,
) -> RequestView:
    """One request snapshot: ``prompt`` tokens in, ``gen`` generated so far, output ``bound`` if known.

    ``prefilled``: its prompt and generated tokens are computed (a running request; otherwise nothing
    is, as for a new or requeued one); ``computed_tokens`` in ``fields`` overrides both. ``due``: its
    ``deadline_at_s`` is arrival + the SLO's deadline, as an engine sets it. ``fields``: any other
    RequestView field.
    """
    fields.setdefault("computed_tokens", prompt + gen if prefilled else 0)
    if due and slo.deadline_s is not None:
        fields.setdefault("deadline_at_s", arrival_s + slo.deadline_s)
    return RequestView(
        rid, slo, arrival_s, prompt, max_tokens, generated_tokens=gen, output_bound=bound, **fields
    )


def engine(
    now_s: float = 0.0,
    *,
    step: int = 0,
    seqs: int = 64,
    batched: int = 8192,
    kv_total: int = 10_000,
    kv_free: int | None = None,
    profile: PerfProfile | None = None,
) -> EngineView:
    """An engine snapshot at ``now_s``: ``seqs`` sequences, ``batched`` tokens a step, KV blocks."""
    return EngineView(
        now_s=now_s,
        step=step,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_blocks_total=kv_total,
        kv_blocks_free=kv_total if kv_free is None else kv_free,
        profile=profile,
    )


def replica(
    rid: str,
    *,
    waiting: Iterable[RequestView] = (),
    running: Iterable[RequestView] = (),
    snapshot_s: float = 0.0,
    seqs: int = 8,
    batched: int = 8192,
    kv_total: int = 10_000,
    kv_free: int | None = None,
    profile: PerfProfile | None = None,
    engine_policy: str = "fcfs",
    healthy: bool = True,
    models: tuple[str, ...] = (),
    ctx: int = 1 << 30,
    load: int | None = None,
) -> ReplicaView:
    """A replica as the router sees it: its queues, limits, capabilities (``models``, context ``ctx``)
    and, with ``load``, the outstanding tokens it reports itself."""
    return ReplicaView(
        rid,
        snapshot_s=snapshot_s,
        waiting=tuple(waiting),
        running=tuple(running),
        kv_blocks_total=kv_total,
        kv_blocks_free=kv_total if kv_free is None else kv_free,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        profile=profile,
        engine_policy=engine_policy,
        healthy=healthy,
        capabilities=ReplicaCapabilities(models=models, max_context_tokens=ctx),
        reported_outstanding_tokens=load,
    )
