"""The SLO tracker: every live request's resolved SLO, bound, phase and per-token timestamps.

Times are ``time.monotonic()`` seconds; :meth:`Tracker.unix` converts them for gRPC snapshots. On
completion a request's goodput (the configured function, ``slo_core.gain``) is computed from its
token timestamps and its record goes into the history.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slo_core.gain import Delivery, GainParams, goodput_function, ideal_gain, request_goodput
from slo_core.policies.base import RequestView
from slo_core.slo import RequestKind, SLOTargets, SLOTier
from slo_sidecar.analyzer import CompoundAnalyzer
from slo_sidecar.history import History

_SEQ = itertools.count()


@dataclass(eq=False)
class LiveRequest:
    """One accepted request from arrival to its end."""

    request_id: str
    tier: SLOTier
    targets: SLOTargets
    arrival_s: float
    prompt_text: str  # for refinement only; never logged
    prompt_tokens: int
    max_tokens: int
    max_wait_s: float
    bound: int
    deadline_at_s: float | None = None
    program_id: str | None = None
    stage: int | None = None
    program_arrival_s: float | None = None
    program_deadline_at_s: float | None = None
    tenant: str = "default"
    phase: str = "waiting"
    token_times_s: list[float] = field(default_factory=list)
    generated_text: list[str] = field(default_factory=list)
    preemptions: int = 0
    priority: float = 0.0
    bound_at_arrival: int = 0
    last_refined_tokens: int = 0
    plan: Any = None  # the calibrated analyzer's per-request plan (slo_core.predict.calibration.Plan)
    seq: int = field(default_factory=lambda: next(_SEQ))

    @property
    def generated_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def started(self) -> bool:
        return bool(self.token_times_s)

    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.arrival_s if self.token_times_s else 0.0

    def mean_tbt_s(self) -> float:
        t = self.token_times_s
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0

    def view(self, *, running: bool) -> RequestView:
        """The policy's snapshot: a released request has its prompt (and its output so far) computed."""
        computed = self.prompt_tokens + self.generated_tokens if running and self.started else 0
        return RequestView(
            request_id=self.request_id,
            slo=self.targets,
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt_tokens,
            max_tokens=self.max_tokens,
            generated_tokens=self.generated_tokens,
            computed_tokens=computed,
            deadline_at_s=self.deadline_at_s,
            first_token_s=self.token_times_s[0] if self.token_times_s else None,
            output_bound=self.bound,
            tenant=self.tenant,
            program_id=self.program_id,
            stage=self.stage,
            program_arrival_s=self.program_arrival_s,
            program_deadline_at_s=self.program_deadline_at_s,
            preemptions=self.preemptions,
        )


@dataclass
class Outcome:
    """What a finished (or failed) request earned, for metrics and the history."""

    earned: float
    ideal: float
    met_slo: bool
    output_tokens: int


