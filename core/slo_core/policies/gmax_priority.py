"""GMAX's per-request estimates (JITServe §4.2): bound, t_gen, t_rem, bandwidth, goodput, priority.

For request r, with remaining-length bound len_rem(r) and per-token generation time v:

    t_gen(r) = t_prefill(uncomputed tokens) + len_rem(r)·v          upper-bound remaining time
    t_rem(r) = deadline(r) − now                                       time budget left
    bw(r)    = t_gen(r) / t_rem(r)   (latency requests: v / TBT — the TBT target sets the pace)
    priority(r) = goodput(r) / t_gen(r)                                margin goodput per bandwidth

goodput(r) is what the selected goodput function (slo_core.gain) would still pay for r if it were
served from now on at pace v: deadline-kind requests pay their tokens only when the projected finish
meets the deadline (the Appendix B scheduling filter t_rem − t_gen ≥ 0); a latency request pays for
each remaining token i whose projected delivery now + t_prefill + (i − g + 1)·v meets
arrival + TTFT + i·TBT. Compound calls aggregate len_rem, t_gen and goodput over the calls of the
current stage (same program and stage) and are judged against their program's deadline, the
only one the goodput functions pay for (``compound_deadline='stage'``: the analyzer's stage
sub-deadline, JITServe §4.1). Under the request and token goodputs, which pay a program once, for
all of its stages, when its last call finishes in time, a compound call's priority divides by the
program's remaining work: this stage's t_gen plus the time the analyzer reserved for the later
stages (program − stage sub-deadline), at this stage's parallelism (``program_rest``). The value is
not raised by the later stages' tokens (measured: finishing programs already under way serves more
of them). Waiting requests gain
δ·frames waited (starvation guard, in tokens; under the request goodput, where a request is worth
one, δ tokens' share of the request: δ/(prompt + bound)); best-effort requests use a default
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slo_core import detmath
from slo_core.perf.model import PerfProfile
from slo_core.policies.base import slots_twin
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_snapshot import B8, BEST_EFFORT, COMPOUND, F64, I64, LATENCY, Columns

_EPS_S = 1e-9
# goodputs that pay a compound program all at once, at its end, for which ``program_rest`` weighs a
# call against the program's remaining work (tempo also pays at the end, but was not measured with it)
PROGRAM_PAID = frozenset({"request", "token"})
_MIN_T_S = 1e-6
_MAX_F = float(np.finfo(np.float64).max)
_STAGE_KEY = 1_000_003  # a compound call's stage group: program · _STAGE_KEY + stage + 1


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """Per-token decode time and the marginal time of prefilling tokens (seconds)."""

    step_s: float
    prefill_s_per_token: float
    prefill_s_per_token_ctx: float = 0.0
    budget_tokens: int = 1 << 30

    @classmethod
    def from_profile(
        cls, profile: PerfProfile, n_seqs: int, sum_kv_tokens: float, budget_tokens: int
    ) -> SpeedModel:
        """Decode step of ``n_seqs`` sequences reading ``sum_kv_tokens`` KV tokens, and prefill costs."""
        step_ms = (
            profile.t_c_ms
            + max(profile.floor_ms, profile.a_ms_per_token * max(1, n_seqs))
            + profile.d_ms_per_kv_token * sum_kv_tokens
        )
        return _speed_model(
            step_ms / 1000.0,
            profile.a_ms_per_token / 1000.0,
            profile.b_ms_per_token_ctx / 1000.0,
            max(1, budget_tokens),
        )

    def scaled(self, factor: float) -> SpeedModel:
        return _speed_model(
            self.step_s * factor,
            self.prefill_s_per_token * factor,
            self.prefill_s_per_token_ctx * factor,
            self.budget_tokens,
        )

    def prefill_time_s(self, tokens: F64, context_before: F64) -> F64:
        """Time to prefill ``tokens`` more tokens after ``context_before``: chunk steps + marginal work."""
        chunks = np.ceil(tokens / self.budget_tokens)
        work = self.prefill_s_per_token * tokens + self.prefill_s_per_token_ctx * tokens * (
            context_before + tokens
        )
        out: F64 = np.where(tokens > 0, chunks * self.step_s + work, 0.0)
        return out


# built twice a GMAX decision (~19,000 decisions on the hour): through slots_twin, not the frozen
# dataclass's __init__
_SpeedModelSlots = slots_twin(
    SpeedModel, ("step_s", "prefill_s_per_token", "prefill_s_per_token_ctx", "budget_tokens")
)


def _speed_model(step_s: float, per_token: float, per_token_ctx: float, budget_tokens: int) -> SpeedModel:
    """``SpeedModel(step_s, per_token, per_token_ctx, budget_tokens)`` (equal to it), built fast."""
    m = object.__new__(_SpeedModelSlots)
    m.step_s = step_s
    m.prefill_s_per_token = per_token
    m.prefill_s_per_token_ctx = per_token_ctx
    m.budget_tokens = budget_tokens
    m.__class__ = SpeedModel
    out: SpeedModel = m
    return out


@dataclass(frozen=True, slots=True)
class Lengths:
    """The part of GMAX's estimates that neither the speed nor the goodput enters: what an SJF order
    (``ordering='sjf'``), the past-deadline drops and the pace budget read. Aligned with the
    :class:`Columns` they came from."""

    bound_tokens: F64
    len_rem_tokens: F64
    deadline_at_s: F64
    program_deadline_at_s: F64


@dataclass(frozen=True, slots=True)
class Estimates(Lengths):
    """Per-request GMAX estimates, aligned with the :class:`Columns` they came from."""

    t_gen_s: F64
    t_rem_s: F64
    bandwidth: F64
    goodput: F64
    priority: F64
    feasible: B8


def output_bound(c: Columns, p: GMAXParams, scale: F64 | None = None) -> F64:
    """Total output-length estimate per request: at most max_tokens, never below generated + 1
    (``scale``: per row, a factor on the analyzer's bound, gmax_bound's calibration)."""
    g = c.generated_tokens
    cap = np.minimum(float(p.fallback_output_tokens), c.max_tokens)
    if p.length_source == "mean":
        base = np.full(len(c), p.mean_output_tokens)
    else:
        analyzer = c.output_bound if scale is None else c.output_bound * scale
        base = np.where(np.isnan(c.output_bound), cap, analyzer)
        if p.length_source == "oracle":
            base = np.where(np.isnan(c.true_output_tokens), base, c.true_output_tokens)
    # A bound that generation already passed is relaxed by one refinement step (§4.1).
    base = np.where(base <= g, np.minimum(g + p.refine_every_tokens, c.max_tokens), base)
    out: F64 = np.maximum(np.minimum(base, c.max_tokens), g + 1.0)
    return out


def deadlines(c: Columns, p: GMAXParams) -> tuple[F64, F64]:
    """(deadline used for t_rem, program deadline) per request; NaN for latency requests.

    A compound call's deadline is its program's deadline (``compound_deadline='program'``: what the
    goodput functions pay for) or its stage sub-deadline, never later than the program's.
    """
    kind = c.kind
    is_cp = kind == COMPOUND
    slo_d = np.where(
        kind == BEST_EFFORT,
        np.where(np.isnan(c.slo_deadline_s), p.best_effort_deadline_s, c.slo_deadline_s),
        c.slo_deadline_s,
    )
    prog_arrival = np.where(np.isnan(c.program_arrival_s), c.arrival_s, c.program_arrival_s)
    program_default = np.where(
        np.isnan(c.program_deadline_at_s), prog_arrival + slo_d, c.program_deadline_at_s
    )
    own = np.where(np.isnan(c.deadline_at_s), c.arrival_s + slo_d, c.deadline_at_s)
    program: F64 = np.where(is_cp, program_default, own)
    if p.compound_deadline == "program":
        deadline: F64 = np.where(is_cp, program, own)
    else:
        deadline = np.where(is_cp, np.fmin(own_or(c.deadline_at_s, program), program), own)
    deadline = np.where(kind == LATENCY, np.nan, deadline)
    program = np.where(kind == LATENCY, np.nan, program)
    return deadline, program


def own_or(values: F64, fallback: F64) -> F64:
    """``values`` where set, else ``fallback``."""
    out: F64 = np.where(np.isnan(values), fallback, values)
    return out


def nan_to_num(x: F64, nan: float = 0.0) -> F64:
    """``np.nan_to_num(x, nan=nan)`` of a float64 array (±inf to ±the largest float) in four ufunc
    calls: numpy's own spends most of its time in Python, and GMAX calls it ~10 times a decision."""
    out: F64 = np.where(np.isnan(x), nan, np.minimum(np.maximum(x, -_MAX_F), _MAX_F))
    return out


