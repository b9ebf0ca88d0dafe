"""Where the analyzer's output bound sits among the true lengths, per request kind, learned online.

GMAX reads a request's bound as a quantile of a log-normal of spread σ (``length_sigma``): the
bound is z·σ above the median in log space, and the feasibility test (gmax_priority and its scalar
twin gmax_scalar: the chance a deadline or compound request still finishes in time) uses that z.
The static reading takes z = Φ⁻¹(``bound_quantile``) for every request. The forest does not bound
every kind alike: on Tree-of-Thoughts calls its first bound is ~7–15x the true length, on
deep-research calls it is often below it (bench/results/gmax/issue15/learned_bound_screen).

With ``bound_reading='learned'`` each GMAX instance keeps, per request kind, the last
``bound_window`` values of log(first bound / true length) over the requests that finished on their
own (not cut at ``max_tokens``, whose true length is unknown) and reads the bound at z_k = m / σ,
where m is the lower end of a 95 % confidence interval for their median (the order statistic
⌊n/2 − 0.98·√n⌋ of n): it moves off the static z only when the finished requests show the bound
sitting higher, not on the noise of a kind whose bounds sit where the static reading puts them
(read at the plain median, conv's deep-research calls hovered just above the static z and GMAX's
goodput there moved by up to 0.03 a seed for nothing; bench/results/gmax/issue15/README.md). Never
below the static z (a bound is never read as less conservative than its quantile), never above
``bound_z_cap``; until ``bound_min_samples`` have finished, the static z.
The first bound is the first one GMAX saw for the request, capped at its ``max_tokens`` as GMAX
reads it (the analyzer refines bounds as tokens stream; the first is the one its waiting time was
judged by; in a real engine it may arrive a few tokens in, the analyzer answering asynchronously).

With ``calibrate_bound`` (the default) GMAX does not read the bound at z_k but scales it to where the
static reading puts it, bound·exp(−(z_k − z_static)·σ) (:meth:`BoundReading.scale_of`), and every
estimate uses the scaled bound: the feasibility test at the static z (the same chance of fitting),
and also t_gen, the value a stage pays, the pace budget and the demand floor's median, which read
the raw bound before. A Tree-of-Thoughts call with a 10x bound was planned as ten times the work it
is: its program looked too slow to start and its pace too tight (bench/results/gmax/issue15/README.md,
thirteenth pass). Without calibration only the feasibility test reads z_k; the demand floor then
kept the static reading's median: measured with the learned median there alone (a later latest
start for each pending request, so a lower floor), GMAX lost 0.01–0.02 of token goodput at
Tree-of-Thoughts x2, ShareGPT x2 and conv x1 overload seeds (eleventh pass).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

import numpy as np

from slo_core import detmath
from slo_core.policies.base import FinishedView
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import z_of_quantile
from slo_core.policies.gmax_snapshot import F64, I64, KIND_CODES, BoundCarrier

# first bounds of requests not yet finished; a request rejected or aborted never finishes here, so
# past this many the oldest quarter is dropped
MAX_TRACKED = 1 << 16
N_KINDS = len(KIND_CODES)


def median_lower_limit(values: Iterable[float]) -> float:
    """The lower end of a two-sided 95 % confidence interval for the median of ``values`` (distribution
    free: the order statistic ⌊n/2 − 0.98·√n⌋, the binomial's normal approximation)."""
    return lower_limit_of_sorted(sorted(values))


def lower_limit_of_sorted(ordered: Sequence[float]) -> float:
    """:func:`median_lower_limit` of values already in ascending order."""
    n = len(ordered)
    return ordered[max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))]


