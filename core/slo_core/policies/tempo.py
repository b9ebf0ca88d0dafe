"""Tempo's Largest Service Density First (LSDF) scheduler (Tempo §3.1, §4.2 Algorithm 1, §4.3).

Every request is ranked by its *service density* = projected service gain / remaining process time.
With ``t_it`` the current decode-iteration time (from the engine's profile) and the conservative output
upper bound ``L_o`` (predictor bound, else max_tokens), the remaining process time is
``R = T_prefill(remaining prompt) + (L_o − generated)·t_it``; for a collective (compound) request it is
the *maximum* R over the calls of the same program stage (Algorithm 1 line 18). The projected gain uses
the divisive decay ``f(SLO, x) = min(1, (SLO/x)^α)``:

    deadline / compound / best-effort:  (w_i·L_i + w_o·L_o) · f(D, now + R − arrival)        (eq. 2, 4)
    latency:  w_i·L_i·f(TTFT, now + T_prefill − arrival)·𝟙[no token yet]
              + Σ_{k ≥ generated} w_o · f(TTFT + k·TBT, projected t_k − arrival)             (eq. 3)

times the priority weight (the last sum is sampled at 16 evenly spaced tokens). A latency request whose
next token is not due for ``throttle_lead_tbts``·TBT is throttled behind the others (§4.3: conservative
serving rates spare bandwidth). ``reserve_fraction`` of the sequence slots go to SLO-insensitive
(best-effort) requests in FCFS order and are backfilled when unused (§4.3). Preemption is cost-aware
and only at time quanta (every ``quantum_steps`` steps, §4.2): a running request v is swapped for a
higher-density waiting w that cannot otherwise be admitted only when
``(density_w − density_v)·quantum_s > recompute_s(v)·Σ_running density`` (the gain lost while v's KV
cache is recomputed).

A long queue's fields are read through a :class:`SnapshotTable` the policy keeps between decisions
(only new or changed snapshots re-read; a simulated engine's running requests read live, never
snapshotted), a short one's from the snapshots in plain floats: both give the densities the snapshot
reference :func:`service_densities` gives, bit for bit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.perf.model import PerfProfile
from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EngineView,
    RequestView,
    pick_ids,
    positional,
    request_id_of,
)
from slo_core.policies.float_sum import numpy_sum
from slo_core.policies.gmax_priority import Groups, stage_sum
from slo_core.policies.gmax_snapshot import (
    B8,
    BEST_EFFORT,
    COMPOUND,
    F64,
    I64,
    LATENCY,
    Columns,
    SnapshotTable,
)
from slo_core.policies.seed_estimates import (
    DEFAULT_OUTPUT_TOKENS,
    expected_output_tokens,
    overhead_s,
    prefill_core_s,
    profile_or_fallback,
)
from slo_core.slo import DEFAULT_BEST_EFFORT_DEADLINE_S, RequestKind

_SAMPLES = 16
_FRAC = np.linspace(0.0, 1.0, _SAMPLES)  # where the latency term samples the remaining tokens
_FRAC_LIST: list[float] = _FRAC.tolist()
# queues up to this size take the plain-float path (numpy's fixed cost per call dominates below it)
SCALAR_MAX = 48


class TempoParams(BaseModel):
    """Parameters of Tempo's LSDF scheduler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_weight: float = Field(1.0, ge=0, description="w_i: gain per input token (unitless)")
    output_weight: float = Field(2.0, ge=0, description="w_o: gain per output token, 1:2 pricing (unitless)")
    alpha: float = Field(1.0, gt=0, description="α of the divisive decay min(1, (SLO/x)^α) (unitless)")
    quantum_steps: int = Field(20, ge=1, description="preemptions only every this many engine steps (steps)")
    reserve_fraction: float = Field(
        0.1, ge=0, le=1, description="share of sequence slots reserved for best-effort requests (fraction)"
    )
    throttle_lead_tbts: float = Field(
        8.0,
        gt=0,
        description="throttle a latency request whose next token is due this many TBTs ahead (TBTs)",
    )
    preemption_cost_scale: float = Field(
        1.0, ge=0, description="multiplier on the estimated preemption loss (unitless)"
    )


@dataclass(frozen=True, slots=True)
class Densities:
    """LSDF's per-request view: density, remaining time, projected gain and the throttle flag."""

    density: np.ndarray
    remaining_s: np.ndarray
    gain: np.ndarray
    throttled: np.ndarray
    best_effort: np.ndarray
    iteration_s: float
    arrival_s: np.ndarray  # for the best-effort requests' FCFS order


