"""Goodput functions, pure and selectable by name, computed from per-token delivery timestamps.

Every function takes a :class:`Delivery` — a request's arrival, its SLO, its input size and the
absolute time at which each output token was delivered — and returns a non-negative gain. The
priority weight of the request's class multiplies every function (PROSERVE §2).

``token`` (JITServe §3)
    latency: Σ_i 𝟙[t_i − arrival ≤ TTFT + i·TBT] over delivered output tokens (i 0-based);
    deadline / compound / best-effort: (L_in + L_out) if the request completed by its deadline, else 0.
``request`` (DistServe-style request goodput)
    1 if the request completed and met its SLO — for latency requests every token met its deadline
    TTFT + i·TBT (the token form keeps it monotone, unlike mean TPOT) — else 0.
``tempo`` (Tempo eq. 1–3, divisive decay f(SLO, x) = min(1, (SLO/x)^α))
    deadline / compound / best-effort: (w_i·L_in + w_o·L_out)·f(D, TTLT) if completed, else 0;
    latency: w_i·L_in·f(TTFT_SLO, TTFT) + Σ_i w_o·f(TTFT_SLO + i·TBT_SLO, t_i − arrival), i.e. each
    output token decays by how far it lags the expected progression (Tempo §3.1, eq. 3).
``tdg`` (PROSERVE eq. 3)
    Σ_i w(i)·𝟙[t_i − arrival < deadline_i], deadline_i = TTFT + i·TPOT (i 0-based), w(0) = w_p,
    w(i>0) = w_d; deadline-kind requests use their end-to-end deadline for every token.

Properties (PROSERVE §2, tested with hypothesis): delivering a token earlier never lowers gain,
delaying one never raises it, and a request that is discarded (tokens never delivered) forfeits
all of their gain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.slo import RequestKind, SLOTargets


@dataclass(frozen=True, slots=True)
class Delivery:
    """What happened to one request (or one whole compound program).

    ``token_times_s`` are absolute delivery times of the output tokens in order. For a compound
    program, pass the union of its calls' tokens, their summed input tokens, the program's arrival
    and ``completed`` only when its final call finished. ``times_in_order``: the caller guarantees
    the times never decrease (an engine's clock wrote them), which lets a latency request's on-time
    count read a few of them instead of every one; the count is the same either way.
    """

    slo: SLOTargets
    arrival_s: float
    input_tokens: int
    token_times_s: Sequence[float] = field(default_factory=tuple)
    completed: bool = True
    # the caller guarantees the times never decrease (an engine's clock): see _on_time_in_order
    times_in_order: bool = False

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def finish_s(self) -> float | None:
        """Time the last token arrived, or None when nothing was delivered."""
        return float(self.token_times_s[-1]) if len(self.token_times_s) else None

    def relative_times_s(self) -> np.ndarray:
        return np.asarray(self.token_times_s, dtype=float) - self.arrival_s


class GainParams(BaseModel):
    """Weights of the goodput functions (all dimensionless)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_weight: float = Field(1.0, ge=0, description="Tempo w_i: gain per input token")
    output_weight: float = Field(2.0, ge=0, description="Tempo w_o: gain per output token (1:2, Tempo §3.1)")
    alpha: float = Field(1.0, gt=0, description="Tempo decay exponent α in min(1, (SLO/x)^α)")
    first_token_weight: float = Field(1.0, ge=0, description="TDG w_p: gain of the first token")
    decode_token_weight: float = Field(1.0, ge=0, description="TDG w_d: gain of each later token")


GoodputFunction = Callable[[Delivery, GainParams], float]

_DEFAULT_PARAMS = GainParams()
# Timestamps are floats on a shared clock: a token "at" its deadline must not miss by rounding.
_EPS_S = 1e-9


def _met_deadline(d: Delivery) -> bool:
    finish = d.finish_s
    return d.completed and finish is not None and finish - d.arrival_s <= d.slo.effective_deadline_s + _EPS_S


def _latency_deadlines(d: Delivery, n: int) -> np.ndarray:
    assert d.slo.ttft_s is not None and d.slo.tbt_s is not None
    return d.slo.ttft_s + np.arange(n) * d.slo.tbt_s


# from this many tokens numpy's fixed cost per call is repaid (a plain loop: ~70 ns a token; numpy:
# ~4.5 µs a call, then ~15 ns a token; the crossover measured here is ~90 tokens)
_ON_TIME_NUMPY_FROM = 96


# blocks of up to this many tokens are counted one by one in _on_time_in_order
_IN_ORDER_LEAF = 8


def _on_time_in_order(times: Sequence[float], arrival: float, ttft: float, tbt: float) -> int:
    """:func:`_on_time_tokens`' count for times that never decrease, from a few of them.

    With the times in order and TBT ≥ 0, both sides of ``t_i − arrival ≤ (TTFT + i·TBT) + ε`` are
    non-decreasing in i, each as rounded (subtracting a constant, multiplying an exact integer by a
    non-negative float and adding constants are monotone in IEEE arithmetic). So a block of tokens
    lo..hi is all on time when its last token meets the first one's deadline, and all late when its
    first token misses the last one's deadline: each element's comparison would give the same answer
    (the same expressions, evaluated on the elements that bound them). Other blocks are halved.
    A request whose slack grows or shrinks steadily (decode steps shorter or longer than its TBT)
    costs ~2·log₂ n comparisons instead of n reads of times written over thousands of steps.
    """
    count = 0
    todo = [(0, len(times) - 1)]
    pop, push = todo.pop, todo.append
    while todo:
        lo, hi = pop()
        if hi - lo < _IN_ORDER_LEAF:
            for i in range(lo, hi + 1):
                if times[i] - arrival <= ttft + i * tbt + _EPS_S:
                    count += 1
        elif times[hi] - arrival <= ttft + lo * tbt + _EPS_S:
            count += hi - lo + 1
        elif times[lo] - arrival <= ttft + hi * tbt + _EPS_S:  # else: all of them late
            mid = (lo + hi) >> 1
            push((mid + 1, hi))
            push((lo, mid))
    return count


def _on_time_tokens(d: Delivery) -> int:
    """How many of a latency request's tokens met their deadline TTFT + i·TBT: the same IEEE
    operations, in the same order, on every path (``t − arrival ≤ (TTFT + i·TBT) + ε``)."""
    slo = d.slo
    ttft, tbt = slo.ttft_s, slo.tbt_s
    assert ttft is not None and tbt is not None
    times, arrival = d.token_times_s, d.arrival_s
    n = len(times)
    if d.times_in_order and n > _IN_ORDER_LEAF and tbt >= 0 and math.isfinite(tbt) and math.isfinite(ttft):
        return _on_time_in_order(times, arrival, ttft, tbt)
    if n < _ON_TIME_NUMPY_FROM:
        count = 0
        for i, t in enumerate(times):
            if t - arrival <= ttft + i * tbt + _EPS_S:
                count += 1
        return count
    rel = np.array(times, dtype=float)
    rel -= arrival
    deadlines = np.arange(n, dtype=float)
    deadlines *= tbt
    deadlines += ttft
    deadlines += _EPS_S
    return int(np.count_nonzero(rel <= deadlines))


def token_goodput(d: Delivery, params: GainParams = _DEFAULT_PARAMS) -> float:
    """JITServe §3 token-level goodput."""
    if d.slo.kind is RequestKind.LATENCY:
        return d.slo.priority_weight * _on_time_tokens(d)
    if _met_deadline(d):
        return d.slo.priority_weight * (d.input_tokens + d.output_tokens)
    return 0.0


def latency_token_outcome(d: Delivery, output_tokens: int) -> tuple[float, float, float]:
    """(token goodput, its ideal for ``output_tokens`` tokens, request goodput) of a latency request
    in one pass over its token times: the same values as :func:`token_goodput`, :func:`ideal_gain`
    and :func:`request_goodput` (the simulator's per-finish feedback, on its hot path)."""
    slo = d.slo
    assert slo.kind is RequestKind.LATENCY and slo.ttft_s is not None and slo.tbt_s is not None
    w = slo.priority_weight
    on_time = _on_time_tokens(d)
    # instantly delivered tokens sit at 0 s, never after ttft + i·tbt ≥ 0
    if slo.ttft_s >= 0 and slo.tbt_s >= 0:
        ideal = w * output_tokens
    else:
        ideal = ideal_gain(d, "token", output_tokens=output_tokens)
    n = len(d.token_times_s)
    met = d.completed and n > 0 and on_time == n
    return w * on_time, ideal, w if met else 0.0


def request_goodput(d: Delivery, params: GainParams = _DEFAULT_PARAMS) -> float:
    """1·w if the request completed within its SLO, else 0."""
    if not d.completed or d.output_tokens == 0:
        return 0.0
    if d.slo.kind is RequestKind.LATENCY:
        met = _on_time_tokens(d) == len(d.token_times_s)
    else:
        met = _met_deadline(d)
    return d.slo.priority_weight if met else 0.0


class SLOWatch:
    """:func:`request_goodput`'s met/missed rule kept while a request runs, for an engine that keeps no
    per-token times (the vLLM plugin, engine-sim): fed the output count after each step that changed it,
    it knows at the end whether the request met its SLO.

    A step's new tokens share the step's time and token deadlines grow with the index, so only the
    first new token can be the late one: latency requests check ``t - arrival <= TTFT + i·TBT`` for it
    (one float compare per step that made tokens, an int compare otherwise); other kinds check the last
    token against the deadline (``deadline_at_s``: the absolute one the request's tags carry, else
    arrival + the effective deadline). Fed every token's time, :meth:`met` equals
    ``request_goodput(d) > 0`` (tested with hypothesis).
    """

    __slots__ = ("arrival_s", "counted", "deadline_s", "last_s", "late", "tbt_s", "ttft_s")

    def __init__(self, slo: SLOTargets, arrival_s: float, deadline_at_s: float | None = None) -> None:
        self.arrival_s = arrival_s
        self.ttft_s = slo.ttft_s if slo.kind is RequestKind.LATENCY else None
        self.tbt_s = (slo.tbt_s or 0.0) if self.ttft_s is not None else 0.0
        self.deadline_s = 0.0  # relative to arrival (non-latency kinds)
        if self.ttft_s is None:
            self.deadline_s = slo.effective_deadline_s if deadline_at_s is None else deadline_at_s - arrival_s
        self.counted = 0
        self.late = False
        self.last_s = 0.0

    def tokens(self, total: int, now_s: float) -> None:
        """The request has ``total`` output tokens at ``now_s`` (those beyond the last count made now)."""
        if total <= self.counted:
            return
        if self.ttft_s is not None and not self.late:
            self.late = now_s - self.arrival_s > self.ttft_s + self.counted * self.tbt_s + _EPS_S
        self.counted, self.last_s = total, now_s

    def met(self, completed: bool) -> bool:
        """Did the request meet its SLO (False unless it completed with at least one token)."""
        if not completed or self.counted == 0:
            return False
        if self.ttft_s is not None:
            return not self.late
        return self.last_s - self.arrival_s <= self.deadline_s + _EPS_S


def _decay(slo_s: float | np.ndarray, actual_s: float | np.ndarray, alpha: float) -> Any:
    actual = np.maximum(actual_s, 1e-9)
    return np.minimum(1.0, (np.asarray(slo_s) / actual) ** alpha)


def tempo_gain(d: Delivery, params: GainParams = _DEFAULT_PARAMS) -> float:
    """Tempo's expected service gain with divisive decay (eq. 1–3)."""
    w = d.slo.priority_weight
    if d.slo.kind is RequestKind.LATENCY:
        rel = d.relative_times_s()
        if len(rel) == 0:
            return 0.0
        assert d.slo.ttft_s is not None
        first = params.input_weight * d.input_tokens * float(_decay(d.slo.ttft_s, rel[0], params.alpha))
        per_token = params.output_weight * _decay(_latency_deadlines(d, len(rel)), rel, params.alpha)
        return w * (first + float(np.sum(per_token)))
    finish = d.finish_s
    if not d.completed or finish is None:
        return 0.0
    base = params.input_weight * d.input_tokens + params.output_weight * d.output_tokens
    return w * base * float(_decay(d.slo.effective_deadline_s, finish - d.arrival_s, params.alpha))


def tdg_gain(d: Delivery, params: GainParams = _DEFAULT_PARAMS) -> float:
    """PROSERVE's token-level deadline-aware gain (eq. 3)."""
    rel = d.relative_times_s()
    if len(rel) == 0:
        return 0.0
    if d.slo.kind is RequestKind.LATENCY:
        deadlines = _latency_deadlines(d, len(rel))
    else:
        deadlines = np.full(len(rel), d.slo.effective_deadline_s)
    weights = np.full(len(rel), params.decode_token_weight)
    weights[0] = params.first_token_weight
    return d.slo.priority_weight * float(np.sum(weights[rel < deadlines - _EPS_S]))


GOODPUT_FUNCTIONS: dict[str, GoodputFunction] = {
    "token": token_goodput,
    "request": request_goodput,
    "tempo": tempo_gain,
    "tdg": tdg_gain,
}


def goodput_function(name: str) -> GoodputFunction:
    """Look a goodput function up by name, with an error that lists the valid names."""
    try:
        return GOODPUT_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown goodput function {name!r}; choose one of: {', '.join(sorted(GOODPUT_FUNCTIONS))}"
        ) from None


def ideal_gain(
    d: Delivery, name: str, params: GainParams = _DEFAULT_PARAMS, output_tokens: int | None = None
) -> float:
    """The gain the request would earn if every token arrived instantly (the denominator of ratios).

    ``output_tokens`` is the request's full output length (defaults to what was delivered).
    """
    n = d.output_tokens if output_tokens is None else output_tokens
    instant = Delivery(
        slo=d.slo,
        arrival_s=d.arrival_s,
        input_tokens=d.input_tokens,
        token_times_s=tuple([d.arrival_s] * n),
        completed=True,
    )
    return goodput_function(name)(instant, params)
