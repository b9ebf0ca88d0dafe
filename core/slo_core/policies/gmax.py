"""GMAX, JITServe's engine-level scheduler (JITServe §4.2 Algorithm 1, §4.3, §5), and its ablations.

Each call scores every request with priority(r) = goodput(r) / t_gen(r) (gmax_priority), blends in
per-tenant fairness when f > 0 (gmax_fairness), and picks a batch of B requests (B = max_num_seqs,
fewer when the KV cache cannot hold them): keep requests with priority ≥ p·priority(r_(B)), sort them
by input length and take the window of B with the largest summed priority (gmax_select). p is tuned
online (gmax_tuning). Between frame boundaries (every Δ = ``frame_steps`` engine steps) only waiting
requests compete for free slots; at a frame boundary running requests compete too, and a running
request outside the chosen group is preempted for a blocked group member only when the projected
gain beats the stall of recomputing its KV. Waiting deadline/compound requests whose deadline has
passed are dropped under hard-deadline goodputs (they can no longer pay), and requests not started
within ``max_wait_s`` are dropped when it is set (§5). Each decision also caps the tokens of the next
engine steps so that the running requests keep the pace they need, with fresh latency requests
admitted first and prefilled outside the cap (gmax_budget): at overload, admitting every prompt that
fits slows every decode several-fold and the requests already started miss their deadlines.

Variants: ``gmax-oracle`` reads true lengths; ``gmax-no-analyzer`` uses the mean length;
``gmax-no-gmax`` orders by the shortest remaining bound (SJF on the analyzer's bounds), no preemption.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np

from slo_core.objective import Objective
from slo_core.perf.model import OnlineCorrection
from slo_core.policies import gmax_scalar as small
from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EngineView,
    FinishedView,
    RequestView,
    new_decision,
    pick_ids,
    positional,
)
from slo_core.policies.gmax_bound import BoundReading
from slo_core.policies.gmax_budget import (
    demand_floor_applies,
    latency_lane,
    latency_lane_small,
    median_remaining,
    median_remaining_small,
    pace_deadlines,
    step_budget,
    step_budget_small,
)
from slo_core.policies.gmax_fairness import TenantService, blend
from slo_core.policies.gmax_params import GMAXParams
from slo_core.policies.gmax_priority import Estimates, Lengths, SpeedModel, estimate, lengths
from slo_core.policies.gmax_select import (
    batch_capacity,
    best_window,
    cutoff_mask,
    plan_preemptions,
    preemption_gain_loss,
)
from slo_core.policies.gmax_snapshot import (
    B8,
    COMPOUND,
    DEADLINE,
    F64,
    I64,
    LATENCY,
    Columns,
    SnapshotTable,
)
from slo_core.policies.gmax_tuning import CutoffTuner


class GMAX(BaseEnginePolicy):
    """Grouped Margin Goodput Maximization (see module docstring)."""

    name = "gmax"
    reschedule_on_events = True
    # a quiet decision (nothing waits, every running request decodes) preempts nobody (only blocked
    # waiting members are preempted for), rejects nobody (only waiting requests are rejected) and sets
    # a pace budget of at least the running decodes (gmax_budget._budget_of): engines leave it out
    skip_quiet_decisions = True
    # running snapshots are read through the SnapshotTable, or (the scalar path) all iterated
    live_running = True
    _variant: ClassVar[dict[str, Any]] = {}

    @classmethod
    def objective_params(cls, objective: Objective) -> dict[str, object]:
        """The objective sets the goodput GMAX estimates, its weights and the fairness blend."""
        return {
            "goodput": objective.goodput,
            "gain": objective.gain.model_dump(),
            "fairness": objective.fairness,
            "fairness_half_life_s": objective.fairness_half_life_s,
        }

    def __init__(self, params: GMAXParams | None = None, **overrides: Any) -> None:
        base = params.model_dump(exclude_unset=True) if params is not None else {}
        self.params = GMAXParams(**{**self._variant, **base, **overrides})
        p = self.params
        self.frame_steps = p.frame_steps
        self.deep_queue_from = p.deep_queue_from
        self.deep_queue_every = p.deep_queue_every
        self.tuner = CutoffTuner(
            p.p_candidates, p.p_initial, p.tune_epoch_s, p.tune_explore, enabled=p.tune_p
        )
        self.service = TenantService(p.fairness_half_life_s)
        self.correction = OnlineCorrection(momentum=0.9)
        self.bounds = BoundReading(p)
        # a bound can arrive after a request's first snapshot (the analyzer answers asynchronously):
        # every re-read snapshot is looked at until one carries it
        self._table = SnapshotTable(on_fresh=self.bounds.see if self.bounds.learning else None)
        self._last_frame_step: int | None = None
        # the calm guard (calm_delta_per_frame): the params with the calm δ, and when this engine last
        # dropped a waiting request past its deadline
        self._calm_params: GMAXParams | None = None
        if p.calm_delta_per_frame is not None and p.drops_past_deadline:
            self._calm_params = p.model_copy(update={"delta_per_frame": p.calm_delta_per_frame})
        self._shed_at_s = -math.inf
        self._last_clock: tuple[float, int, float] | None = None  # (now, step, estimated step_s)
        self._last_estimates: Estimates | None = None
        # a decision that did not make the Estimates (the scalar path, SJF ordering) leaves what
        # makes them, called only when someone reads last_estimates
        self._pending: Callable[[], Estimates] | None = None

    @property
    def last_estimates(self) -> Estimates | None:
        """The per-request estimates of the last decision (computed on demand after a scalar or an
        SJF one)."""
        if self._pending is not None:
            self._last_estimates = self._pending()
            self._pending = None
        return self._last_estimates

    def _estimate_snapshots(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        now: float,
        speed: SpeedModel,
        p: GMAXParams,
    ) -> Estimates:
        return self._estimate(self._table.columns(waiting, running), now, speed, p)

    # ---- engine feedback -------------------------------------------------------------------
    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        if self.bounds.learning:
            self.bounds.learn(finished)
        for f in finished:
            self.tuner.record(f.gain, f.ideal_gain)
            if self.params.fairness > 0:
                r = f.request
                self.service.add(r.tenant, r.prompt_tokens + r.generated_tokens, now_s)

    # ---- helpers -----------------------------------------------------------------------------
    def _scoring_params(self, now_s: float) -> GMAXParams:
        """The params a decision at ``now_s`` scores with: with the calm guard on, the calm δ while no
        waiting request was dropped past its deadline for ``calm_window_s``."""
        calm = self._calm_params
        if calm is not None and now_s - self._shed_at_s > calm.calm_window_s:
            return calm
        return self.params

    def _estimate(
        self,
        c: Columns,
        now: float,
        speed: SpeedModel,
        p: GMAXParams,
        reading: tuple[F64 | None, F64 | None] | None = None,
    ) -> Estimates:
        """:func:`estimate` with the bound reading: the learned z per row, or (``calibrate_bound``)
        each bound scaled to the static reading (``p``: :meth:`_scoring_params`; ``reading``: the
        bound reading's rows taken earlier, else read now)."""
        z_bound, bound_scale = self.bounds.rows(c.kind) if reading is None else reading
        return estimate(
            c, now, speed, p, p.frame_steps * speed.step_s, z_bound=z_bound, bound_scale=bound_scale
        )

    def _speed(self, engine: EngineView, c: Columns) -> SpeedModel:
        """Modelled (uncorrected) decode-step and prefill times for a batch of this snapshot."""
        p = self.params
        n_seqs = min(engine.max_num_seqs, len(c))
        if engine.profile is not None:
            ctx = c.prompt_tokens + c.generated_tokens
            mean_ctx = float(ctx[c.running].mean()) if c.running.any() else float(ctx.mean())
            speed = SpeedModel.from_profile(
                engine.profile, n_seqs, mean_ctx * n_seqs, engine.max_num_batched_tokens
            )
        else:
            speed = SpeedModel(
                p.default_step_s, 1.0 / p.default_prefill_tokens_per_s, 0.0, engine.max_num_batched_tokens
            )
        return speed

    def _track_step_time(self, engine: EngineView, n_running: int, step_s: float) -> None:
        """Fold the measured seconds per engine step since the last busy call into the correction."""
        last = self._last_clock
        if last is not None and n_running > 0 and engine.step > last[1]:
            measured = (engine.now_s - last[0]) / (engine.step - last[1])
            self.correction.observe(last[2], measured)
        self._last_clock = (engine.now_s, engine.step, step_s) if n_running else None

    def _is_frame(self, step: int) -> bool:
        if self._last_frame_step is None or step - self._last_frame_step >= self.frame_steps:
            self._last_frame_step = step
            return True
        return False

    def _reject_mask(self, c: Columns, est: Lengths, now_s: float) -> B8:
        p = self.params
        waiting = ~c.running
        out = np.zeros(len(c), dtype=np.bool_)
        if p.drops_past_deadline:
            hard = (c.kind == DEADLINE) | (c.kind == COMPOUND)
            # NaN (no program deadline) compares False, as the +inf it stands for would
            out |= waiting & hard & (est.program_deadline_at_s < now_s)
        if p.max_wait_s is not None:
            not_started = (c.generated_tokens == 0) & (c.computed_tokens == 0)
            out |= waiting & not_started & (now_s - c.arrival_s > p.max_wait_s)
        return out

    # ---- the decision ------------------------------------------------------------------------
    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        p = self.params
        now = engine.now_s
        if not waiting and not running:
            self._last_clock = None
            return Decision(running_order=(), reason="idle")
        if len(waiting) + len(running) <= small.MAX_ROWS:
            # the scalar path reads the snapshots several times: an engine's live sequence built once
            running = list(running)
            if small.supported(p, waiting, running):
                return self._decide_small(waiting, running, engine, rng)
        self._pending = None
        c = self._table.columns(waiting, running)
        speed = self._speed(engine, c)
        self._track_step_time(engine, len(running), speed.step_s)
        if p.correct_step_time:
            speed = speed.scaled(self.correction.factor)
        scoring = self._scoring_params(now)
        est: Lengths
        full: Estimates | None = None  # the goodput estimates: GMAX ordering only
        if p.ordering == "sjf":
            # SJF reads the lengths and deadlines alone: the goodput estimates (most of an
            # estimate's work) are made only if someone reads last_estimates
            reading = self.bounds.rows(c.kind)
            est = lengths(c, scoring, reading[1])
            self._pending = partial(self._estimate, c, now, speed, scoring, reading)
            score = 1.0 / est.len_rem_tokens
        else:
            full = self._estimate(c, now, speed, scoring)
            self._last_estimates = est = full
            score = full.priority
            if p.fairness > 0:
                fair = self.service.fair(c.tenant, c.tenant_names, c.generated_tokens, now)
                score = blend(score, fair, p.fairness)
        reject = self._reject_mask(c, est, now)
        if reject.any():
            self._shed_at_s = now
        frame = self._is_frame(engine.step)
        preempting = frame and p.preemption and full is not None

        alive = ~reject
        pool_mask = alive if preempting else alive & ~c.running
        pool = np.flatnonzero(pool_mask)
        pool = pool[np.argsort(-score[pool], kind="stable")]
        ctx = c.prompt_tokens + c.generated_tokens
        block = max(1, engine.block_size)
        need = np.ceil((ctx + 1.0) / block)
        n_running = len(running)
        if preempting:
            held = float(np.ceil(c.computed_tokens[c.running] / block).sum())
            batch = batch_capacity(need, pool, engine.max_num_seqs, engine.kv_blocks_free + held)
        else:
            batch = batch_capacity(need, pool, engine.max_num_seqs - n_running, engine.kv_blocks_free)

        cutoff = self.tuner.cutoff(now, rng)
        if p.ordering == "gmax":
            cands = pool[cutoff_mask(score[pool], batch, cutoff)]
            group = best_window(score, ctx, np.sort(cands), batch)
        else:
            group = pool[:batch]
        in_group = np.zeros(len(c), dtype=np.bool_)
        in_group[group] = True

        # waiting requests by descending score (ties by index): the pool, or its waiting subsequence
        wait_order = pool[~c.running[pool]] if preempting else pool
        admit = np.concatenate((wait_order[in_group[wait_order]], wait_order[~in_group[wait_order]]))

        preempt: list[int] = []
        if preempting and full is not None:  # (preempting implies it: for the type checker)
            preempt = self._preemptions(
                c=c,
                est=full,
                score=score,
                in_group=in_group,
                wait_order=wait_order,
                need=need,
                engine=engine,
                speed=speed,
            )
        run_idx = np.flatnonzero(c.running)
        run_order = run_idx[np.argsort(-score[run_idx], kind="stable")]
        if preempt:
            kept = np.ones(len(c), dtype=np.bool_)
            kept[preempt] = False
            run_order = run_order[kept[run_order]]
        g = c.generated_tokens
        in_prefill = c.computed_tokens < c.prompt_tokens + np.maximum(0.0, g - 1.0)
        is_lat = c.kind == LATENCY
        budget = None
        if p.pace_budget and engine.profile is not None and len(run_idx):
            pend = np.concatenate(
                (run_order[in_prefill[run_order] & ~is_lat[run_order]], admit[~is_lat[admit]])
            )
            budget = step_budget(
                p,
                engine.profile,
                engine.max_num_batched_tokens,
                now,
                in_prefill=in_prefill[run_idx],
                kv_tokens=c.computed_tokens[run_idx],
                is_latency=is_lat[run_idx],
                tbt_s=c.tbt_s[run_idx],
                deadline_s=pace_deadlines(c, est, run_idx),
                len_rem_tokens=est.bound_tokens[run_idx] - g[run_idx],
                pending_tokens=np.maximum(0.0, c.prompt_tokens[pend] + g[pend] - c.computed_tokens[pend]),
                pending_start_by_s=pace_deadlines(c, est, pend)
                - median_remaining(p, est.bound_tokens[pend], g[pend]) * speed.step_s,
            )
        if budget is not None and p.latency_lane:
            cand = admit[is_lat[admit]]
            with np.errstate(invalid="ignore"):
                cand = cand[now <= c.arrival_s[cand] + c.ttft_s[cand]]
            lane = latency_lane(
                admit,
                run_order,
                candidates=cand,
                prompt_tokens=c.prompt_tokens,
                computed_tokens=c.computed_tokens,
                generated_tokens=g,
                in_prefill=in_prefill,
                is_latency=is_lat,
                max_tokens=p.lane_max_tokens,
            )
            admit, run_order = lane.admit, lane.running_order
            budget = min(budget + lane.extra_tokens, engine.max_num_batched_tokens)
        ids = c.ids
        return Decision(
            # by position in the waiting queue, the admission pool when nothing is preempted
            admit=pick_ids(ids, admit.tolist()) if preempt else positional(ids, admit.tolist(), len(waiting)),
            preempt=pick_ids(ids, preempt),
            running_order=pick_ids(ids, run_order.tolist()),
            reject=pick_ids(ids, np.flatnonzero(reject).tolist()),
            token_budget=budget,
            reason=f"{'frame' if frame else 'event'} p={cutoff:g} B={batch} preempt={len(preempt)} "
            f"budget={budget}",
        )

    def _decide_small(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        """:meth:`decide` on a small snapshot in plain floats (gmax_scalar): the same Decision."""
        p = self.params
        now = engine.now_s
        speed = small.speed_of(p, engine, waiting, running)
        self._track_step_time(engine, len(running), speed.step_s)
        if p.correct_step_time:
            speed = speed.scaled(self.correction.factor)
        scoring = self._scoring_params(now)
        self._pending = partial(self._estimate_snapshots, waiting, running, now, speed, scoring)
        if self.bounds.learning:
            self.bounds.see(waiting)
            self.bounds.see(running)
        z_by_kind, scale_by_kind = self.bounds.by_kind()
        sc = small.scores(
            scoring,
            waiting,
            running,
            now,
            speed=speed,
            frame_s=p.frame_steps * speed.step_s,
            z_by_kind=z_by_kind,
            scale_by_kind=scale_by_kind,
        )
        score = sc.score
        if p.ordering == "sjf":
            score = [1.0 / x for x in sc.len_rem_tokens]
        reject = sc.reject
        if any(reject):
            self._shed_at_s = now
        frame = self._is_frame(engine.step)
        preempting = frame and p.preemption and p.ordering == "gmax"
        n_wait, n_running = len(waiting), len(running)
        n = n_wait + n_running
        rows = [*waiting, *running]

        def by_score(idx: list[int]) -> list[int]:
            return sorted(idx, key=lambda i: -score[i])

        wait_order = by_score([i for i in range(n_wait) if not reject[i]])
        pool = by_score(wait_order + list(range(n_wait, n))) if preempting else wait_order
        ctx: list[float] = []
        need: list[float] = []
        batch = 0
        if pool:
            ctx = [x + y for x, y in zip(sc.prompt, sc.generated, strict=True)]  # integers: exact
            block = max(1, engine.block_size)
            need = [float(math.ceil((x + 1.0) / block)) for x in ctx]
            if preempting:
                held = 0.0
                for r in running:
                    held += float(math.ceil(r.computed_tokens / block))
                batch = small.batch_capacity(need, pool, engine.max_num_seqs, engine.kv_blocks_free + held)
            else:
                seats = engine.max_num_seqs - n_running
                batch = small.batch_capacity(need, pool, seats, engine.kv_blocks_free)

        cutoff = self.tuner.cutoff(now, rng)
        if batch <= 0:
            group: list[int] = []
        elif p.ordering == "gmax":
            cands = sorted(small.cutoff_candidates(score, pool, batch, cutoff))
            group = small.best_window(score, ctx, cands, batch)
        else:
            group = pool[:batch]
        in_group = set(group)
        if in_group:
            admit = [i for i in wait_order if i in in_group] + [i for i in wait_order if i not in in_group]
        else:
            admit = wait_order

        preempt: list[int] = []
        if preempting:
            preempt = self._preemptions_small(
                rows=rows,
                score=score,
                t_gen_s=sc.t_gen_s,
                in_group=in_group,
                wait_order=wait_order,
                need=need,
                n_wait=n_wait,
                engine=engine,
                speed=speed,
            )
        run_order = by_score(list(range(n_wait, n)))
        if preempt:
            run_order = [i for i in run_order if i not in preempt]
        budget, admit, run_order = self._budget_small(
            rows=rows,
            n_wait=n_wait,
            sc=sc,
            reject=reject,
            admit=admit,
            run_order=run_order,
            engine=engine,
            step_s=speed.step_s,
        )
        ids = [r.request_id for r in rows]
        return new_decision(
            admit=pick_ids(ids, admit),
            preempt=pick_ids(ids, preempt),
            running_order=pick_ids(ids, run_order),
            reject=pick_ids(ids, [i for i in range(n) if reject[i]]),
            token_budget=budget,
            reason=f"{'frame' if frame else 'event'} p={cutoff:g} B={batch} preempt={len(preempt)} "
            f"budget={budget}",
        )

    def _budget_small(
        self,
        *,
        rows: list[RequestView],
        n_wait: int,
        sc: small.Scores,
        reject: list[bool],
        admit: list[int],
        run_order: list[int],
        engine: EngineView,
        step_s: float,
    ) -> tuple[int | None, list[int], list[int]]:
        """The numpy path's step budget and latency lane on a small snapshot, in plain floats."""
        p = self.params
        if not p.pace_budget or engine.profile is None or len(rows) == n_wait:
            return None, admit, run_order
        now = engine.now_s
        deadline, bound = sc.deadline_s, sc.bound_tokens
        g, prompt, computed, is_lat = sc.generated, sc.prompt, sc.computed, sc.is_latency
        in_prefill = [  # computed < prompt + max(0, g - 1)
            c < x + (y - 1.0 if y > 1.0 else 0.0) for c, x, y in zip(computed, prompt, g, strict=True)
        ]
        pending: list[float] | None = None
        start_by: list[float] | None = None
        if demand_floor_applies(p) and not all(is_lat):  # latency prompts are never pending
            pend = [i for i in run_order if in_prefill[i] and not is_lat[i]]
            pend += [i for i in admit if not is_lat[i]]
            pending = [max(0.0, prompt[i] + g[i] - computed[i]) for i in pend]
            median = median_remaining_small(p, [bound[i] for i in pend], [g[i] for i in pend])
            start_by = [deadline[i] - m * step_s for i, m in zip(pend, median, strict=True)]
        budget = step_budget_small(
            p,
            engine.profile,
            engine.max_num_batched_tokens,
            now,
            in_prefill=in_prefill[n_wait:],
            kv_tokens=computed[n_wait:],
            is_latency=is_lat[n_wait:],
            tbt_s=[small.nan_if_none(r.slo.tbt_s) for r in rows[n_wait:]],
            deadline_s=deadline[n_wait:],
            len_rem_tokens=[b - y for b, y in zip(bound[n_wait:], g[n_wait:], strict=True)],
            pending_tokens=pending,
            pending_start_by_s=start_by,
        )
        if budget is None or not p.latency_lane:
            return budget, admit, run_order
        cand = [
            i for i in admit if is_lat[i] and now <= rows[i].arrival_s + small.nan_if_none(rows[i].slo.ttft_s)
        ]
        admit, run_order, extra = latency_lane_small(
            admit,
            run_order,
            candidates=cand,
            prompt_tokens=prompt,
            computed_tokens=computed,
            generated_tokens=g,
            in_prefill=in_prefill,
            is_latency=is_lat,
            max_tokens=p.lane_max_tokens,
        )
        return min(budget + extra, engine.max_num_batched_tokens), admit, run_order

    def _preemptions_small(
        self,
        *,
        rows: list[RequestView],
        score: list[float],
        t_gen_s: list[float],
        in_group: set[int],
        wait_order: list[int],
        need: list[float],
        n_wait: int,
        engine: EngineView,
        speed: SpeedModel,
    ) -> list[int]:
        """:meth:`_preemptions` in plain floats (the batch's summed priority still through numpy)."""
        p = self.params
        members = [i for i in wait_order if i in in_group]
        slots = max(engine.max_num_seqs - (len(rows) - n_wait), 0)
        kv = float(engine.kv_blocks_free)
        fits = 0
        total = 0.0
        for i in members:
            total += need[i]
            if total > kv:
                break
            fits += 1
        blocked = members[min(slots, fits) :]
        if not blocked:
            return []
        victims = sorted((i for i in range(n_wait, len(rows)) if i not in in_group), key=score.__getitem__)
        frame_s = p.frame_steps * speed.step_s
        batch_rate = float(np.array(score[n_wait:]).sum())
        swaps: list[int] = []
        for w, v in zip(blocked, victims, strict=False):
            pw, pv = score[w], score[v]
            horizon = min(t_gen_s[w], p.preempt_horizon_frames * frame_s)
            stall = small.prefill_time(speed, float(rows[v].computed_tokens), 0.0)
            gain, loss = preemption_gain_loss(pw, pv, horizon, stall, batch_rate)
            if pw < p.preempt_min_ratio * pv or gain <= loss:
                break
            swaps.append(v)
        return swaps

    def _preemptions(
        self,
        *,
        c: Columns,
        est: Estimates,
        score: F64,
        in_group: B8,
        wait_order: I64,
        need: F64,
        engine: EngineView,
        speed: SpeedModel,
    ) -> list[int]:
        """Cost-aware preemption (§4.2): running requests outside the group yield to blocked members."""
        p = self.params
        members = wait_order[in_group[wait_order]]
        slots = engine.max_num_seqs - int(c.running.sum())
        kv = float(engine.kv_blocks_free)
        cum = np.cumsum(need[members])
        fits = min(max(slots, 0), int(np.searchsorted(cum, kv, side="right")))
        blocked = members[fits:]
        if len(blocked) == 0:
            return []
        run_idx = np.flatnonzero(c.running & ~in_group)
        victims = run_idx[np.argsort(score[run_idx], kind="stable")]
        stall = speed.prefill_time_s(c.computed_tokens, np.zeros(len(c)))
        frame_s = p.frame_steps * speed.step_s
        horizon = np.minimum(est.t_gen_s, p.preempt_horizon_frames * frame_s)
        batch_rate = float(score[c.running].sum())
        swaps = plan_preemptions(
            blocked,
            victims,
            priority=score,
            stall_s=stall,
            horizon_s=horizon,
            batch_rate=batch_rate,
            min_ratio=p.preempt_min_ratio,
        )
        return [s.victim for s in swaps]


class GMAXOracle(GMAX):
    """GMAX with true output lengths (JITServe* of §6.2)."""

    name = "gmax-oracle"
    _variant: ClassVar[dict[str, Any]] = {"length_source": "oracle"}


class GMAXNoAnalyzer(GMAX):
    """Ablation (§6.3): no request analyzer — the mean response length stands in for the bound."""

    name = "gmax-no-analyzer"
    _variant: ClassVar[dict[str, Any]] = {"length_source": "mean"}


class GMAXNoGMAX(GMAX):
    """Ablation (§6.3): the analyzer's bounds, but SJF ordering instead of GMAX, and no preemption."""

    name = "gmax-no-gmax"
    _variant: ClassVar[dict[str, Any]] = {"ordering": "sjf", "preemption": False}