@dataclass(frozen=True, slots=True)
class ScalarDensities:
    """:class:`Densities` as plain lists (the plain-float path for short queues)."""

    density: list[float]
    remaining_s: list[float]
    gain: list[float]
    throttled: list[bool]
    best_effort: list[bool]
    iteration_s: float


def _decay(slo_s: np.ndarray, actual_s: np.ndarray, alpha: float) -> np.ndarray:
    return np.asarray(np.minimum(1.0, (slo_s / np.maximum(actual_s, 1e-6)) ** alpha))


@dataclass(frozen=True, slots=True)
class DensityInputs:
    """What LSDF reads of each request, one array per field (index i ↔ the i-th request): read from
    the snapshots (:func:`snapshot_inputs`) or from a :class:`SnapshotTable`'s columns
    (:func:`column_inputs`), the same values either way."""

    prompt: F64
    generated: F64
    computed: F64
    expected_out: F64  # seed_estimates.expected_output_tokens
    arrival_s: F64
    weight: F64
    latency: B8
    best_effort: B8
    ttft_s: F64  # a latency request's TTFT and TBT (1.0 where unset, 0 or another kind)
    tbt_s: F64
    deadline_rel_s: F64  # _deadline_rel_s (1.0 for a latency request)
    stage_group: I64  # one code per (compound program, stage), -1 outside a compound program


def snapshot_inputs(reqs: Sequence[RequestView]) -> DensityInputs:
    """:class:`DensityInputs` of ``reqs`` read from their snapshots."""
    cols: list[tuple[int, int, int, int, float, float, RequestKind]] = [
        (
            r.prompt_tokens,
            r.generated_tokens,
            r.computed_tokens,
            expected_output_tokens(r),
            r.arrival_s,
            r.slo.priority_weight,
            r.slo.kind,
        )
        for r in reqs
    ]
    c_prompt, c_gen, c_computed, c_out, c_arrival, c_weight, kinds = (
        zip(*cols, strict=True) if cols else ((),) * 7
    )
    lat_kind = RequestKind.LATENCY
    latency = np.array([k is lat_kind for k in kinds], dtype=np.bool_)
    groups: dict[tuple[str, int | None], int] = {}
    compound = RequestKind.COMPOUND
    stage_group = [
        groups.setdefault((r.program_id, r.stage), len(groups))
        if r.program_id is not None and k is compound
        else -1
        for r, k in zip(reqs, kinds, strict=True)
    ]
    return DensityInputs(
        prompt=np.array(c_prompt, dtype=float),
        generated=np.array(c_gen, dtype=float),
        computed=np.array(c_computed, dtype=float),
        expected_out=np.array(c_out, dtype=float),
        arrival_s=np.array(c_arrival, dtype=float),
        weight=np.array(c_weight, dtype=float),
        latency=latency,
        best_effort=np.array([k is RequestKind.BEST_EFFORT for k in kinds], dtype=np.bool_),
        ttft_s=np.array(
            [(r.slo.ttft_s or 1.0) if k is lat_kind else 1.0 for r, k in zip(reqs, kinds, strict=True)],
            dtype=float,
        ),
        tbt_s=np.array(
            [(r.slo.tbt_s or 1.0) if k is lat_kind else 1.0 for r, k in zip(reqs, kinds, strict=True)],
            dtype=float,
        ),
        deadline_rel_s=np.array([_deadline_rel_s(r) for r in reqs], dtype=float),
        stage_group=np.array(stage_group, dtype=np.int64),
    )


