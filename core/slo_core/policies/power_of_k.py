"""Power-of-K routing, GMAX's multi-replica extension (JITServe §4.3).

For each request, K replicas are sampled (K = M, all replicas, by default) and the request gets one
replica-specific GMAX priority on each — as if K dummy copies joined the replicas' queues:

    start_j    = now + queue_j,    queue_j = v_j · Σ_waiting expected remaining tokens / max_num_seqs_j
    t_gen_j    = t_prefill_j + len_rem · v_j           (v_j: replica j's decode step, from its profile)
    priority_j = goodput_j(start_j) / t_gen_j          (goodput_j: what the request still pays when it
                                                       starts at start_j — gmax_priority)

The request goes to the replica with the highest priority (ties: least outstanding tokens, then the
injected random generator); the other copies vanish, since none ever ran. A request that pays nothing
anywhere still goes to the least-loaded replica (best effort), never rejected here. Snapshots may be
stale; ``snapshot_s`` is not extrapolated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo_core.objective import Objective
from slo_core.policies.base import BaseRouterPolicy, ReplicaView, RequestView, RouteDecision
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import SpeedModel, estimate
from slo_core.policies.gmax_snapshot import SnapshotTable


class PowerOfKParams(BaseModel):
    """Parameters of power-of-K routing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int | None = Field(None, ge=1, description="replicas sampled per request (count); None = all")
    gmax: GMAXParams = Field(
        default_factory=GMAXParams, description="how a request's priority is estimated (as in the engine)"
    )


def _expected_remaining(r: RequestView) -> int:
    expected = r.output_bound if r.output_bound is not None else r.max_tokens
    return max(1, expected - r.generated_tokens)


class PowerOfK(BaseRouterPolicy):
    """Route to the sampled replica where the request's GMAX priority is highest."""

    name = "power-of-k"

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """The replica priorities estimate the objective's goodput, as GMAX in the engine does."""
        return {"gmax": {"goodput": objective.goodput, "gain": objective.gain.model_dump()}}

    def __init__(self, params: PowerOfKParams | None = None, **overrides: object) -> None:
        base = params.model_dump(exclude_unset=True) if params is not None else {}
        self.params = PowerOfKParams.model_validate({**base, **overrides})
        self._table = SnapshotTable()
        # A routed request has not waited yet: no starvation credit in its replica priorities.
        self._estimate_params = self.params.gmax.model_copy(update={"delta_per_frame": 0.0})

    def _speed(self, rep: ReplicaView) -> SpeedModel:
        g = self.params.gmax
        if rep.profile is None:
            return SpeedModel(
                g.default_step_s, 1.0 / g.default_prefill_tokens_per_s, 0.0, rep.max_num_batched_tokens
            )
        n = min(rep.max_num_seqs, len(rep.running) + 1)
        kv = sum(r.computed_tokens for r in rep.running)
        return SpeedModel.from_profile(rep.profile, n, kv, rep.max_num_batched_tokens)

    def _queue_s(self, rep: ReplicaView, speed: SpeedModel) -> float:
        waiting_tokens = sum(_expected_remaining(r) for r in rep.waiting)
        full = len(rep.running) >= rep.max_num_seqs or rep.kv_blocks_free <= 0
        ahead = waiting_tokens / max(1, rep.max_num_seqs)
        if full:  # until the nearest running request finishes
            ahead += min((_expected_remaining(r) for r in rep.running), default=0)
        return ahead * speed.step_s

    def priorities(self, request: RequestView, replicas: Sequence[ReplicaView], now_s: float) -> list[float]:
        """The request's priority on each replica (goodput per second of its generation time)."""
        c = self._table.columns([request], [])
        out: list[float] = []
        for rep in replicas:
            speed = self._speed(rep)
            start = now_s + self._queue_s(rep, speed)
            g = self._estimate_params
            est = estimate(c, start, speed, g, g.frame_steps * speed.step_s)
            out.append(float(est.priority[0]))
        return out

    def route(
        self,
        request: RequestView,
        replicas: Sequence[ReplicaView],
        now_s: float,
        rng: random.Random,
    ) -> RouteDecision:
        ok = list(replicas)
        if not ok:
            return RouteDecision(None, reason="no replica offered", retry_after_s=1.0)
        k = len(ok) if self.params.k is None else min(self.params.k, len(ok))
        sample = ok if k == len(ok) else rng.sample(ok, k)
        prio = self.priorities(request, sample, now_s)
        load = [float(r.outstanding_tokens) for r in sample]
        jitter = [rng.random() for _ in sample]
        order = np.lexsort((np.asarray(jitter), np.asarray(load), -np.asarray(prio)))
        best = int(order[0])
        return RouteDecision(
            sample[best].replica_id,
            reason=f"power-of-{k}: highest priority {prio[best]:.3g}",
            scores=tuple((r.replica_id, p) for r, p in zip(sample, prio, strict=True)),
        )