def latency_on_time_tokens(c: Columns, now_s: float, t_pre: F64, bound: F64, v: float) -> tuple[F64, B8]:
    """(remaining tokens i ∈ [g, bound) delivered by arrival + TTFT + i·TBT, next token on time)."""
    g = c.generated_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        c0 = now_s + t_pre + (1.0 - g) * v - c.arrival_s - c.ttft_s - _EPS_S
        k = c.tbt_s - v
        ratio = c0 / k
        first = np.maximum(g, np.ceil(ratio))
        grow = np.maximum(0.0, bound - first)
        last = np.minimum(bound - 1.0, np.floor(ratio))
        shrink = np.maximum(0.0, last - g + 1.0)
        flat = np.where(c0 <= 0, bound - g, 0.0)
        n_on = np.where(k > 0, grow, np.where(k < 0, shrink, flat))
        next_on = c0 <= g * k
    return nan_to_num(n_on), next_on


def normal_cdf(x: F64) -> F64:
    """Φ(x), vectorized (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7); ±inf map to 1 and 0."""
    x0 = np.where(np.isnan(x), 0.0, x)
    # |x| capped at 40 (exp(-800) is 0.0: erf is exactly 1 from |x| ≈ 38 on, capped or not)
    z = np.abs(np.minimum(np.maximum(x0, -40.0), 40.0)) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * detmath.exp(-z * z)
    out: F64 = np.where(x0 >= 0, 0.5 * (1.0 + erf), 0.5 * (1.0 - erf))
    return out


