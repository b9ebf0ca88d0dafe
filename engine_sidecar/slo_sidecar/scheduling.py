"""The sidecar's scheduling loop: the configured engine policy decides, each frame, what enters the engine.

Proxy mode (a stock vLLM): requests wait here; each frame the policy sees the waiting and released
requests as :class:`~slo_core.policies.base.RequestView` snapshots and its
:class:`~slo_core.policies.base.Decision` is applied with ``slo_core.policies.apply`` — rejected
requests get 503, preempted ones are aborted upstream and resumed later as continuations, and the
offered ones are released in order while fewer than ``max_running`` are in the engine (their rank
goes to vLLM's ``priority`` when enabled). Engine mode: requests go straight to the engine (whose own
scheduler applies the policy); the loop only keeps the priorities served over gRPC current.
A policy that raises is logged and replaced by arrival order for that frame: never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from slo_core.policies.apply import apply_decision
from slo_core.policies.base import Decision, EnginePolicy, EngineView
from slo_core.policies.guard import GuardedPolicy
from slo_sidecar.errors import overloaded
from slo_sidecar.job import Job
from slo_sidecar.metrics import SidecarMetrics

log = logging.getLogger(__name__)

BLOCK_TOKENS = 16
# arrivals to a queue at most this long are decided on arrival instead of at the next frame
FAST_PATH_QUEUE = 8


class Scheduler:
    """Waiting and released jobs, and the frame loop over them."""

    def __init__(
        self,
        policy: EnginePolicy,
        metrics: SidecarMetrics,
        *,
        mode: str = "proxy",
        max_running: int = 64,
        frame_s: float = 0.02,
        kv_cache_tokens: int = 262144,
        max_batched_tokens: int = 8192,
        engine_priority: bool = False,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self._guard = GuardedPolicy(policy)  # core's degrade-to-stock guard, as in the plugin and engine-sim
        self.metrics = metrics
        self.mode = mode
        self.max_running = max_running
        self.frame_s = frame_s
        self.kv_cache_tokens = kv_cache_tokens
        self.max_batched_tokens = max_batched_tokens
        self.engine_priority = engine_priority
        self.clock = clock
        self.rng = random.Random(seed)
        self.waiting: list[Job] = []
        self.running: list[Job] = []
        self.step = 0
        self._last_tokens: dict[str, int] = {}
        self._wake = asyncio.Event()
        self.decisions = 0

    # ---- queue changes (called from request tasks) -------------------------------------------
    def submit(self, job: Job) -> None:
        if self.mode == "engine":
            self.running.append(job)
            job.release(None)
        else:
            self.waiting.append(job)
            if len(self.waiting) <= FAST_PATH_QUEUE:
                self.frame()  # decide at once: no frame of added latency while the queue is short
        self._wake.set()

    def forget(self, job: Job) -> None:
        """The job ended (any way): it leaves both queues and frees its seat."""
        for queue in (self.waiting, self.running):
            if job in queue:
                queue.remove(job)
        self._last_tokens.pop(job.request_id, None)
        self._wake.set()

    def set_policy(self, policy: EnginePolicy) -> None:
        self.policy = policy
        self._guard = GuardedPolicy(policy)
        self._wake.set()

    @property
    def policy_errors(self) -> int:
        """Frames the current policy failed (each fell back to arrival order)."""
        return self._guard.errors

    # ---- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            if self.waiting if self.mode == "proxy" else self.running:
                with contextlib.suppress(TimeoutError):  # frames tick while there is something to decide
                    await asyncio.wait_for(self._wake.wait(), timeout=self.frame_s)
            else:
                await self._wake.wait()  # idle: sleep until an arrival
            self._wake.clear()
            self.frame()
            await asyncio.sleep(0)

    def engine_view(self) -> EngineView:
        used = sum(j.live.prompt_tokens + j.live.generated_tokens for j in self.running)
        total_blocks = max(1, self.kv_cache_tokens // BLOCK_TOKENS)
        return EngineView(
            now_s=self.clock(),
            step=self.step,
            max_num_seqs=self.max_running,
            max_num_batched_tokens=self.max_batched_tokens,
            kv_blocks_total=total_blocks,
            kv_blocks_free=max(0, total_blocks - -(-used // BLOCK_TOKENS)),
            block_size=BLOCK_TOKENS,
        )

    def _advance_steps(self) -> None:
        """Engine iterations are not visible from outside: count the most tokens any request gained."""
        gained = 0
        for j in self.running:
            n = j.live.generated_tokens
            gained = max(gained, n - self._last_tokens.get(j.request_id, n))
            self._last_tokens[j.request_id] = n
        self.step += max(1, gained)

    def frame(self) -> None:
        self._advance_steps()
        if self.mode == "engine":
            if self.running:  # the engine schedules; the policy's order only feeds the gRPC priorities
                pending = [j for j in self.running if not j.live.started]
                started = [j for j in self.running if j.live.started]
                decision = self._decide(pending, started)
                self._rank((*(decision.running_order or ()), *decision.admit), self.running)
            return
        if self.waiting:
            # a FIFO policy (core's fifo_fast_path: FCFS, Sarathi) decides from the queue order alone,
            # so the released requests' snapshots (one per running request, per arrival) are skipped,
            # as the simulator skips them; the running order it would give is the one they have here
            fifo = self._guard.fifo_fast_path
            self._apply(self._decide(self.waiting, [] if fifo else self.running))

    def _decide(self, waiting: list[Job], running: list[Job]) -> Decision:
        w = [j.live.view(running=False) for j in waiting]
        r = [j.live.view(running=True) for j in running]
        t0 = time.perf_counter()
        decision = self._guard.decide(w, r, self.engine_view(), self.rng)  # an error: arrival order
        self.metrics.decision_seconds.observe(time.perf_counter() - t0)
        self.decisions += 1
        return decision

    def _apply(self, decision: Decision) -> None:
        applied = apply_decision(decision, self.waiting, self.running)
        for job in applied.rejected:
            job.reject(
                overloaded(
                    "the scheduler found this request infeasible under the current load; retry later",
                    "infeasible",
                    self.retry_after_s(),
                )
            )
        kept_running = list(applied.running)
        back_waiting = []
        for job in applied.preempted:
            if job.preempt():
                self.metrics.preemptions.labels(job.live.tier.name, job.live.targets.priority_class).inc()
                back_waiting.append(job)
            else:
                kept_running.append(job)
        self.running = kept_running
        self.waiting = [j for j in applied.waiting if j in back_waiting or j not in applied.preempted]
        offered = applied.offered()
        seats = self.max_running - len(self.running)
        for rank, job in enumerate(offered):
            job.live.priority = float(len(offered) - rank)
            if rank < seats:
                self.waiting.remove(job)
                self.running.append(job)
                job.release(rank if self.engine_priority else None)

    def _rank(self, order: tuple[str, ...], jobs: list[Job]) -> None:
        rank = {rid: len(order) - i for i, rid in enumerate(order)}
        for j in jobs:
            j.live.priority = float(rank.get(j.request_id, 0))

    def retry_after_s(self) -> float:
        """A hint for rejected clients: time for the queue ahead to drain at the current pace."""
        ahead = len(self.waiting) + len(self.running)
        return max(1.0, min(60.0, ahead / max(1, self.max_running) * 2.0))
