"""Learning to Rank (Fu et al., NeurIPS 2024; a JITServe §6.1 baseline): admit by predicted length.

Until the real predictor lands, lengths come from a noisy oracle with a chosen Kendall rank
correlation τ to the truth. With standardized log-lengths z = (ln L − μ)/σ and independent noise
ε ~ N(0, 1), the score s = ρ·z + √(1−ρ²)·ε is bivariate normal with z at correlation ρ, whose Kendall
τ is (2/π)·asin(ρ) (Greiner's relation) — so ρ = sin(π·τ/2) hits the requested τ when log-lengths are
normal. The predicted length is exp(μ + σ·s). ε is drawn from a generator seeded by (seed,
request id): a request's prediction does not depend on what else is queued or on call order.
A request that carries an ``output_bound`` (the real predictor's) is ranked by it instead. The rank
key is the predicted *remaining* output (prediction minus tokens already generated), which matters
for requests requeued after a preemption. Non-preemptive; the paper's starvation counter is left out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView

_EVENTS_ONLY = 1 << 30
_CACHE_LIMIT = 1 << 17  # predictions are recomputable; the cache only saves re-seeding


class NoisyOraclePredictor:
    """Predicts output lengths from the true ones with a given Kendall τ (see module docstring)."""

    def __init__(self, kendall_tau: float, log_mean: float, log_std: float, seed: int = 0) -> None:
        if not 0.0 <= kendall_tau <= 1.0:
            raise ValueError(f"kendall_tau must be in [0, 1], got {kendall_tau}")
        self.rho = math.sin(math.pi * kendall_tau / 2.0)
        self.log_mean = log_mean
        self.log_std = log_std
        self.seed = seed
        self._cache: dict[str, float] = {}

    def predict(self, request_id: str, true_tokens: int) -> float:
        """Predicted output tokens of a request (deterministic per request id)."""
        cached = self._cache.get(request_id)
        if cached is not None:
            return cached
        z = (math.log(max(1, true_tokens)) - self.log_mean) / self.log_std
        eps = random.Random(f"{self.seed}/{request_id}").gauss(0.0, 1.0)
        score = self.rho * z + math.sqrt(max(0.0, 1.0 - self.rho**2)) * eps
        predicted = math.exp(self.log_mean + self.log_std * score)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[request_id] = predicted
        return predicted

    def forget(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self._cache.pop(rid, None)


class LTRParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kendall_tau: float = Field(
        0.6, ge=0, le=1, description="Kendall rank correlation of predicted vs true length (dimensionless)"
    )
    log_mean: float = Field(5.2, description="mean of ln(output tokens) of the workload (ln tokens)")
    log_std: float = Field(1.1, gt=0, description="standard deviation of ln(output tokens) (ln tokens)")
    seed: int = Field(0, description="seed of the predictor's noise")
    use_output_bound: bool = Field(True, description="rank by a request's output_bound when it has one")


class LTR(BaseEnginePolicy):
    """Admit the request with the shortest predicted output first (ties: queue order)."""

    name = "ltr"
    frame_steps = _EVENTS_ONLY
    keyed_admission = True  # a waiting request's predicted remaining output does not move

    def __init__(self, **params: Any) -> None:
        self.params = LTRParams.model_validate(params)
        p = self.params
        self.predictor = NoisyOraclePredictor(p.kendall_tau, p.log_mean, p.log_std, p.seed)

    def predicted_tokens(self, r: RequestView) -> float:
        """Predicted total output tokens of ``r``: its output_bound, else the noisy oracle's."""
        if self.params.use_output_bound and r.output_bound is not None:
            return float(r.output_bound)
        true_len = r.true_output_tokens if r.true_output_tokens is not None else r.max_tokens
        return self.predictor.predict(r.request_id, true_len)

    def predicted_remaining_tokens(self, r: RequestView) -> float:
        return max(0.0, self.predicted_tokens(r) - r.generated_tokens)

    def admission_key(self, r: RequestView) -> float:
        return self.predicted_remaining_tokens(r)

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        keys = [self.predicted_remaining_tokens(r) for r in waiting]
        ranked = sorted(range(len(waiting)), key=lambda i: (keys[i], i))
        return Decision(admit=tuple(waiting[i].request_id for i in ranked), reason="ltr")