_Z_OF_QUANTILE: dict[float, float] = {}


def z_of_quantile(q: float) -> float:
    """Φ⁻¹(q) by bisection on :func:`normal_cdf` (cached; q in (0.5, 1))."""
    z = _Z_OF_QUANTILE.get(q)
    if z is None:
        lo, hi = 0.0, 10.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if float(normal_cdf(np.array([mid]))[0]) < q:
                lo = mid
            else:
                hi = mid
        z = _Z_OF_QUANTILE[q] = 0.5 * (lo + hi)
    return z


# Φ (normal_cdf) is exactly 1.0 from x = 8.2454 on (1 − erf below half an ulp of 1; tested on a fine
# grid from 8.25): a row whose upper argument is at least 8.3 by fit_probability's ratio test is
# certain of it, the test's rounding (~1e-14 in log space, ~1e-14/σ in the argument) being far
# below the 0.05 margin while σ ≥ _SIGMA_MIN. Φ(5) is below 1 − 1e-7, so a lower argument of at most
# 5 leaves 1 − lo far above fit_probability's floor of 1e-12.
_X_CERTAIN = 8.3
_X_ROOM = 5.0
_SIGMA_MIN = 1e-6


def fit_probability(generated: F64, bound: F64, slack_tokens: F64, sigma: float, z_bound: F64 | float) -> F64:
    """P(true total length ≤ generated + slack | true length > generated).

    The true length is log-normal with spread ``sigma`` whose ``Φ(z_bound)`` quantile is ``bound``
    (z_bound = 0: the bound is the median; one z, or one per row; sigma = 0 is handled by the caller
    as a yes/no test). A row with no slack (≤ 0) has probability 0; the CDFs are evaluated only for the
    other rows, and the lower one only for rows that started generating (elementwise ufuncs: each row's
    value is the one a whole-array evaluation gives, bit for bit, tested).
    """
    out: F64 = np.zeros(len(generated))
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = np.flatnonzero(~(slack_tokens <= 0))  # NaN slack is evaluated (and ends at 0 or Φ's 0.5)
        if len(rows) == 0:
            return out
        g = generated[rows]
        z = z_bound[rows] if isinstance(z_bound, np.ndarray) else z_bound
        b, total = np.maximum(bound[rows], 1.0), np.maximum(g + slack_tokens[rows], 1e-9)
        # Rows certain to fit take 1 without a log or a Φ: where the upper argument is at least
        # _X_CERTAIN Φ gives exactly 1, and where the lower one is at most _X_ROOM, 1 − lo ≥ 1e-7, so
        # p = (1 − lo) / (1 − lo) = 1 exactly (tested bit for bit against evaluating every row; a
        # spread below _SIGMA_MIN evaluates every row). At a deep queue most waiting calls have
        # slack to spare.
        if sigma >= _SIGMA_MIN:
            with np.errstate(over="ignore"):
                certain = (
                    (b < np.inf)  # an infinite bound's arguments are NaN or −inf
                    & (total >= b * np.exp(sigma * (_X_CERTAIN - z)))
                    & (g <= b * np.exp(sigma * (_X_ROOM - z)))
                )
            if certain.any():
                out[rows[certain]] = 1.0
                keep = ~certain
                rows, g, b, total = rows[keep], g[keep], b[keep], total[keep]
                if isinstance(z, np.ndarray):
                    z = z[keep]
                if len(rows) == 0:
                    return out
        n = len(rows)
        started = np.flatnonzero(g > 0)
        # one log and one Φ call over all their arguments (each call has a fixed cost; per element
        # the result is the one separate calls give)
        logs = detmath.log(np.concatenate((b, total, np.maximum(g[started], 1e-9))))
        log_b = logs[:n]
        z_s = z[started] if isinstance(z, np.ndarray) else z
        x_hi = (logs[n : 2 * n] - log_b) / sigma + z
        cdf = normal_cdf(np.concatenate((x_hi, (logs[2 * n :] - log_b[started]) / sigma + z_s)))
        hi = cdf[:n]
        lo = np.zeros(n)
        lo[started] = cdf[n:]
        p = (hi - lo) / np.maximum(1.0 - lo, 1e-12)
        out[rows] = np.where(np.isnan(p), 0.0, np.minimum(np.maximum(p, 0.0), 1.0))
    return out