def column_inputs(c: Columns, order: I64) -> DensityInputs:
    """:class:`DensityInputs` of the requests ``c.ids[order]``, from a SnapshotTable's columns: the
    values :func:`snapshot_inputs` reads from their snapshots (tested bit for bit)."""
    kind = c.kind[order]
    latency = kind == LATENCY
    best_effort = kind == BEST_EFFORT
    gen = c.generated_tokens[order]
    g1 = gen + 1.0
    bound = c.output_bound[order]
    max_tokens = c.max_tokens[order]
    expected_out = np.where(
        bound == bound,  # noqa: PLR0124 (NaN: no bound)
        np.maximum(bound, g1),
        np.where(max_tokens > 0, np.maximum(max_tokens, g1), np.maximum(float(DEFAULT_OUTPUT_TOKENS), g1)),
    )
    arrival = c.arrival_s[order]
    ttft = c.ttft_s[order]
    tbt = c.tbt_s[order]
    # `slo.ttft_s or 1.0`: unset (NaN) or 0 reads 1.0
    ttft = np.where(latency & (ttft == ttft) & (ttft != 0.0), ttft, 1.0)  # noqa: PLR0124
    tbt = np.where(latency & (tbt == tbt) & (tbt != 0.0), tbt, 1.0)  # noqa: PLR0124
    deadline_at = c.deadline_at_s[order]
    slo_deadline = c.slo_deadline_s[order]
    rel = np.where(
        deadline_at == deadline_at,  # noqa: PLR0124
        deadline_at - arrival,
        np.where(
            slo_deadline == slo_deadline,  # noqa: PLR0124
            slo_deadline,
            np.where(best_effort, DEFAULT_BEST_EFFORT_DEADLINE_S, np.nan),
        ),
    )
    rel = np.where(latency, 1.0, rel)
    if np.isnan(rel).any():  # SLOTargets.effective_deadline_s would raise for the snapshot
        raise ValueError("a deadline request without a deadline")
    program = c.program[order]
    stage = c.stage[order]
    in_program = (kind == COMPOUND) & (program >= 0)
    stages = int(stage.max()) + 2 if len(stage) else 1
    stage_group = np.where(in_program, program * stages + (stage + 1), -1)
    return DensityInputs(
        prompt=c.prompt_tokens[order],
        generated=gen,
        computed=c.computed_tokens[order],
        expected_out=expected_out,
        arrival_s=arrival,
        weight=c.weight[order],
        latency=latency,
        best_effort=best_effort,
        ttft_s=ttft,
        tbt_s=tbt,
        deadline_rel_s=rel,
        stage_group=stage_group,
    )


def iteration_s(prof: PerfProfile, n_running: int, kv_running: int) -> float:
    """The current decode-iteration time: ``n_running`` requests holding ``kv_running`` KV tokens."""
    return prof.iteration_time_from_sums_s(max(1, n_running), 0.0, kv_running)


def service_densities(
    reqs: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView, p: TempoParams
) -> Densities:
    """Compute LSDF's service density of every request in ``reqs`` from their snapshots (the
    reference the plain-float :func:`service_densities_scalar` and the column-read path must match
    bit for bit)."""
    prof = profile_or_fallback(engine.profile)
    t_it = iteration_s(prof, len(running), sum(r.kv_tokens for r in running))
    return densities_of(snapshot_inputs(reqs), t_it, engine.now_s, prof, p)


def densities_of(x: DensityInputs, t_it: float, now: float, prof: PerfProfile, p: TempoParams) -> Densities:
    """LSDF's densities of the requests ``x`` describes, in whole-array arithmetic."""
    prompt = x.prompt
    gen = x.generated
    computed = x.computed
    l_out = x.expected_out
    arrival = x.arrival_s
    latency = x.latency
    n = len(prompt)
    left_prompt = np.maximum(0.0, prompt + gen - computed)
    # remaining_prompt_tokens: a decoding request's newest token counts as uncomputed, not as a prefill
    left_prompt = np.where((gen > 0) & (left_prompt <= 1.0), 0.0, left_prompt)
    attn_ms = prof.b_ms_per_token_ctx * left_prompt * (computed + left_prompt)
    pref_ms = attn_ms + prof.a_ms_per_token * left_prompt
    t_pref = np.where(left_prompt > 0, overhead_s(prof) + pref_ms / 1000.0, 0.0)
    l_rem = np.maximum(1.0, l_out - gen)
    # a program stage completes with its slowest call: every call of a stage gets the stage's max
    remaining = stage_sum(Groups(x.stage_group, x.stage_group >= 0), t_pref + l_rem * t_it, reduce_max=True)
    gain = np.zeros(n)
    if (~latency).any():
        ttlt = now + remaining - arrival
        base = p.input_weight * prompt + p.output_weight * l_out
        gain = np.where(~latency, base * _decay(x.deadline_rel_s, ttlt, p.alpha), 0.0)
    throttled = np.zeros(n, dtype=bool)
    if latency.any():
        ttft = x.ttft_s
        tbt = x.tbt_s
        elapsed = now - arrival
        first = np.where(gen == 0, p.input_weight * prompt * _decay(ttft, elapsed + t_pref, p.alpha), 0.0)
        frac = _FRAC
        k = gen[:, None] + frac[None, :] * (l_rem[:, None] - 1.0)
        due = ttft[:, None] + k * tbt[:, None]
        eta = elapsed[:, None] + t_pref[:, None] + (k - gen[:, None] + 1.0) * t_it
        tokens = p.output_weight * l_rem * _decay(due, eta, p.alpha).mean(axis=1)
        gain = np.where(latency, first + tokens, gain)
        next_due = ttft + gen * tbt - elapsed
        throttled = latency & (next_due > p.throttle_lead_tbts * tbt + t_pref)
    gain = gain * x.weight
    return Densities(
        gain / np.maximum(remaining, 1e-6), remaining, gain, throttled, x.best_effort, t_it, arrival
    )


