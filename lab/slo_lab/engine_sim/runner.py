"""Drives the bench's engine simulator in real time: one asyncio task plans a step, sleeps for the
performance model's duration of it, completes it and hands each request its new tokens.

Arrivals and aborts queue up while a step runs and are applied between steps (as vLLM's engine core
does), so a client disconnect takes the request out of the engine, and frees its KV blocks, at the
next step boundary. Steps shorter than ``MAX_AHEAD_S`` are not slept one by one: the engine runs up
to that far ahead of the wall clock and then sleeps, and a step that starts late because a sleep
overshot starts at the model's time (up to ``MAX_LAG_S`` behind), so timer granularity and jitter do
not slow the simulated GPU down; tokens may arrive up to 2 ms early or 20 ms late.

The engine clock is Unix time (``time.time()``, like vLLM's ``arrival_time``), so absolute deadlines
in the SLO tags need no translation; ``--speedup`` makes the simulated GPU faster instead of bending
the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from slo_core.gain import SLOWatch
from slo_core.perf import sped_up
from slo_core.policies.base import MAX_ENGINE_PROGRAMS, EnginePolicy
from slo_core.policies.feedback import Feedback
from slo_core.policies.registry import make_engine_policy
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.outcomes import finished_view
from slo_core.sim.request import REJECTED, RUNNING, ProgramState, SimRequest
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.keyring import KeyFile
from slo_core.wire.tags import EngineTags, distrust, program_start_s
from slo_vllm_plugin.report import EngineSnapshot, Finished, RequestRow, Throttle, judge, watch

from .policy_hook import GuardedPolicy, observes_feedback
from .settings import EngineSimSettings, resolve_profile

log = logging.getLogger(__name__)

BEST_EFFORT = SLOTargets(RequestKind.BEST_EFFORT)
MAX_AHEAD_S = 0.002
MAX_LAG_S = 0.02
# one output event: (new tokens, time of the step that made them, finish reason or None)
Event = tuple[int, float, str | None]


@dataclass(frozen=True)
class Submission:
    """One request as the engine sees it (token counts already resolved by the API layer)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    tags: EngineTags | None = None
    priority: int = 0


@dataclass
class Handle:
    """A live request's mailbox: the engine task puts events, the HTTP handler reads them."""

    sub: Submission
    sim: SimRequest
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    seen_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_reason: str | None = None
    watch: SLOWatch | None = None  # its SLO outcome so far (core's rule, as the vLLM plugin keeps it)

    @property
    def request_id(self) -> str:
        return self.sub.request_id