class BoundReading:
    """Per request kind, the z at which GMAX reads the analyzer's bound (see module docstring)."""

    __slots__ = (
        "_first",
        "_logs",
        "_scale",
        "_scale_rows",
        "_sorted_logs",
        "_z",
        "_z_rows",
        "calibrate",
        "cap",
        "learning",
        "min_samples",
        "sigma",
        "static_z",
    )

    def __init__(self, p: GMAXParams) -> None:
        analyzer = p.length_source == "analyzer"
        self.static_z = z_of_quantile(p.bound_quantile) if analyzer else 0.0
        self.learning = analyzer and p.bound_reading == "learned"
        self.calibrate = self.learning and p.calibrate_bound
        self.sigma = p.length_sigma
        self.cap = max(p.bound_z_cap, self.static_z)
        self.min_samples = p.bound_min_samples
        self._first: dict[str, float] = {}
        self._logs = [deque[float](maxlen=p.bound_window) for _ in range(N_KINDS)]
        # the same values kept in ascending order (a finish inserts one and evicts the oldest,
        # instead of sorting the window again)
        self._sorted_logs: list[list[float]] = [[] for _ in range(N_KINDS)]
        self._z = [self.static_z] * N_KINDS
        self._z_rows = np.array(self._z)
        self._scale = [1.0] * N_KINDS
        self._scale_rows = np.ones(N_KINDS)

    # ---- what GMAX reads ------------------------------------------------------------------------
    def z_of(self, kind: I64) -> F64:
        """z per row of a snapshot's kind codes."""
        out: F64 = self._z_rows[kind]
        return out

    def scale_of(self, kind: I64) -> F64:
        """Per row of a snapshot's kind codes, the factor that moves a bound from its kind's learned
        reading to the static one: exp(−(z_kind − z_static)·σ) ≤ 1."""
        out: F64 = self._scale_rows[kind]
        return out

    @property
    def scale_by_kind(self) -> list[float]:
        """:meth:`scale_of` per kind code (the same floats)."""
        return self._scale

    def rows(self, kind: I64) -> tuple[F64 | None, F64 | None]:
        """(``z_bound``, ``bound_scale``) for gmax_priority.estimate on rows of these kind codes: the
        learned z, or with ``calibrate`` the scale (the static z); (None, None) when not learning."""
        if not self.learning:
            return None, None
        if self.calibrate:
            return None, self.scale_of(kind)
        return self.z_of(kind), None

    def by_kind(self) -> tuple[list[float] | None, list[float] | None]:
        """:meth:`rows` per kind code, for gmax_scalar.scores (``z_by_kind``, ``scale_by_kind``)."""
        if not self.learning:
            return None, None
        if self.calibrate:
            return None, self._scale
        return self._z, None

    @property
    def z_by_kind(self) -> list[float]:
        """z per kind code (slo_core.policies.gmax_snapshot.KIND_CODES)."""
        return self._z

    # ---- what it learns from --------------------------------------------------------------------
    def first_seen(self, r: BoundCarrier) -> None:
        """Remember ``r``'s bound if it is the first seen (capped at ``max_tokens``; a bound below one
        token, which only a malformed tag could carry, is not learned from)."""
        bound = r.output_bound
        if bound is not None and bound >= 1 and r.request_id not in self._first:
            first = self._first
            first[r.request_id] = float(min(bound, r.max_tokens))
            if len(first) > MAX_TRACKED:
                for rid in list(islice(first, MAX_TRACKED // 4)):
                    del first[rid]

    def see(self, requests: Iterable[BoundCarrier]) -> None:
        first = self._first
        for r in requests:
            if r.request_id not in first:
                self.first_seen(r)

    def learn(self, finished: Sequence[FinishedView]) -> None:
        """Fold the requests that finished on their own into their kind's reading."""
        changed = False
        for f in finished:
            r = f.request
            bound = self._first.pop(r.request_id, None)
            g = r.generated_tokens
            if bound is None or not 0 < g < r.max_tokens:
                continue
            code = KIND_CODES[r.slo.kind]
            logs, ordered = self._logs[code], self._sorted_logs[code]
            value = math.log(bound / g)
            if len(logs) == logs.maxlen:
                del ordered[bisect_left(ordered, logs[0])]
            logs.append(value)
            insort(ordered, value)
            if len(logs) >= self.min_samples:
                z = min(self.cap, max(self.static_z, lower_limit_of_sorted(ordered) / self.sigma))
                if z != self._z[code]:
                    self._z[code] = z
                    changed = True
        if changed:
            self._z_rows = np.array(self._z)
            self._scale_rows = detmath.exp(-(self._z_rows - self.static_z) * self.sigma)
            self._scale = self._scale_rows.tolist()

    @property
    def tracked(self) -> int:
        """Requests whose first bound is remembered (for tests and memory checks)."""
        return len(self._first)