class Tracker:
    """Live requests, active compound programs and the history of finished requests."""

    def __init__(
        self,
        history: History,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_offset_s: float | None = None,
    ) -> None:
        """``wall_offset_s``: unix time minus ``clock``'s (default: measured, for time.monotonic)."""
        self.history = history
        self.clock = clock
        self.live: dict[str, LiveRequest] = {}
        self.compound = CompoundAnalyzer(history.patterns)  # core's CompoundTracker, as in the simulator
        self._wall_offset_s = time.time() - time.monotonic() if wall_offset_s is None else wall_offset_s

    def unix(self, mono_s: float | None) -> float:
        return 0.0 if mono_s is None else mono_s + self._wall_offset_s

    def new_request(
        self,
        *,
        tier: SLOTier,
        targets: SLOTargets,
        prompt_text: str,
        prompt_tokens: int,
        max_tokens: int,
        max_wait_s: float,
        bound: int,
        program_id: str | None,
        stage: int | None,
        stated_stages: int | None,
        program_start_unix_s: float | None = None,
        request_id: str | None = None,
        tenant: str = "default",
    ) -> LiveRequest:
        now = self.clock()
        live = LiveRequest(
            request_id=request_id or f"sc-{uuid.uuid4().hex[:16]}",
            tier=tier,
            targets=targets,
            arrival_s=now,
            prompt_text=prompt_text,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            max_wait_s=max_wait_s,
            bound=bound,
            bound_at_arrival=bound,
            program_id=program_id,
            stage=stage,
            tenant=tenant,
        )
        if targets.kind is not RequestKind.LATENCY:
            live.deadline_at_s = now + targets.effective_deadline_s
        if program_id is not None:
            started = program_start_unix_s - self._wall_offset_s if program_start_unix_s else None
            self._place_in_program(live, tier, stated_stages, now, started)
        self.live[live.request_id] = live
        return live

    def _place_in_program(
        self, live: LiveRequest, tier: SLOTier, stated: int | None, now: float, started: float | None
    ) -> None:
        """Compound call: the program's arrival (``started``: the router's, on this tracker's clock) and
        deadline, and this stage's sub-deadline φ(s)·D."""
        assert live.program_id is not None
        prog = self.compound.program(live.program_id, now, live.targets.deadline_s, stated, start_s=started)
        live.program_arrival_s = prog.arrival_s
        live.program_deadline_at_s = prog.deadline_at_s
        sub = self.compound.call_arrived(prog, live.stage, tier, now)
        if live.stage is None:
            live.stage = prog.stage
        if sub is not None and live.targets.deadline_s is not None:
            live.deadline_at_s = sub

    def record_tokens(self, live: LiveRequest, n_tokens: int, text: str, now: float) -> None:
        if n_tokens <= 0:
            return
        live.token_times_s.extend([now] * n_tokens)
        if text:
            live.generated_text.append(text)
        live.phase = "decode"
        if live.bound < live.generated_tokens:
            live.bound = min(live.max_tokens, live.generated_tokens + 1)

    def outcome(self, live: LiveRequest, completed: bool, goodput: str, params: GainParams) -> Outcome:
        arrival = live.program_arrival_s if live.program_arrival_s is not None else live.arrival_s
        d = Delivery(
            slo=live.targets,
            arrival_s=arrival,
            input_tokens=live.prompt_tokens,
            token_times_s=tuple(live.token_times_s),
            completed=completed,
        )
        n_ideal = live.generated_tokens if completed else max(live.generated_tokens, live.bound)
        ideal = ideal_gain(d, goodput, params, output_tokens=n_ideal)
        earned = goodput_function(goodput)(d, params) if live.token_times_s else 0.0
        met = completed and request_goodput(d) > 0
        return Outcome(earned=earned, ideal=ideal, met_slo=met, output_tokens=live.generated_tokens)

    def finish(
        self, live: LiveRequest, outcome: Outcome, status: str, extra: dict[str, Any] | None = None
    ) -> None:
        """Leave the live set; completed requests become history rows (and program stages); ``extra``
        joins the row (the fields retraining needs: model, finish reason, opt-in prompt text)."""
        self.live.pop(live.request_id, None)
        now = self.clock()
        if status == "ok":
            self.history.add(
                {
                    "tier": live.tier.name,
                    "kind": live.targets.kind.value,
                    "priority_class": live.targets.priority_class,
                    "prompt_tokens": live.prompt_tokens,
                    "output_tokens": live.generated_tokens,
                    "max_tokens": live.max_tokens,
                    "bound_at_arrival": live.bound_at_arrival,
                    "ttft_s": round(live.ttft_s(), 6),
                    "e2e_s": round(now - live.arrival_s, 6),
                    "goodput": outcome.earned,
                    "ideal_goodput": outcome.ideal,
                    "met_slo": outcome.met_slo,
                    "preemptions": live.preemptions,
                    "program_id": live.program_id,
                    "stage": live.stage,
                    "finish_unix_s": round(self.unix(now), 3),
                    **(extra or {}),
                }
            )
        self._record_stage(live, now, status == "ok")

    def _record_stage(self, live: LiveRequest, now: float, ok: bool) -> None:
        if live.program_id is None:
            return
        prog = self.compound.programs.get(live.program_id)
        if prog is not None:
            self.compound.call_ended(
                prog,
                live.stage,
                ok=ok,
                input_tokens=live.prompt_tokens,
                output_tokens=live.generated_tokens,
                now_s=now,
            )

    def expire_programs(self, idle_s: float = 600.0) -> None:
        """Programs whose last call is long gone end; a program that finished stages becomes a pattern."""
        now = self.clock()
        for pid, prog in list(self.compound.programs.items()):
            busy = any(r.program_id == pid for r in self.live.values())
            if not busy and now - prog.last_seen_s > idle_s:
                self.compound.finish(prog, now, store=not prog.failed)