def _decay(slo_s: F64, actual_s: F64, alpha: float) -> F64:
    """Tempo's min(1, (SLO/x)^α), 0 for an SLO already behind (SLO ≤ 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.clip(np.maximum(slo_s, 0.0) / np.maximum(actual_s, _MIN_T_S), 0.0, 1.0)
        out: F64 = nan_to_num(ratio**alpha)
    return out


class Groups:
    """Rows under ``mask`` grouped by ``key`` (np.unique once per key, reused by every aggregate).
    ``keys``: the groups' keys, ascending (group j has ``keys[j]``)."""

    __slots__ = ("inv", "keys", "mask", "n")

    def __init__(self, key: np.ndarray, mask: B8) -> None:
        self.mask = mask
        if mask.any():
            keys, inv = np.unique(key[mask], return_inverse=True)
            self.keys: np.ndarray = keys
            self.inv: I64 = inv
            self.n = len(keys)
        else:
            self.keys = np.zeros(0, dtype=np.int64)
            self.inv = np.zeros(0, dtype=np.int64)
            self.n = 0

    def coarser(self, divisor: int) -> Groups:
        """The same rows grouped by ``key // divisor``: what ``Groups(key // divisor, mask)`` gives
        (groups numbered by ascending key), from the groups' keys instead of every row's."""
        out = Groups.__new__(Groups)
        out.mask = self.mask
        if self.n == 0:
            out.keys, out.inv, out.n = self.keys, self.inv, 0
            return out
        keys, parent = np.unique(self.keys // divisor, return_inverse=True)
        out.keys, out.inv, out.n = keys, parent[self.inv], len(keys)
        return out


def stage_sum(groups: Groups, values: F64, reduce_max: bool = False) -> F64:
    """Replace values of the grouped rows by their per-group sum (or max); other rows unchanged."""
    out = values.copy()
    if groups.n == 0:
        return out
    mask, inv = groups.mask, groups.inv
    if reduce_max:
        agg = np.full(groups.n, -np.inf)
        np.maximum.at(agg, inv, values[mask])
    else:
        agg = np.bincount(inv, weights=values[mask], minlength=groups.n)
    out[mask] = agg[inv]
    return out


def stage_product(groups: Groups, p: F64) -> F64:
    """Per row, exp(Σ log p) over its group (its own p outside one), detmath's log and exp evaluated
    only where they have work: detmath's log is 0 at 1 and −inf at ±0, its exp 1 at ±0 and 0 at −inf,
    so those rows take the constants (bit for bit what evaluating every row gives, tested). At a deep
    queue nearly every row's probability of finishing in time is 1."""
    one = p == 1.0
    inner = np.flatnonzero(~(one | (p == 0.0)))
    logs = np.where(one, 0.0, -np.inf)
    if len(inner):
        with np.errstate(divide="ignore", invalid="ignore"):
            logs[inner] = detmath.log(p[inner])
    log_p = stage_sum(groups, logs)
    zero = log_p == 0.0
    out: F64 = np.where(zero, 1.0, 0.0)
    inner = np.flatnonzero(~(zero | (log_p == -np.inf)))
    if len(inner):
        out[inner] = detmath.exp(log_p[inner])
    return out


def _prior_tokens(c: Columns, stage_mask: B8, by_program: Groups) -> F64:
    """Tokens a compound program earned in earlier stages: its attained service minus what the
    program's calls in this snapshot have attained so far (prompt once it is done, plus outputs)."""
    g = c.generated_tokens
    live = np.where(g > 0, c.prompt_tokens, np.minimum(c.computed_tokens, c.prompt_tokens)) + g
    live_sum = stage_sum(by_program, live)
    out: F64 = np.where(stage_mask, np.maximum(0.0, c.program_attained_tokens - live_sum), 0.0)
    return out


def _lengths(c: Columns, p: GMAXParams, bound_scale: F64 | None) -> tuple[Lengths, B8, Groups]:
    """(:class:`Lengths`, the rows that are calls of a compound program's stage, those rows grouped
    by stage): the first part of :func:`estimate`."""
    bound = output_bound(c, p, bound_scale)
    stage_mask = (c.kind == COMPOUND) & (c.program >= 0)
    stages = Groups(c.program * _STAGE_KEY + c.stage + 1, stage_mask)
    deadline, program_deadline = deadlines(c, p)
    out = Lengths(
        bound_tokens=bound,
        len_rem_tokens=stage_sum(stages, bound - c.generated_tokens),
        deadline_at_s=deadline,
        program_deadline_at_s=program_deadline,
    )
    return out, stage_mask, stages


def lengths(c: Columns, p: GMAXParams, bound_scale: F64 | None = None) -> Lengths:
    """:class:`Lengths` alone (what :func:`estimate` starts from), for a decision that reads nothing
    else."""
    return _lengths(c, p, bound_scale)[0]


def estimate(
    c: Columns,
    now_s: float,
    speed: SpeedModel,
    p: GMAXParams,
    frame_s: float,
    *,
    z_bound: F64 | None = None,
    bound_scale: F64 | None = None,
) -> Estimates:
    """All of GMAX's per-request quantities, vectorized over the snapshot.

    ``z_bound``: per row, how many σ above the median the analyzer's bound sits (gmax_bound); None:
    Φ⁻¹(``bound_quantile``) for every row. ``bound_scale``: per row, a factor on the analyzer's bound
    (gmax_bound's calibration; pass it with ``z_bound`` None)."""
    v = speed.step_s
    g, prompt, w, kind = c.generated_tokens, c.prompt_tokens, c.weight, c.kind
    gp = p.gain
    ln, stage_mask, stages = _lengths(c, p, bound_scale)
    bound, deadline, program_deadline = ln.bound_tokens, ln.deadline_at_s, ln.program_deadline_at_s
    len_rem = bound - g
    uncomputed = np.maximum(0.0, prompt + g - c.computed_tokens)
    t_pre = speed.prefill_time_s(uncomputed, c.computed_tokens)
    t_gen = t_pre + len_rem * v

    is_lat = kind == LATENCY
    t_finish = stage_sum(stages, t_gen, reduce_max=True)  # stage calls run in parallel
    t_gen_agg = stage_sum(stages, t_gen)  # bandwidth: every call holds a slot
    dl = nan_to_num(deadline, nan=-np.inf)
    feasible_deadline = now_s + t_finish <= dl + _EPS_S
    if p.feasibility == "probabilistic" and p.length_source != "oracle":
        # P(this call fits before its deadline); a stage needs all of its calls: the product.
        slack = (dl - now_s - t_pre) / v
        z_b: F64 | float = 0.0
        if p.length_source == "analyzer":
            z_b = z_of_quantile(p.bound_quantile) if z_bound is None else z_bound
        p_fit = fit_probability(g, bound, slack, p.length_sigma, z_b)
        p_on_time = stage_product(stages, p_fit)
    else:
        p_on_time = feasible_deadline.astype(np.float64)

    if is_lat.any():
        n_on, next_on = latency_on_time_tokens(c, now_s, t_pre, bound, v)
    else:  # read only through np.where(is_lat, ...) below: any value gives the same arrays
        n_on, next_on = np.zeros(len(c)), np.zeros(len(c), dtype=np.bool_)
    tokens = stage_sum(stages, prompt + bound)
    # a stage key's program is key // _STAGE_KEY while its stage lies in [-1, _STAGE_KEY - 2]
    stage_range_ok = stages.n == 0 or (
        int(c.stage[stage_mask].min()) >= -1 and int(c.stage[stage_mask].max()) <= _STAGE_KEY - 2
    )
    programs = stages.coarser(_STAGE_KEY) if stage_range_ok else Groups(c.program, stage_mask)
    prior = _prior_tokens(c, stage_mask, programs)
    tokens = tokens + prior
    fdl = p_on_time
    if p.goodput == "token":
        gd = tokens * fdl
        gl = n_on
    elif p.goodput == "request":
        gd = fdl
        gl = (n_on >= len_rem).astype(np.float64)
    elif p.goodput == "tempo":
        arrival = np.where(np.isnan(c.program_arrival_s), c.arrival_s, c.program_arrival_s)
        base = stage_sum(stages, gp.input_weight * prompt + gp.output_weight * bound)
        base = base + gp.output_weight * prior
        gd = base * _decay(deadline - arrival, now_s + t_finish - arrival, gp.alpha)
        due_last = c.ttft_s + (bound - 1.0) * c.tbt_s
        late = _decay(due_last, now_s + t_gen - c.arrival_s, gp.alpha)
        first = np.where(
            g == 0,
            gp.input_weight * prompt * _decay(c.ttft_s, now_s + t_pre + v - c.arrival_s, gp.alpha),
            0.0,
        )
        gl = first + gp.output_weight * (n_on + (len_rem - n_on) * late)
    else:  # tdg
        n_dl = np.clip(np.floor((nan_to_num(deadline) - now_s - t_pre) / v), 0.0, len_rem)
        gd = gp.decode_token_weight * n_dl + (gp.first_token_weight - gp.decode_token_weight) * (
            (g == 0) & (n_dl >= 1)
        )
        gl = gp.decode_token_weight * n_on + (gp.first_token_weight - gp.decode_token_weight) * (
            (g == 0) & next_on
        )
    goodput = w * np.where(is_lat, gl, gd)

    waited_s = np.maximum(0.0, now_s - np.where(np.isnan(c.waiting_since_s), c.arrival_s, c.waiting_since_s))
    bonus = p.delta_per_frame * waited_s / max(frame_s, _MIN_T_S)
    if p.goodput == "request":  # δ tokens' share of a request worth one: the guard stays a guard
        bonus = bonus / (prompt + bound)
    goodput = goodput + np.where(c.running, 0.0, bonus)

    due_last_abs = c.arrival_s + c.ttft_s + (bound - 1.0) * c.tbt_s
    t_rem = np.where(is_lat, due_last_abs, deadline) - now_s
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bw = np.where(is_lat, v / c.tbt_s, np.where(t_rem > 0, t_gen_agg / t_rem, np.inf))
    work = t_gen_agg
    if p.program_rest and p.goodput in PROGRAM_PAID:
        # the goodput pays a program once, for all of its stages: its remaining work is this stage's
        # and the later stages', which the analyzer reserved (program − stage sub-deadline) time
        # for; they are taken to run as parallel as this one
        prog = nan_to_num(program_deadline)
        later_s = np.where(
            stage_mask, np.maximum(0.0, prog - np.fmin(own_or(c.deadline_at_s, prog), prog)), 0.0
        )
        work = t_gen_agg + later_s * t_gen_agg / np.maximum(t_finish, _MIN_T_S)
    priority = goodput / np.maximum(work, _MIN_T_S)
    feasible = np.where(is_lat, n_on > 0, feasible_deadline)
    return Estimates(
        bound_tokens=bound,
        len_rem_tokens=ln.len_rem_tokens,
        t_gen_s=t_gen_agg,
        t_rem_s=t_rem,
        deadline_at_s=deadline,
        program_deadline_at_s=program_deadline,
        bandwidth=bw,
        goodput=goodput,
        priority=priority,
        feasible=feasible,
    )