def _sum16(v: list[float]) -> float:
    """numpy's pairwise sum of 16 float64 values (8 interleaved lanes, then pairwise): what
    ``.sum(axis=1)`` (and so ``.mean(axis=1)``) of an (n, 16) array computes per row."""
    r0 = v[0] + v[8]
    r1 = v[1] + v[9]
    r2 = v[2] + v[10]
    r3 = v[3] + v[11]
    r4 = v[4] + v[12]
    r5 = v[5] + v[13]
    r6 = v[6] + v[14]
    r7 = v[7] + v[15]
    return ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))


def scalar_alpha(alpha: float) -> bool:
    """Whether Python's ``x ** alpha`` is numpy's ``array ** alpha`` for this exponent (numpy turns
    1, 2, 0.5, -1 and 0 into other ufuncs; α = 1, Tempo's default, is exact either way)."""
    return alpha == 1.0


def service_densities_scalar(
    reqs: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView, p: TempoParams
) -> ScalarDensities:
    """:func:`service_densities` on plain floats for α = 1: the same operations in the same order
    per request (numpy's 16-sample mean is its pairwise sum, :func:`_sum16`), so bit-identical; a
    handful of queued requests costs far less than numpy's ~40 fixed-cost array calls."""
    prof = profile_or_fallback(engine.profile)
    now = engine.now_s
    t_it = iteration_s(prof, len(running), sum(r.kv_tokens for r in running))
    oh = overhead_s(prof)
    b_ms = prof.b_ms_per_token_ctx
    a_ms = prof.a_ms_per_token
    w_i = p.input_weight
    w_o = p.output_weight
    lead = p.throttle_lead_tbts
    lat_kind = RequestKind.LATENCY
    be_kind = RequestKind.BEST_EFFORT
    frac = _FRAC_LIST
    n = len(reqs)
    remaining = [0.0] * n
    t_prefs = [0.0] * n
    for i, r in enumerate(reqs):
        gen = float(r.generated_tokens)
        computed = float(r.computed_tokens)
        left = float(r.prompt_tokens) + gen - computed
        if left > 1.0 or (left > 0.0 and gen == 0.0):  # remaining_prompt_tokens (a decode: none)
            t_prefs[i] = oh + (b_ms * left * (computed + left) + a_ms * left) / 1000.0
        else:
            left = 0.0
        l_rem = float(expected_output_tokens(r)) - gen
        if l_rem < 1.0:  # noqa: PLR1730 (hot path: cheaper than max())
            l_rem = 1.0
        remaining[i] = t_prefs[i] + l_rem * t_it
    if any(r.program_id is not None for r in reqs):
        _collective_max(reqs, remaining)
    density = [0.0] * n
    gains = [0.0] * n
    throttled = [False] * n
    best_effort = [False] * n
    for i, r in enumerate(reqs):
        slo = r.slo
        kind = slo.kind
        prompt = float(r.prompt_tokens)
        gen = float(r.generated_tokens)
        l_out = float(expected_output_tokens(r))
        t_pref = t_prefs[i]
        rem = remaining[i]
        if kind is lat_kind:
            ttft = slo.ttft_s or 1.0
            tbt = slo.tbt_s or 1.0
            elapsed = now - r.arrival_s
            first = 0.0
            if gen == 0.0:
                x = elapsed + t_pref
                first = w_i * prompt * min(1.0, ttft / (x if x > 1e-6 else 1e-6))
            l_rem = l_out - gen
            if l_rem < 1.0:  # noqa: PLR1730
                l_rem = 1.0
            span = l_rem - 1.0
            base_eta = elapsed + t_pref
            v = []
            for f in frac:
                k = gen + f * span
                eta = base_eta + (k - gen + 1.0) * t_it
                v.append(min(1.0, (ttft + k * tbt) / (eta if eta > 1e-6 else 1e-6)))
            gain = first + w_o * l_rem * (_sum16(v) / 16.0)
            throttled[i] = ttft + gen * tbt - elapsed > lead * tbt + t_pref
        else:
            best_effort[i] = kind is be_kind
            ttlt = now + rem - r.arrival_s
            gain = (w_i * prompt + w_o * l_out) * min(
                1.0, _deadline_rel_s(r) / (ttlt if ttlt > 1e-6 else 1e-6)
            )
        gain = gain * slo.priority_weight
        gains[i] = gain
        density[i] = gain / (rem if rem > 1e-6 else 1e-6)
    return ScalarDensities(density, remaining, gains, throttled, best_effort, t_it)


