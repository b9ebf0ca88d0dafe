"""Per-tenant attained service and GMAX's fairness blend (JITServe §4.3).

    priority'(r) = (1 − f)·priority(r) + f·Fair(r)·max_r priority(r)

Fair(r) = 1 − S(tenant(r)) / max_t S(t) ∈ [0, 1], where S(t) is the tenant's attained service in
tokens: tokens of its finished requests, decayed with a half-life, plus the tokens its requests in the
snapshot have already generated. Scaling Fair by the largest priority keeps priority' in goodput/s,
so the cutoff and preemption rules keep their units; f = 0 leaves priorities untouched.
"""

from __future__ import annotations

import math

import numpy as np

from slo_core.policies.gmax_snapshot import F64, I64


class TenantService:
    """Exponentially decayed attained service (tokens) per tenant."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.attained: dict[str, float] = {}
        self._last_s: float | None = None

    def _decay_to(self, now_s: float) -> None:
        if self._last_s is not None and now_s > self._last_s:
            factor = math.pow(0.5, (now_s - self._last_s) / self.half_life_s)
            for tenant in self.attained:
                self.attained[tenant] *= factor
        if self._last_s is None or now_s > self._last_s:
            self._last_s = now_s

    def add(self, tenant: str, tokens: float, now_s: float) -> None:
        self._decay_to(now_s)
        self.attained[tenant] = self.attained.get(tenant, 0.0) + tokens

    def fair(
        self, tenant_codes: I64, tenant_names: tuple[str, ...], in_flight_tokens: F64, now_s: float
    ) -> F64:
        """Fair(r) per request: 1 for the least-served tenant side, 0 for the most served."""
        self._decay_to(now_s)
        n_t = len(tenant_names)
        service = np.array([self.attained.get(t, 0.0) for t in tenant_names], dtype=np.float64)
        if len(tenant_codes):
            service = service + np.bincount(tenant_codes, weights=in_flight_tokens, minlength=n_t)[:n_t]
        top = float(service.max()) if n_t else 0.0
        if top <= 0:
            return np.ones(len(tenant_codes))
        out: F64 = 1.0 - service[tenant_codes] / top
        return out


def blend(priority: F64, fair: F64, f: float) -> F64:
    """priority' = (1 − f)·priority + f·Fair·max(priority)."""
    if f <= 0 or len(priority) == 0:
        return priority
    top = float(np.max(priority))
    out: F64 = (1.0 - f) * priority + f * fair * top
    return out
