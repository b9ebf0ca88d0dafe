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
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
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
from slo_core.policies.seed_estimates import (
    expected_output_tokens,
    overhead_s,
    prefill_core_s,
    profile_or_fallback,
)
from slo_core.slo import RequestKind

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


def service_densities(
    reqs: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView, p: TempoParams
) -> Densities:
    """Compute LSDF's service density of every request in ``reqs`` (vectorized; the reference the
    plain-float :func:`service_densities_scalar` must match bit for bit)."""
    prof = profile_or_fallback(engine.profile)
    now = engine.now_s
    kv_run = sum(r.kv_tokens for r in running)
    t_it = prof.iteration_time_from_sums_s(max(1, len(running)), 0.0, kv_run)
    n = len(reqs)
    # one pass over the snapshots (the fields as plain lists), then whole-array arithmetic
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
    prompt = np.array(c_prompt, dtype=float)
    gen = np.array(c_gen, dtype=float)
    computed = np.array(c_computed, dtype=float)
    l_out = np.array(c_out, dtype=float)
    arrival = np.array(c_arrival)
    weight = np.array(c_weight)
    latency = np.array([k is RequestKind.LATENCY for k in kinds])
    best_effort = np.array([k is RequestKind.BEST_EFFORT for k in kinds])
    left_prompt = np.maximum(0.0, prompt + gen - computed)
    # remaining_prompt_tokens: a decoding request's newest token counts as uncomputed, not as a prefill
    left_prompt = np.where((gen > 0) & (left_prompt <= 1.0), 0.0, left_prompt)
    attn_ms = prof.b_ms_per_token_ctx * left_prompt * (computed + left_prompt)
    pref_ms = attn_ms + prof.a_ms_per_token * left_prompt
    t_pref = np.where(left_prompt > 0, overhead_s(prof) + pref_ms / 1000.0, 0.0)
    l_rem = np.maximum(1.0, l_out - gen)
    remaining = t_pref + l_rem * t_it
    _collective_max(reqs, remaining)
    gain = np.zeros(n)
    if (~latency).any():
        deadline_rel = np.array([_deadline_rel_s(r) for r in reqs])
        ttlt = now + remaining - arrival
        base = p.input_weight * prompt + p.output_weight * l_out
        gain = np.where(~latency, base * _decay(deadline_rel, ttlt, p.alpha), 0.0)
    throttled = np.zeros(n, dtype=bool)
    if latency.any():
        lat_kind = RequestKind.LATENCY
        ttft = np.array(
            [(r.slo.ttft_s or 1.0) if k is lat_kind else 1.0 for r, k in zip(reqs, kinds, strict=True)]
        )
        tbt = np.array(
            [(r.slo.tbt_s or 1.0) if k is lat_kind else 1.0 for r, k in zip(reqs, kinds, strict=True)]
        )
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
    gain = gain * weight
    return Densities(gain / np.maximum(remaining, 1e-6), remaining, gain, throttled, best_effort, t_it)


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
    kv_run = sum(r.kv_tokens for r in running)
    t_it = prof.iteration_time_from_sums_s(max(1, len(running)), 0.0, kv_run)
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


def _collective_max(reqs: Sequence[RequestView], remaining: np.ndarray | list[float]) -> None:
    """A program stage completes with its slowest call: every call gets the stage's max R (in place)."""
    stages: dict[tuple[str, int | None], list[int]] = {}
    compound = RequestKind.COMPOUND
    for i, r in enumerate(reqs):
        if r.program_id is not None and r.slo.kind is compound:
            stages.setdefault((r.program_id, r.stage), []).append(i)
    if not stages:
        return
    # on plain floats (numpy's scalar reads and writes cost ~4x a list's): the same maxima
    values = remaining.tolist() if isinstance(remaining, np.ndarray) else remaining
    for idx in stages.values():
        if len(idx) > 1:
            top = max([values[i] for i in idx])
            for i in idx:
                values[i] = top
    if values is not remaining:
        remaining[:] = values


class Tempo(BaseEnginePolicy):
    """Tempo's LSDF engine policy (see the module docstring)."""

    name = "tempo"
    reschedule_on_events = True
    # a quiet decision (nothing waits, every running request decodes) preempts nobody (preemption
    # makes room for a waiting request), rejects nobody and sets no knob: engines leave it out
    skip_quiet_decisions = True

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

    def priority_order(self, reqs: Sequence[RequestView], d: Densities, max_num_seqs: int) -> list[int]:
        """SLO requests by density (throttled last), with the best-effort reserve placed inside the slots."""
        idx = np.arange(len(reqs))
        slo = idx[~d.best_effort]
        slo = slo[np.lexsort((-d.density[slo], d.throttled[slo]))]
        be = sorted(idx[d.best_effort], key=lambda i: reqs[i].arrival_s)
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
        self, reqs: Sequence[RequestView], running: Sequence[RequestView], engine: EngineView
    ) -> tuple[Densities | ScalarDensities, list[int]]:
        """The densities and the priority order: plain floats for a short queue (bit-identical to
        the numpy path, ``tests/unit/core/policies/test_tempo_scalar.py``), numpy otherwise."""
        if len(reqs) <= SCALAR_MAX and scalar_alpha(self.params.alpha):
            ds = service_densities_scalar(reqs, running, engine, self.params)
            return ds, self.priority_order_scalar(reqs, ds, engine.max_num_seqs)
        d = service_densities(reqs, running, engine, self.params)
        return d, self.priority_order(reqs, d, engine.max_num_seqs)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        reqs = [*running, *waiting]
        if not reqs:
            return Decision()
        d, order = self.densities(reqs, running, engine)
        n_running = len(running)
        victims = self._preemptions(reqs, n_running, order, d, engine)
        if victims:
            gone = set(victims)
            run_ids = [reqs[i].request_id for i in order if i < n_running and i not in gone]
        else:
            run_ids = [reqs[i].request_id for i in order if i < n_running]
        # the waiting requests' order, by position in ``waiting`` (reqs lists the running ones first),
        # the admission pool when nothing is preempted
        at = [i - n_running for i in order if i >= n_running]
        wids = list(map(request_id_of, waiting))
        return Decision(
            admit=pick_ids(wids, at) if victims else positional(wids, at, len(waiting)),
            preempt=tuple(reqs[i].request_id for i in victims),
            running_order=tuple(run_ids),
            reason=f"lsdf n={len(reqs)} preempt={len(victims)}",
        )

    def _preemptions(
        self,
        reqs: Sequence[RequestView],
        n_running: int,
        order: list[int],
        d: Densities | ScalarDensities,
        engine: EngineView,
    ) -> list[int]:
        """Cost-aware preemption, allowed once per time quantum."""
        step_ok = self._last_preempt_step is None or engine.step - self._last_preempt_step >= self.frame_steps
        if not step_ok or n_running == 0 or len(reqs) == n_running:
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
            need = reqs[w].prompt_tokens + reqs[w].generated_tokens
            while (slots <= 0 or kv_free < need) and victims_order:
                v = victims_order[0]
                if d.density[w] <= d.density[v]:
                    break
                recompute_s = overhead_s(prof) + prefill_core_s(prof, reqs[v].kv_tokens, 0)
                loss = self.params.preemption_cost_scale * recompute_s * batch_rate
                if (d.density[w] - d.density[v]) * quantum_s <= loss:
                    break
                victims_order.pop(0)
                victims.append(v)
                slots += 1
                kv_free += reqs[v].kv_tokens
            if slots <= 0 or kv_free < need:
                break
            slots -= 1
            kv_free -= need
        if victims:
            self._last_preempt_step = engine.step
        return victims
