"""One simulated engine replica with vLLM v1 scheduler semantics, driven by an engine policy.

Each step (:meth:`SimEngine.plan`) the engine

1. asks the policy for a Decision at a frame boundary (every ``frame_steps`` steps, or after an
   arrival, finish, rejection or KV preemption when the policy reschedules on events) and applies it
   with :func:`slo_core.policies.apply.apply_decision`;
2. schedules running requests first, in order, under the token budget: each gets all its uncomputed
   tokens (a decode: one; a prefill: the rest of its prompt, chunked to what the budget leaves);
   when the KV cache has no free block for one, the *last* running request is preempted (its blocks
   freed, recomputed later, requeued at the front of waiting) until it fits or is itself preempted;
3. if nothing was preempted, admits waiting requests in order while sequence slots, budget and free
   blocks last (the first that does not fit stops admission), chunking the last prefill.

With ``skip_order_free`` (the fleet's setting) the engine leaves out step 1 for a policy whose
decisions depend only on the queues' contents (``order_free_decisions``) wherever the decision could
only reorder queues whose order changes nothing this step: running requests that all fit, and
waiting ones when no sequence slot is free (:meth:`SimEngine._skippable`);
a reader of the order mid-step gets it applied first. The run is the same, decision for decision
(``tests/unit/core/sim/test_sim_order_free.py``); an every-step policy costs what FCFS costs on
most steps. With ``prefill_first`` (vLLM v0's order) step 3 runs before step 2. The step's duration comes from
the performance model; at its end (:meth:`SimEngine.complete`) every request whose tokens are all
computed emits one output token stamped with the step's end time, and finished requests free their
blocks. Prefix caching is off: a preempted request recomputes its whole prompt and output so far.
Decisions take no time unless the engine is given a ``decision_cost`` (:class:`DecisionCost`: in a
pod the vLLM plugin decides on the engine's step loop, so a decided step ends that much later).

Driving one engine from outside (the fleet loop here; engine-sim in real time), one step at a time::

    engine.accept(request, now_s)        # add a SimRequest (False: rejected, prompt over the context)
    end_s = engine.plan(now_s)           # decide + form the batch; None: nothing to run
    ...                                  # wait: end_s - now_s is the modelled step time
    out = engine.complete(duration_s)    # end the step; duration_s: measured (None: the model's)
    out.emitted, out.finished            # token events: who got a token at out.end_s, who finished
    engine.abort(request_id, now_s)      # a client went away: drop it and free its blocks

``plan`` and ``complete`` alternate strictly; ``accept`` and ``abort`` may come at any time between
them (an abort of a request in the step in flight takes effect when the step completes).
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any

from slo_core.perf.model import PerfProfile
from slo_core.policies.apply import apply_decision
from slo_core.policies.base import (
    BaseEnginePolicy,
    Decision,
    EnginePolicy,
    FinishedView,
    ReplicaCapabilities,
    event_deferred,
    quiet_step,
)
from slo_core.sim.engine_snapshots import EngineSnapshots
from slo_core.sim.engine_types import DecisionCost, EngineConfig, StepOutcome
from slo_core.sim.request import ABORTED, FINISHED, REJECTED, RUNNING, WAITING, SimRequest
from slo_core.sim.views import LiveViews, request_view, request_views
from slo_core.slo import RequestKind

# what the policy is told of a finished request (slo_core.sim.outcomes.finished_view, bound to the
# objective's slo_core.policies.feedback.Feedback)
FeedbackFn = Callable[[SimRequest], FinishedView]


class SimEngine(EngineSnapshots):
    """A replica: waiting and running queues, a KV-block pool and the policy that orders them."""

    def __init__(
        self,
        engine_id: str,
        profile: PerfProfile,
        policy: EnginePolicy,
        config: EngineConfig | None = None,
        *,
        rng: random.Random | None = None,
        feedback: FeedbackFn | None = None,
        index: int = 0,
        skip_order_free: bool = False,
        keyed_admission: bool = False,
        live_running: bool = False,
        decision_cost: DecisionCost | None = None,
    ) -> None:
        """``skip_order_free``: leave out the decisions of an order-free policy that cannot change what
        runs (see :meth:`_skippable`); only for a driver that reads the queues through
        :meth:`replica_view` and keeps the views' side effects out of its outcomes (the fleet does
        unless an online-calibrated analyzer learns from them). ``keyed_admission``: for a policy that
        orders admission by a key (``BaseEnginePolicy.keyed_admission``), keep the waiting queue in
        that order as requests join it instead of asking the policy (see :meth:`_queue`); for a driver
        that keeps the views' side effects out of its outcomes and reads no queue order between
        decisions (between two of the policy's decisions the orders differ: arrivals wait at the end
        there). ``decision_cost``: the CPU time a policy decision adds to its step, as the plugin's
        decision does in a pod (:class:`DecisionCost`); None: decisions take no time (the default)."""
        cfg = config or EngineConfig()
        self.engine_id = engine_id
        self.index = index
        self.profile = profile
        self.policy = policy
        self.config = cfg
        self.rng = rng or random.Random(0)
        self.block_size = cfg.block_size
        kv_tokens = cfg.kv_cache_tokens or profile.kv_cache_tokens
        self.kv_blocks_total = kv_tokens // cfg.block_size
        if self.kv_blocks_total < 1:
            raise ValueError(f"{engine_id}: the KV cache holds no block of {cfg.block_size} tokens")
        self.free_blocks = self.kv_blocks_total
        self.max_model_len = min(cfg.max_model_len or profile.max_model_len, kv_tokens)
        self.capabilities = ReplicaCapabilities(
            models=(profile.model,), max_context_tokens=self.max_model_len, gpu_class=profile.gpu
        )
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.done: list[SimRequest] = []
        self.step = 0
        self.events = True
        # a latency request arrived since the last decision (its first token is due within a TTFT): a
        # deep queue's decision is not left for later then (event_deferred)
        self.urgent = False
        self.listed: frozenset[str] = frozenset()
        self.hold_unlisted = False
        self.token_budget = cfg.max_num_batched_tokens
        self.prefill_first = False
        self.step_start_s = 0.0
        self.step_end_s = 0.0
        self._aborted: set[str] = set()
        self._batch_p: list[tuple[SimRequest, int]] = []
        self._batch_d: list[SimRequest] = []
        # incremental load counters (the router's outstanding tokens)
        self.prompt_left_tokens = 0
        self.output_left_tokens = 0
        # compound-program calls queued here (a fleet bounds other engines' coasting by this one's next
        # step end while it holds any: a call finishing here routes its program's next stage)
        self.calls_held = 0
        self.preemptions = 0
        self.decisions = 0
        self.busy_s = 0.0
        self.steps_run = 0
        self.steps_coasted = 0  # of steps_run, those coast() ran
        self._frame = max(1, int(getattr(policy, "frame_steps", 1)))
        self._on_events = bool(getattr(policy, "reschedule_on_events", True))
        self._deep_from = max(0, int(getattr(policy, "deep_queue_from", 0)))
        self._deep_every = max(1, int(getattr(policy, "deep_queue_every", 1)))
        overrides_observe = getattr(type(policy), "observe", None) is not BaseEnginePolicy.observe
        self._feedback = feedback if overrides_observe else None
        self._fast = bool(getattr(policy, "fifo_fast_path", False))
        # a policy that learns from finishes (observe) would see them in the left-out orders
        self._order_free = (
            skip_order_free
            and self._frame == 1
            and self._feedback is None
            and bool(getattr(policy, "order_free_decisions", False))
        )
        # (now_s, free KV blocks, how many waited then) of the decision plan() left out for the step in
        # flight, if any (until the step completes the waiting queue only grows at its end)
        self._deferred: tuple[float, int, int] | None = None
        # a policy that leaves out its quiet decisions (BaseEnginePolicy.skip_quiet_decisions); coast()
        # then never stops for a decision: a coasted step is quiet
        self._quiet = bool(getattr(policy, "skip_quiet_decisions", False))
        self.quiet_skipped = 0  # decisions left out as quiet
        self._cost = decision_cost if decision_cost is not None and decision_cost.seconds(1) > 0 else None
        self.decision_s = 0.0  # the decisions' charged seconds (decision_cost), inside the steps' times
        self._keyed = (
            keyed_admission
            and not self._fast
            and self._feedback is None
            and bool(getattr(policy, "keyed_admission", False))
        )
        self._keyed_running = self._keyed and bool(getattr(policy, "keyed_running", False))
        self._live = live_running and bool(getattr(policy, "live_running", False))
        if self._keyed:
            key = policy.admission_key  # type: ignore[attr-defined]
            self._key: Callable[[SimRequest], Any] = lambda r: key(request_view(r))
        if self._fast or self._keyed:
            # a FIFO or keyed policy sets the same knobs at every decision: learn them once
            self._set_knobs(policy.decide([], [], self.engine_view(0.0), self.rng))

    # ---- queue changes ----------------------------------------------------------------------------

    def accept(self, r: SimRequest, now_s: float) -> bool:
        """Queue an arriving request; False (and the request rejected) if it cannot fit the context."""
        if not r.cap_to_context(self.max_model_len):
            r.set_state(REJECTED)
            r.finish_s = now_s
            return False
        r.set_state(WAITING)
        r.waiting_since_s = now_s
        r.replica = self.index
        if self._deep_from and r.slo.kind is RequestKind.LATENCY:  # read by the deep-queue rule only
            self.urgent = True
        if self._keyed:
            self._queue(r, front=False)
        else:
            self.waiting.append(r)
        self.prompt_left_tokens += r.prompt_tokens
        self.output_left_tokens += r.expected_tokens
        if r.program is not None:
            self.calls_held += 1
        self.events = True
        return True

    def _queue(self, r: SimRequest, *, front: bool) -> None:
        """Place ``r`` in a keyed policy's waiting queue where its next decision's stable sort would:
        an arrival (appended there) after every request of an equal or smaller key, a request
        preempted by the engine (requeued at the front) before every request of an equal or greater
        one. The queue is sorted by the key, and no queued request's key moves
        (``BaseEnginePolicy.keyed_admission``), so a decision would leave it as it is."""
        place = bisect_left if front else bisect_right
        self.waiting.insert(place(self.waiting, self._key(r), key=self._key), r)

    def _preempt(self, r: SimRequest, now_s: float) -> None:
        self.free_blocks += r.blocks
        r.blocks = 0
        self.prompt_left_tokens += min(r.computed, r.prompt_tokens)
        r.computed = 0
        # only running requests are preempted, so the state changes and set_state marks the view
        # stale, which also covers the computed/waiting_since fields changed here (tested by the
        # view test in tests/unit/core/sim)
        r.set_state(WAITING)
        r.waiting_since_s = now_s
        r.preemptions += 1
        if r.program is not None:
            r.program.attained_cache = -1
        self.preemptions += 1
        self.events = True

    def _reject(self, r: SimRequest, now_s: float) -> None:
        self._leave(r, REJECTED, now_s)

    # ---- decisions --------------------------------------------------------------------------------

    def _set_knobs(self, d: Decision) -> None:
        cap = self.config.max_num_batched_tokens
        self.token_budget = cap if d.token_budget is None else max(1, min(cap, d.token_budget))
        self.prefill_first = d.prefill_first

    def _decide(self, now_s: float) -> None:
        if self._keyed:  # the queue is already in the order the decision would give it (_queue)
            self.decisions += 1
            self.events = False
            if self._keyed_running:  # decodes first (in order), then prefills by the key
                decodes: list[SimRequest] = []
                prefills: list[SimRequest] = []
                for r in self.running:  # RequestView.in_prefill on the request's own counts
                    if r.computed < r.prompt_tokens + max(0, r.generated - 1):
                        prefills.append(r)
                    else:
                        decodes.append(r)
                if prefills:
                    prefills.sort(key=self._key)
                    self.running = decodes + prefills
            return
        running = LiveViews(self.running) if self._live else request_views(self.running)
        decision = self.policy.decide(request_views(self.waiting), running, self.engine_view(now_s), self.rng)
        if isinstance(running, LiveViews):
            running.close()
        self.decisions += 1
        self.events = False
        self.urgent = False
        applied = apply_decision(decision, self.waiting, self.running)
        for r in applied.preempted:
            self._preempt(r, now_s)
        for r in applied.rejected:
            self._reject(r, now_s)
        self.waiting = applied.waiting
        self.running = applied.running
        self.listed = applied.listed
        self.hold_unlisted = applied.hold_unlisted
        self._set_knobs(decision)

    def _event_deferred(self) -> bool:
        """Whether this step's event decision waits (core's :func:`event_deferred`, for a policy that
        declares a deep-queue cadence)."""
        return event_deferred(
            self.step,
            len(self.waiting),
            deep_queue_from=self._deep_from,
            deep_queue_every=self._deep_every,
            urgent=self.urgent,
        )

    def _skippable(self) -> bool:
        """Whether this step's decision cannot change what runs, for an order-free policy (one whose
        decision depends on the queues' contents, not their order, and only orders and admits:
        ``order_free_decisions``) when nothing waits, or when requests wait but every sequence slot is
        taken (nothing can be admitted this step, whatever the order or the held set).

        The decision would then only reorder the queues. The waiting order decides nothing in a step
        that admits nobody; the next decision (its contents unchanged) orders them anew. The running
        order decides nothing in a step where every one of them gets all its tokens (they fit the
        token budget), no KV preemption can happen (their new blocks fit the free ones) and no call of
        a compound program finishes (the fleet's program bookkeeping, which may route the next stage
        and so read this engine, follows the order of finishes). The next decision sees the same
        contents whatever their order; a reader of the order in between gets the left-out decision
        applied first (:meth:`_apply_deferred`).
        """
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return False
        budget = self.token_budget
        free = self.free_blocks
        bs = self.block_size
        for r in self.running:
            n = r.num_tokens
            budget -= n - r.computed
            free -= (n + bs - 1) // bs - r.blocks
            if r.generated + 1 >= r.target_tokens and r.program is not None:
                return False
        return budget >= 0 and free >= 0

    def _apply_deferred(self) -> None:
        """Take the decision :meth:`plan` left out for the step in flight, on the state it saw then (the
        running requests have not moved since; the waiting queue then is a prefix of today's: only
        arrivals were appended), so both orders are what they would have been."""
        if self._deferred is None:
            return
        now_s, free_blocks, n_waiting = self._deferred
        self._deferred = None
        waiting = self.waiting[:n_waiting]
        view = dataclasses.replace(self.engine_view(now_s), kv_blocks_free=free_blocks)
        decision = self.policy.decide(request_views(waiting), request_views(self.running), view, self.rng)
        self.decisions += 1
        applied = apply_decision(decision, waiting, self.running)
        if (
            applied.preempted
            or applied.rejected
            or decision.token_budget is not None
            or decision.prefill_first
        ):
            raise RuntimeError(f"{self.policy.name}: an order-free policy only orders and admits")
        self.waiting = applied.waiting + self.waiting[n_waiting:]
        self.running = applied.running
        self.listed = applied.listed
        self.hold_unlisted = applied.hold_unlisted

    # ---- one step ---------------------------------------------------------------------------------

    def plan(self, now_s: float) -> float | None:
        """Decide (at a frame boundary) and schedule one step at ``now_s``; returns its end time.

        None when there is nothing to run; an engine whose requests all wait (held, or waiting for
        blocks) polls again after ``idle_poll_s`` so a later frame can change its mind.
        """
        if not self.waiting and not self.running:
            return None
        self.step += 1
        self.step_start_s = now_s
        charged = 0.0  # the decision's seconds, when one is made for this step (decision_cost)
        # core's decision_due, inlined (a call per step costs ~2 % of the hour); the rule's own call
        # (event_deferred) only for a policy with a deep-queue cadence
        if not self._fast and (
            self.step % self._frame == 0
            or (self._on_events and self.events and not (self._deep_from and self._event_deferred()))
        ):
            if self._quiet and quiet_step(
                len(self.waiting),
                ((r.num_tokens, r.computed) for r in self.running),  # lazy: read only if nothing waits
                self.token_budget,
                self.free_blocks,
                self.block_size,
            ):
                self.events = False  # the finishes it would have seen are taken into account
                self.quiet_skipped += 1
            else:
                if self._cost is not None:  # the plugin would decide (left out here or not)
                    charged = self._cost.seconds(len(self.waiting) + len(self.running))
                    self.decision_s += charged
                if self._order_free and self._skippable():
                    self._deferred = (now_s, self.free_blocks, len(self.waiting))
                else:
                    self._decide(now_s)
        self._batch_p = []
        self._batch_d = []
        budget = self.token_budget
        if self.prefill_first:
            budget, admitted = self._admit(now_s, budget)
            budget, kv, _ = self._schedule_running(now_s, budget)
            self.running.extend(admitted)
        else:
            budget, kv, preempted = self._schedule_running(now_s, budget)
            if not preempted:
                budget, admitted = self._admit(now_s, budget)
                self.running.extend(admitted)
        n_tokens = self.token_budget - budget
        if n_tokens <= 0:
            if not self.waiting and not self.running:
                return None
            self.step_end_s = now_s + self.config.idle_poll_s + charged
            return self.step_end_s
        chunk_ctx = 0
        for r, n in self._batch_p:
            chunk_ctx += n * (r.computed + n)
        dt = self.profile.iteration_time_from_sums_s(n_tokens, chunk_ctx, kv, len(self._batch_p))
        self.busy_s += dt
        self.steps_run += 1
        self.step_end_s = now_s + dt + charged
        return self.step_end_s

    def coast(self, now_s: float, limit_s: float) -> float:
        """Run, in one pass, the steps from ``now_s`` that :meth:`plan` and :meth:`complete` would run
        one by one while nothing can change them, each ending before ``limit_s``; returns the time
        reached (``now_s`` when there is none), where the engine stands as after :meth:`complete`.

        A step qualifies when nothing waits or is being aborted, every running request is a decode of
        no compound program (another engine's policy may read a program's service), all of them fit
        the token budget and their new KV blocks fit the free ones (no preemption), none finishes, and
        no decision is due (a FIFO policy, an order-free one whose decision would be left out, one that
        leaves out quiet decisions, which every such step is, or no event and no frame boundary). Then
        each step gives every running request one token, and its time is the performance model's for
        that batch: the same floats a step-by-step run computes, summed in the same order. The caller
        bounds ``limit_s`` by the next event that reads or changes this engine (an arrival, another
        engine's finish that routes a stage): none comes between the steps run here, so a reader sees
        what it would have seen.
        """
        running = self.running
        if self.waiting or not running or self._aborted or len(running) > self.token_budget:
            return now_s
        steps = 1 << 30
        ctx = 0
        for r in running:
            c = r.computed
            if r.num_tokens - c != 1 or r.program is not None:
                return now_s
            left = r.target_tokens - r.generated - 1  # steps before the one that finishes it
            if left < steps:  # noqa: PLR1730 (hot path: cheaper than min())
                steps = left
            ctx += c + 1
        # an order-free policy's left-out decisions are still made, and charged, where they cost time
        if not (self._fast or (self._order_free and self._cost is None) or self._quiet):
            if self._on_events and self.events:
                return now_s
            frame = self._frame
            steps = min(steps, frame - (self.step + 1) % frame) if (self.step + 1) % frame else 0
        if steps <= 0:
            return now_s
        bs = self.block_size
        if self._blocks_to_run(steps) > self.free_blocks:  # KV pressure: as many steps as fit
            lo, hi = 0, steps
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._blocks_to_run(mid) <= self.free_blocks:
                    lo = mid
                else:
                    hi = mid - 1
            steps = lo
            if steps <= 0:
                return now_s
        n = len(running)
        time_of = self.profile.iteration_time_from_sums_s
        ends: list[float] = []
        t = now_s
        start = now_s
        while len(ends) < steps:
            dt = time_of(n, 0, ctx, 0)
            end = t + dt
            if not end < limit_s:
                break
            self.busy_s += dt
            start = t
            ends.append(end)
            t = end
            ctx += n
        m = len(ends)
        if not m:
            return now_s
        for r in running:
            g = r.generated
            c = r.computed + m
            r.computed = c
            r.generated = g + m
            r.num_tokens += m
            r.view_key = None
            r.token_times.extend(ends)
            e = r.expected_tokens - g
            if e > 0:
                self.output_left_tokens -= m if m < e else e
            need = (c + bs - 1) // bs - r.blocks
            if need > 0:
                self.free_blocks -= need
                r.blocks += need
        self.step += m
        self.steps_run += m
        self.steps_coasted += m
        if self._quiet:  # each coasted step's due decision was quiet: left out, as plan() leaves it
            self.events = False
        self.step_start_s = start
        self.step_end_s = t
        return t

    def _blocks_to_run(self, steps: int) -> int:
        """KV blocks the running decodes take on over ``steps`` more steps."""
        bs = self.block_size
        total = 0
        for r in self.running:
            need = (r.computed + steps + bs - 1) // bs - r.blocks
            if need > 0:
                total += need
        return total

    def _schedule_running(self, now_s: float, budget: int) -> tuple[int, int, bool]:
        """vLLM v1's pass over running requests; returns (budget left, Σ KV tokens of decodes,
        whether a request was preempted for lack of KV blocks)."""
        running = self.running
        bs = self.block_size
        batch_p = self._batch_p
        batch_d = self._batch_d
        kv = 0
        i = 0
        preempted = False
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.computed
            n = r.num_tokens - c
            if n > budget:  # noqa: PLR1730 (hot path: cheaper than min())
                n = budget
            need = (c + n + bs - 1) // bs - r.blocks
            if need > self.free_blocks:
                # out of KV blocks: preempt from the tail until this request fits or is the victim
                preempted = True
                while need > self.free_blocks:
                    victim = running.pop()
                    self._preempt(victim, now_s)
                    if self._keyed:
                        self._queue(victim, front=True)
                    else:
                        self.waiting.insert(0, victim)
                    if victim is r:
                        break
                if r.state != RUNNING:
                    break
            if need > 0:
                self.free_blocks -= need
                r.blocks += need
            if n == 1:
                batch_d.append(r)
                kv += c + 1
            else:
                batch_p.append((r, n))
            budget -= n
            i += 1
        return budget, kv, preempted

    def _admit(self, now_s: float, budget: int) -> tuple[int, list[SimRequest]]:
        """Admit waiting requests in order while slots, budget and blocks last (the first that does
        not fit stops admission); returns (budget left, admitted requests)."""
        waiting = self.waiting
        admitted: list[SimRequest] = []
        if not waiting or budget <= 0:
            return budget, admitted
        seats = self.config.max_num_seqs - len(self.running)
        hold = self.hold_unlisted
        listed = self.listed
        bs = self.block_size
        last = -1
        contiguous = True
        for idx, r in enumerate(waiting):
            if budget <= 0 or seats <= 0:
                break
            if hold and r.request_id not in listed:
                continue
            n = r.num_tokens - r.computed
            if n > budget:  # noqa: PLR1730 (hot path: cheaper than min())
                n = budget
            need = (r.computed + n + bs - 1) // bs - r.blocks
            if need > self.free_blocks:
                break
            self.free_blocks -= need
            r.blocks += need
            r.set_state(RUNNING)
            if r.first_scheduled_s is None:
                r.first_scheduled_s = now_s
            admitted.append(r)
            self._batch_p.append((r, n))
            budget -= n
            seats -= 1
            contiguous = contiguous and idx == last + 1
            last = idx
        if admitted:
            if contiguous:
                del waiting[: len(admitted)]
            else:
                self.waiting = [r for r in waiting if r.state == WAITING]
        return budget, admitted

    def complete(self, duration_s: float | None = None) -> StepOutcome:
        """End the step in flight: deliver its tokens at its end time and free finished requests.

        ``duration_s`` overrides the modelled step time (engine-sim passes the time it really took);
        the end time is then ``step_start_s + duration_s``.
        """
        self._deferred = None  # the step ends: its order is read by nobody before the next plan
        if duration_s is not None:
            self.step_end_s = self.step_start_s + max(0.0, duration_s)
        t = self.step_end_s
        finished: list[SimRequest] = []
        emitted: list[SimRequest] = []
        for r, n in self._batch_p:
            if r.program is not None:
                r.program.attained_cache = -1
            c = r.computed
            if c < r.prompt_tokens:
                self.prompt_left_tokens -= min(n, r.prompt_tokens - c)
            if n:
                c += n
                r.computed = c
                r.view_key = None
            if c >= r.num_tokens:
                r.generated += 1
                r.view_key = None
                r.num_tokens += 1
                r.token_times.append(t)
                emitted.append(r)
                if r.generated <= r.expected_tokens:
                    self.output_left_tokens -= 1
                if r.generated >= r.target_tokens:
                    finished.append(r)
        decodes = self._batch_d
        for r in decodes:
            prog = r.program
            if prog is not None:
                # a decode adds one token to its program's attained service (a prompt's last token,
                # generated 0, adds the prompt: recount)
                a = prog.attained_cache
                if a >= 0:
                    prog.attained_cache = a + 1 if r.generated > 0 else -1
            r.computed += 1
            r.generated += 1
            r.view_key = None
            r.num_tokens += 1
            r.token_times.append(t)
            if r.generated <= r.expected_tokens:
                self.output_left_tokens -= 1
            if r.generated >= r.target_tokens:
                finished.append(r)
        if emitted:
            emitted.extend(decodes)
        else:
            emitted = decodes
        self._batch_p = []
        self._batch_d = []
        if finished:
            for r in finished:
                r.set_state(FINISHED)
                r.finish_s = t
                self.free_blocks += r.blocks
                r.blocks = 0
                if r.expected_tokens > r.generated:
                    self.output_left_tokens -= r.expected_tokens - r.generated
                if r.program is not None:
                    self.calls_held -= 1
            self.running = [r for r in self.running if r.state == RUNNING]
            self.events = True
            self.done.extend(finished)
            if self._feedback is not None:
                self.policy.observe([self._feedback(r) for r in finished], t)
        if self._aborted:
            self._drop_aborted(t)
        return StepOutcome(t, emitted, finished)

    def abort(self, request_id: str, now_s: float) -> SimRequest | None:
        """Drop a queued or running request (state ABORTED, blocks freed); None if it is not here.

        Between steps it leaves at once; a request in the step in flight leaves when that step
        completes (its token of that step is still delivered).
        """
        self._apply_deferred()
        for queue in (self.waiting, self.running):
            for r in queue:
                if r.request_id == request_id:
                    if any(r is x for x, _ in self._batch_p) or any(r is x for x in self._batch_d):
                        self._aborted.add(request_id)
                    else:
                        queue.remove(r)
                        self._leave(r, ABORTED, now_s)
                    return r
        return None

    def _drop_aborted(self, now_s: float) -> None:
        ids = self._aborted
        self._aborted = set()
        gone = [r for r in (*self.waiting, *self.running) if r.request_id in ids]
        if not gone:
            return
        self.waiting = [r for r in self.waiting if r.request_id not in ids]
        self.running = [r for r in self.running if r.request_id not in ids]
        for r in gone:
            self._leave(r, ABORTED, now_s)

    def _leave(self, r: SimRequest, state: int, now_s: float) -> None:
        """Take ``r`` out of the load counters and the KV pool (the caller removed it from a queue)."""
        self.prompt_left_tokens -= max(0, r.prompt_tokens - min(r.computed, r.prompt_tokens))
        self.output_left_tokens -= max(0, r.expected_tokens - r.generated)
        self.free_blocks += r.blocks
        r.blocks = 0
        r.set_state(state)
        r.finish_s = now_s
        if r.program is not None:
            r.program.attained_cache = -1
            self.calls_held -= 1
        self.done.append(r)
        self.events = True