class EngineRunner:
    """One simulated engine served in real time (see the module docstring)."""

    def __init__(
        self,
        settings: EngineSimSettings,
        *,
        clock: Callable[[], float] = time.time,
        policy: EnginePolicy | None = None,
        analyzer: Any = None,
    ) -> None:
        """``policy`` and ``analyzer`` (an object with ``bounds_if_fresh(stale_after_s)`` and
        ``close()``) replace the ones the settings name; tests inject them."""
        self.settings = settings
        self.clock = clock
        self.profile = sped_up(resolve_profile(settings.profile), settings.speedup)
        self.model_name = settings.model or self.profile.model
        inner = policy or make_engine_policy(settings.policy, settings.policy_params, settings.objective)
        self.analyzer = analyzer
        # as the vLLM plugin: only SLO tags signed with the tag key count (a file that cannot be read
        # fails here, at start); the analyzer's calls carry a token made with it
        self.keys = KeyFile(settings.tag_key_file) if settings.tag_key_file else None
        self.unsigned_tags = 0
        if analyzer is None and settings.analyzer:
            from slo_vllm_plugin.analyzer_client import AnalyzerClient

            self.analyzer = AnalyzerClient(
                settings.analyzer, interval_s=settings.analyzer_interval_s, keys=self.keys
            )
        self.policy = GuardedPolicy(inner, analyzer_fresh=self._analyzer_fresh if self.analyzer else None)
        config = EngineConfig(
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            block_size=settings.block_size,
            kv_cache_tokens=settings.kv_cache_tokens,
            max_model_len=settings.max_model_len,
            idle_poll_s=0.005,
        )
        self.engine = SimEngine(
            "engine-sim",
            self.profile,
            self.policy,
            config,
            rng=random.Random(settings.seed),
            # the objective's goodput, as the simulator's fleet and the vLLM plugin feed back
            feedback=partial(finished_view, Feedback.for_objective(settings.objective))
            if observes_feedback(inner)
            else None,
        )
        self.max_model_len = self.engine.max_model_len
        self.live: dict[str, Handle] = {}
        self._inbox: list[Handle] = []
        self._aborts: set[str] = set()
        self._programs: OrderedDict[str, ProgramState] = OrderedDict()
        self._priority: dict[str, int] = {}
        self._bounds_seen: object = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None
        self.behind_s = 0.0  # total time the engine's steps ran late against the model (wall seconds)
        # objects with on_tokens(h, n, t) (called before h is updated) and on_finish(h, reason, t)
        self.listeners: list[Any] = []
        self.aborted = 0
        self.rejected = 0
        self._report = Throttle(settings.report_interval_s)
        self._report_dirty = True
        self._finished_rows: list[Finished] = []

    def trusted(self, tags: EngineTags | None, raw: Any) -> EngineTags | None:
        """The request's tags if the engine may schedule by them; unsigned or forged ones: best effort."""
        if tags is None or self.keys is None:
            return tags
        why = distrust(tags, raw, self.keys().verify_keys, self.clock())
        if why is None:
            return tags
        self.unsigned_tags += 1
        if self.unsigned_tags == 1 or self.unsigned_tags % 1000 == 0:
            log.warning("SLO tags %s: scheduled best-effort (%d so far)", why, self.unsigned_tags)
        return None

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self.error = None
        self._task = asyncio.create_task(self._guarded_loop(), name="engine-sim-loop")

    @property
    def alive(self) -> bool:
        """True while the engine task runs (False before start, after stop, or after it crashed)."""
        return self._task is not None and not self._task.done()

    async def _guarded_loop(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # an engine bug: every live request ends, /health turns 503
            log.exception("engine-sim: the engine task died")
            self.error = repr(exc)
            now = self.clock()
            for h in list(self.live.values()):
                self._finish(h, "abort", now)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        now = self.clock()
        for h in list(self.live.values()):
            self._finish(h, "abort", now)
        if self.analyzer is not None:
            self.analyzer.close()

    # ---- requests in and out ----------------------------------------------------------------------

    def submit(self, sub: Submission) -> Handle:
        """Queue a request for the next step boundary; read its tokens from ``handle.events``."""
        if sub.request_id in self.live:
            raise ValueError(f"request id {sub.request_id!r} is already running")
        now = self.clock()
        sim = self._sim_request(sub, now)
        h = Handle(sub, sim, watch=watch(sub.tags, sim.arrival_s))
        if not self.alive:  # stopped or dead: the request ends at once instead of hanging
            h.finish_reason = "abort"
            h.events.put_nowait((0, now, "abort"))
            return h
        self.live[sub.request_id] = h
        self._inbox.append(h)
        if sub.priority:
            self._priority[sub.request_id] = sub.priority
        self._kick()
        return h

    def abort(self, request_id: str) -> None:
        """Take a request out of the engine at the next step boundary (client gone)."""
        if request_id in self.live:
            self._aborts.add(request_id)
            self._kick()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _sim_request(self, sub: Submission, now: float) -> SimRequest:
        tags = sub.tags
        targets = tags.targets if tags else BEST_EFFORT
        deadline_at = tags.deadline_at_s if tags else None
        if deadline_at is None and targets.kind is not RequestKind.LATENCY:
            deadline_at = now + targets.effective_deadline_s
        program = self._program(tags, targets, now) if tags and tags.program_id else None
        r = SimRequest(
            sub.request_id,
            now,
            targets,
            sub.prompt_tokens,
            output_tokens=sub.output_tokens,
            max_tokens=sub.max_tokens,
            deadline_at_s=deadline_at,
            output_bound=tags.output_bound if tags else None,
            tier=targets.priority_class,
            tenant=tags.tenant if tags else "default",
            program=program,
            stage=tags.stage if tags else None,
        )
        if program is not None:
            program.calls.append(r)
        return r

    def _program(self, tags: EngineTags, targets: SLOTargets, now: float) -> ProgramState | None:
        """The compound program a call belongs to (as far as this engine has seen it)."""
        pid = tags.program_id or ""
        p = self._programs.get(pid)
        if p is None:
            start = program_start_s(now, tags.program_start_at_s)
            try:
                p = ProgramState(pid, start, targets, (), tier=targets.priority_class, tenant=tags.tenant)
            except ValueError:  # a latency SLO has no program deadline
                return None
            if tags.deadline_at_s is not None:
                p.deadline_at_s = max(p.deadline_at_s, tags.deadline_at_s)
            self._programs[pid] = p
            while len(self._programs) > MAX_ENGINE_PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(pid)
            for c in p.calls:
                if c.request_id not in self.live:  # a finished call: keep its service, drop the object
                    p.attained_done_tokens += c.attained_tokens()
            p.calls = [c for c in p.calls if c.request_id in self.live]
            p.attained_cache = -1
        return p

    # ---- the engine task --------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        engine = self.engine
        sim_now = 0.0
        while True:
            # the engine's time: where the last step ended, unless that is more than MAX_LAG_S behind
            # the wall clock (timer jitter is caught up; a loop that cannot keep up falls behind)
            wall = self.clock()
            now = sim_now if wall - MAX_LAG_S <= sim_now else wall
            if 0.0 < sim_now < now:  # GPU time the host could not run in real time (lost for good)
                self.behind_s += now - sim_now
            self._refresh_bounds(self._apply_inbox(now))
            if self.settings.scheduling_policy == "priority" and len(engine.waiting) > 1:
                prio = self._priority
                engine.waiting.sort(key=lambda r: (prio.get(r.request_id, 0), r.arrival_s))
            steps_before = engine.steps_run
            end = engine.plan(now)
            self._collect_rejected(now)
            self._publish(now, force=False)
            if end is None or engine.steps_run == steps_before:
                # nothing to run, or requests wait for blocks/slots: sleep until woken (or poll)
                self._wake.clear()
                if self._inbox or self._aborts:
                    continue
                self._publish(now, force=True)  # the analyzer sees the idle engine as it is
                timeout = None if end is None else max(0.0, end - self.clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                sim_now = 0.0  # after idling, start again from the wall clock
                continue
            sim_now = end
            ahead_s = end - self.clock()
            # sleep to the step's end; steps shorter than the loop's timer resolution run ahead of the
            # wall clock (by at most MAX_AHEAD_S) so a high --speedup keeps the modelled throughput
            await asyncio.sleep(ahead_s if ahead_s > MAX_AHEAD_S else 0.0)
            out = engine.complete()  # tokens stamped with the modelled end of the step
            self._deliver(out.emitted, out.finished)
            engine.done.clear()

    def _apply_inbox(self, now: float) -> list[Handle]:
        """Apply queued aborts, then accept queued arrivals; returns the accepted handles."""
        if self._aborts:
            for rid in self._aborts:
                h = self.live.get(rid)
                if h is not None:
                    self.engine.abort(rid, now)  # between steps: leaves at once, blocks freed
                    self.aborted += 1
                    self._finish(h, "abort", now)
            self._aborts.clear()
            self._inbox = [h for h in self._inbox if h.request_id in self.live]
        accepted = []
        for h in self._inbox:
            if self.engine.accept(h.sim, now):
                accepted.append(h)
            else:  # the API layer checked the context already
                self._finish(h, "abort", now)
        self._inbox.clear()
        return accepted

    def _collect_rejected(self, now: float) -> None:
        """Requests the policy rejected during planning leave with finish reason ``abort``."""
        engine = self.engine
        if not engine.done:
            return
        for r in engine.done:
            h = self.live.get(r.request_id)
            if h is not None and r.state == REJECTED:
                self.rejected += 1
                self._finish(h, "abort", now, rejected=True)
        engine.done.clear()

    def _deliver(self, emitted: list[SimRequest], finished: list[SimRequest]) -> None:
        live = self.live
        done = {id(r) for r in finished}
        for r in emitted:
            h = live.get(r.request_id)
            if h is None:
                continue
            new = r.generated - h.seen_tokens
            if new <= 0:
                continue
            t = r.token_times[-1]
            for listener in self.listeners:
                listener.on_tokens(h, new, t)
            h.seen_tokens = r.generated
            if h.watch is not None:
                h.watch.tokens(r.generated, t)
            if h.first_token_s is None:
                h.first_token_s = t
            h.last_token_s = t
            reason = None
            if id(r) in done:
                reason = "length" if r.generated >= r.max_tokens else "stop"
                h.finish_reason = reason
                del live[r.request_id]
                self._priority.pop(r.request_id, None)
                for listener in self.listeners:
                    listener.on_finish(h, reason, t)
                self._finished_rows.append(self._row(h, reason))
            h.events.put_nowait((new, t, reason))
        self._report_dirty = True

    def _finish(self, h: Handle, reason: str, now: float, *, rejected: bool = False) -> None:
        if self.live.pop(h.request_id, None) is None:
            return
        self._priority.pop(h.request_id, None)
        h.finish_reason = reason
        h.events.put_nowait((0, now, reason))
        for listener in self.listeners:
            listener.on_finish(h, reason, now)
        self._finished_rows.append(self._row(h, reason, rejected=rejected))
        self._report_dirty = True

    def _row(self, h: Handle, reason: str, *, rejected: bool = False) -> Finished:
        """The request's Finished row: output length, tier, SLO outcome (core's rule) and prompt."""
        outcome = judge(h.watch, reason, rejected=rejected)
        return Finished(self._key(h), h.seen_tokens, reason, self._tier(h), outcome, h.sub.prompt_tokens)

    # ---- engine mode: the engine view published to the sidecar ------------------------------------

    @staticmethod
    def _key(h: Handle) -> str:
        tags = h.sub.tags
        return (tags.request_key if tags else "") or h.request_id

    @staticmethod
    def _tier(h: Handle) -> str:
        return (h.sub.tags.tier if h.sub.tags else None) or ""

    def _publish(self, now: float, *, force: bool) -> None:
        """Hand the analyzer client a snapshot (at most one per report interval; its thread sends it)."""
        publish = getattr(self.analyzer, "publish", None)
        if publish is None or not self._report_dirty or not (force or self._report.due(now)):
            return
        self._report_dirty = False
        if self._finished_rows:
            self.analyzer.finished(self._finished_rows)
            self._finished_rows = []
        publish(self.snapshot(now))

    def snapshot(self, now: float) -> EngineSnapshot:
        """The engine as its requests stand now (what the sidecar serves routers in engine mode)."""
        rows = []
        for h in self.live.values():
            r = h.sim
            phase = "waiting" if r.state != RUNNING else ("decode" if r.generated else "prefill")
            rows.append(
                RequestRow(
                    key=self._key(h),
                    phase=phase,
                    prompt_tokens=r.prompt_tokens,
                    generated_tokens=r.generated,
                    max_tokens=r.max_tokens,
                    arrival_unix_s=r.arrival_s,
                    tags=h.sub.tags,
                    first_token_unix_s=h.first_token_s or 0.0,
                )
            )
        e = self.engine
        return EngineSnapshot(
            snapshot_unix_s=now,
            step=e.steps_run,
            waiting=self.num_waiting,
            running=self.num_running,
            kv_usage=self.kv_usage,
            kv_cache_tokens=e.kv_blocks_total * self.settings.block_size,
            requests=tuple(rows),
            policy=self.policy.name,
            max_model_len=self.max_model_len,
            models=(self.model_name,),
        )

    # ---- analyzer bounds --------------------------------------------------------------------------

    def _analyzer_fresh(self) -> bool:
        return self.analyzer is not None and (
            self.analyzer.bounds_if_fresh(self.settings.stale_after_s) is not None
        )

    def _refresh_bounds(self, arrived: list[Handle]) -> None:
        """Write the analyzer's newest bounds into the engine's requests (by request key)."""
        if self.analyzer is None:
            return
        bounds = self.analyzer.bounds_if_fresh(self.settings.stale_after_s)
        if not bounds:
            return
        targets = arrived
        if bounds is not self._bounds_seen:
            self._bounds_seen = bounds
            targets = list(self.live.values())
        deadlines: dict[str, float] = getattr(self.analyzer, "deadlines", dict)()
        for h in targets:
            tags = h.sub.tags
            key = (tags.request_key if tags else "") or h.request_id
            bound = bounds.get(key)
            if bound is not None and bound != h.sim.output_bound:
                h.sim.output_bound = int(bound)
                h.sim.view_key = None  # the cached policy snapshot is stale now
            sub = deadlines.get(key) if tags is not None else None
            if sub is not None and sub != h.sim.deadline_at_s:  # a compound call's stage sub-deadline
                h.sim.deadline_at_s = sub
                h.sim.view_key = None

    # ---- state for metrics and tests --------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.engine.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.waiting) + len(self._inbox)

    @property
    def kv_usage(self) -> float:
        e = self.engine
        return 1.0 - e.free_blocks / e.kv_blocks_total