def _deadline_rel_s(r: RequestView) -> float:
    """The (sub-)deadline relative to arrival; latency requests have none (unused for them)."""
    if r.kind is RequestKind.LATENCY:
        return 1.0
    if r.deadline_at_s is not None:
        return r.deadline_at_s - r.arrival_s
    return r.slo.effective_deadline_s


def _collective_max(reqs: Sequence[RequestView], remaining: list[float]) -> None:
    """gmax_priority's per-stage maximum on plain floats (the scalar path): every call of a program
    stage gets the stage's max R (in place)."""
    stages: dict[tuple[str, int | None], list[int]] = {}
    compound = RequestKind.COMPOUND
    for i, r in enumerate(reqs):
        if r.program_id is not None and r.slo.kind is compound:
            stages.setdefault((r.program_id, r.stage), []).append(i)
    for idx in stages.values():
        if len(idx) > 1:
            top = max([remaining[i] for i in idx])
            for i in idx:
                remaining[i] = top


class Ranked(NamedTuple):
    """One decision's requests (the running ones first): their densities, the priority order (indices),
    the request ids, and what preemption reads: a waiting request's KV need (prompt and output so
    far) and a running request's KV tokens, by index."""

    densities: Densities | ScalarDensities
    order: list[int]
    ids: list[str]
    need: Callable[[int], int]
    kv: Callable[[int], int]


class Tempo(BaseEnginePolicy):
    """Tempo's LSDF engine policy (see the module docstring)."""

    name = "tempo"
    reschedule_on_events = True
    # a quiet decision (nothing waits, every running request decodes) preempts nobody (preemption
    # makes room for a waiting request), rejects nobody and sets no knob: engines leave it out
    skip_quiet_decisions = True
    # a long queue's running snapshots are read only through the SnapshotTable, a short one's all
    live_running = True

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """Tempo's gain weights from the objective: token goodput counts input and output tokens alike,
        TDG only output tokens; tempo (and request, which Tempo cannot express per request) use
        spec.goodput's w_i, w_o and α."""
        g = objective.gain
        if objective.goodput == "token":
            return {"input_weight": 1.0, "output_weight": 1.0, "alpha": g.alpha}
        if objective.goodput == "tdg":
            return {"input_weight": 0.0, "output_weight": g.decode_token_weight, "alpha": g.alpha}
        return {"input_weight": g.input_weight, "output_weight": g.output_weight, "alpha": g.alpha}

    def __init__(self, params: TempoParams | None = None, **kwargs: object) -> None:
        self.params = params if params is not None else TempoParams.model_validate(kwargs)
        self.frame_steps = self.params.quantum_steps
        self._last_preempt_step: int | None = None
        # a long queue's fields, kept between decisions (only new or changed snapshots are re-read)
        self._table = SnapshotTable()

    def priority_order(self, d: Densities, max_num_seqs: int) -> list[int]:
        """SLO requests by density (throttled last), with the best-effort reserve placed inside the slots."""
        idx = np.arange(len(d.density))
        slo = idx[~d.best_effort]
        slo = slo[np.lexsort((-d.density[slo], d.throttled[slo]))]
        be_idx = idx[d.best_effort]
        be = be_idx[np.argsort(d.arrival_s[be_idx], kind="stable")].tolist()  # FCFS, ties by position
        reserve = min(len(be), math.ceil(self.params.reserve_fraction * max_num_seqs))
        head = max(0, max_num_seqs - reserve)
        return [*slo[:head].tolist(), *be[:reserve], *slo[head:].tolist(), *be[reserve:]]

    def priority_order_scalar(
        self, reqs: Sequence[RequestView], d: ScalarDensities, max_num_seqs: int
    ) -> list[int]:
        """:meth:`priority_order` on plain lists (both sorts are stable: the same order)."""
        n = len(reqs)
        be_flag = d.best_effort
        density = d.density
        throttled = d.throttled
        slo = [i for i in range(n) if not be_flag[i]]
        slo.sort(key=lambda i: (throttled[i], -density[i]))
        be = sorted((i for i in range(n) if be_flag[i]), key=lambda i: reqs[i].arrival_s)
        reserve = min(len(be), math.ceil(self.params.reserve_fraction * max_num_seqs))
        head = max(0, max_num_seqs - reserve)
        return [*slo[:head], *be[:reserve], *slo[head:], *be[reserve:]]

    def densities(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> Ranked:
        """The running then the waiting requests' densities and priority order: plain floats read
        from the snapshots for a short queue, whole arrays read through the policy's SnapshotTable
        otherwise (both bit-identical to :func:`service_densities`,
        ``tests/unit/core/policies/test_tempo_scalar.py``)."""
        n_running = len(running)
        if n_running + len(waiting) <= SCALAR_MAX and scalar_alpha(self.params.alpha):
            reqs = [*running, *waiting]
            ds = service_densities_scalar(reqs, running, engine, self.params)
            return Ranked(
                ds,
                self.priority_order_scalar(reqs, ds, engine.max_num_seqs),
                list(map(request_id_of, reqs)),
                lambda i: reqs[i].prompt_tokens + reqs[i].generated_tokens,
                lambda i: reqs[i].kv_tokens,
            )
        c = self._table.columns(waiting, running)  # the waiting requests' columns, then the running
        n_waiting = len(waiting)
        n = len(c)
        x = column_inputs(c, np.concatenate((np.arange(n_waiting, n), np.arange(n_waiting))))
        prof = profile_or_fallback(engine.profile)
        t_it = iteration_s(prof, n_running, int(x.computed[:n_running].sum()))
        d = densities_of(x, t_it, engine.now_s, prof, self.params)
        return Ranked(
            d,
            self.priority_order(d, engine.max_num_seqs),
            [*c.ids[n_waiting:], *c.ids[:n_waiting]],
            lambda i: int(x.prompt[i] + x.generated[i]),
            lambda i: int(x.computed[i]),
        )

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        n_running = len(running)
        if not n_running and not waiting:
            return Decision()
        ranked = self.densities(waiting, running, engine)
        order = ranked.order
        ids = ranked.ids
        victims = self._preemptions(ranked, n_running, engine)
        if victims:
            gone = set(victims)
            run_ids = [ids[i] for i in order if i < n_running and i not in gone]
        else:
            run_ids = [ids[i] for i in order if i < n_running]
        # the waiting requests' order, by position in ``waiting`` (ids lists the running ones first),
        # the admission pool when nothing is preempted
        at = [i - n_running for i in order if i >= n_running]
        wids = ids[n_running:]
        return Decision(
            admit=pick_ids(wids, at) if victims else positional(wids, at, len(waiting)),
            preempt=tuple(ids[i] for i in victims),
            running_order=tuple(run_ids),
            reason=f"lsdf n={len(ids)} preempt={len(victims)}",
        )

    def _preemptions(self, ranked: Ranked, n_running: int, engine: EngineView) -> list[int]:
        """Cost-aware preemption, allowed once per time quantum."""
        order = ranked.order
        d = ranked.densities
        step_ok = self._last_preempt_step is None or engine.step - self._last_preempt_step >= self.frame_steps
        if not step_ok or n_running == 0 or len(order) == n_running:
            return []
        prof = profile_or_fallback(engine.profile)
        slots = engine.max_num_seqs - n_running
        kv_free = engine.kv_tokens_free
        quantum_s = self.params.quantum_steps * d.iteration_s
        if isinstance(d, ScalarDensities):
            batch_rate = numpy_sum(d.density[:n_running])
        else:
            batch_rate = float(d.density[:n_running].sum())
        victims_order = [i for i in reversed(order) if i < n_running]
        victims: list[int] = []
        for w in order:
            if w < n_running:
                continue
            need = ranked.need(w)
            while (slots <= 0 or kv_free < need) and victims_order:
                v = victims_order[0]
                if d.density[w] <= d.density[v]:
                    break
                recompute_s = overhead_s(prof) + prefill_core_s(prof, ranked.kv(v), 0)
                loss = self.params.preemption_cost_scale * recompute_s * batch_rate
                if (d.density[w] - d.density[v]) * quantum_s <= loss:
                    break
                victims_order.pop(0)
                victims.append(v)
                slots += 1
                kv_free += ranked.kv(v)
            if slots <= 0 or kv_free < need:
                break
            slots -= 1
            kv_free -= need
        if victims:
            self._last_preempt_step = engine.step
        return victims
