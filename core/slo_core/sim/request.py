"""Mutable per-request and per-program state of a simulation (plain slotted objects: the hot path).

Token accounting follows vLLM v1: a request has ``num_tokens = prompt + generated`` tokens; an engine
step computes some of them (a prefill chunk, or the one new token of a decode); whenever all of them
are computed a new output token is sampled and delivered at the end of that step. A preemption
resets ``computed`` to 0, so the prompt and every generated token are recomputed before the next
token comes out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slo_core.policies.base import attained_service
from slo_core.predict.compound import fallback_stage_deadline_at_s
from slo_core.slo import SLOTargets

if TYPE_CHECKING:
    from slo_core.predict.estimator import BoundSchedule
    from slo_core.sim.analyzer import CalibratedSchedule

WAITING = 0
RUNNING = 1
FINISHED = 2
REJECTED = 3
UNARRIVED = 4
ABORTED = 5


class ProgramState:
    """A compound request (a DAG of stages, each a set of parallel calls) as it runs."""

    __slots__ = (
        "arrival_s",
        "attained_cache",
        "attained_done_tokens",
        "calls",
        "deadline_at_s",
        "failed",
        "finish_s",
        "index",
        "live_from",
        "max_tokens",
        "next_stage",
        "pending_calls",
        "program_id",
        "slo",
        "stages",
        "tenant",
        "tier",
    )

    def __init__(
        self,
        program_id: str,
        arrival_s: float,
        slo: SLOTargets,
        stages: tuple[tuple[tuple[int, int], ...], ...],
        *,
        tier: str = "",
        tenant: str = "default",
        max_tokens: int = 4096,
        index: int = -1,
    ) -> None:
        self.program_id = program_id
        self.max_tokens = max_tokens
        self.index = index
        self.arrival_s = arrival_s
        self.slo = slo
        self.stages = stages
        self.tier = tier
        self.tenant = tenant
        self.deadline_at_s = arrival_s + slo.effective_deadline_s
        self.next_stage = 0
        self.pending_calls = 0
        self.calls: list[SimRequest] = []
        # calls before this index belong to finished stages (a stage starts once every call of the
        # one before left), so none of them runs or waits and their service is in
        # attained_done_tokens: the fleet moves it past a stage's calls as the stage ends
        self.live_from = 0
        self.attained_done_tokens = 0
        # attained_tokens() memoized; -1: stale. Whoever changes a call's computed/generated/state or
        # attained_done_tokens resets it (the engine's step, preemption and leaving; the fleet's stage end)
        self.attained_cache = -1
        self.finish_s: float | None = None
        self.failed = False

    @property
    def done(self) -> bool:
        return self.finish_s is not None

    def attained_tokens(self) -> int:
        """Autellix's attained service: tokens served to the program so far (no recompute counted).

        A call of the running stage that has left (finished, aborted, rejected) keeps its service, as
        the vLLM plugin and engine-sim count it (their ``done_tokens`` grows as a call ends): only
        a preempted prefill gives service back."""
        cached = self.attained_cache
        if cached >= 0:
            return cached
        live = 0
        for c in self.calls[self.live_from :]:
            live += c.attained_tokens()
        self.attained_cache = total = self.attained_done_tokens + live
        return total

    def stage_deadline_at_s(self, stage: int, release_s: float) -> float:
        """Sub-deadline of a stage's calls without an analyzer or tier shares: the time left split
        equally over the stages left (core's fallback rule, the sidecar's), never after the deadline."""
        return fallback_stage_deadline_at_s(
            self.deadline_at_s, self.arrival_s, release_s, stage, stages=len(self.stages)
        )


class SimRequest:
    """One request (or one call of a compound program) inside the simulated fleet."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "bound_from",
        "bound_schedule",
        "bound_until",
        "computed",
        "deadline_at_s",
        "expected_tokens",
        "finish_s",
        "first_scheduled_s",
        "generated",
        "max_tokens",
        "num_tokens",
        "output_bound",
        "output_tokens",
        "preemptions",
        "program",
        "prompt_tokens",
        "replica",
        "request_id",
        "slo",
        "stage",
        "state",
        "target_tokens",
        "tenant",
        "tier",
        "token_times",
        "view",
        "view_key",
        "waiting_since_s",
    )

    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        slo: SLOTargets,
        prompt_tokens: int,
        *,
        output_tokens: int,
        max_tokens: int,
        deadline_at_s: float | None = None,
        output_bound: int | None = None,
        tier: str = "",
        tenant: str = "default",
        program: ProgramState | None = None,
        stage: int | None = None,
    ) -> None:
        if prompt_tokens < 1 or output_tokens < 1 or max_tokens < 1:
            raise ValueError(f"request {request_id}: prompt, output and max tokens must be >= 1")
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.slo = slo
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        # the request stops at its true length (EOS) or at its cap, whichever comes first
        self.target_tokens = min(output_tokens, max_tokens)
        self.deadline_at_s = deadline_at_s
        self.output_bound = output_bound
        # what the router's load measure assumes the request will generate (bound, else cap)
        self.expected_tokens = output_bound if output_bound is not None else max_tokens
        self.tier = tier
        self.tenant = tenant
        self.program = program
        self.stage = stage
        self.computed = 0
        self.generated = 0
        self.num_tokens = prompt_tokens
        self.blocks = 0
        self.token_times: list[float] = []
        self.first_scheduled_s: float | None = None
        self.finish_s: float | None = None
        self.preemptions = 0
        self.waiting_since_s = arrival_s
        self.replica = -1
        self.state = UNARRIVED
        self.view: object | None = None
        self.bound_schedule: BoundSchedule | CalibratedSchedule | None = (
            None  # the analyzer's bounds by generated tokens
        )
        # the program's attained service the cached view was built with (-1: not a program's call);
        # None: the view is stale (sim/views.py; cleared wherever a field a view carries changes)
        self.view_key: int | None = None
        # output_bound holds for generated in [bound_from, bound_until) (BoundSchedule.held; empty: ask)
        self.bound_from = 0
        self.bound_until = 0

    def set_state(self, state: int) -> None:
        """Move to ``state``; a change makes the cached view stale (a view carries the state)."""
        if self.state != state:
            self.state = state
            self.view_key = None

    def cap_to_context(self, max_model_len: int) -> bool:
        """Cap max_tokens so prompt + output fits the context (as vLLM does); False if the prompt cannot."""
        room = max_model_len - self.prompt_tokens
        if room < 1:
            return False
        if self.max_tokens > room:
            self.max_tokens = room
            self.view_key = None  # a view carries max_tokens and the target
            self.target_tokens = min(self.output_tokens, room)
            if self.output_bound is None:
                self.expected_tokens = room
        return True

    def attained_tokens(self) -> int:
        """Tokens of service received, counting each prompt token once (recompute not counted)."""
        return attained_service(self.prompt_tokens, self.computed, self.generated)

    def outstanding_tokens(self) -> int:
        """The router's load measure: unprefilled prompt plus remaining expected output (bound or cap)."""
        return max(0, self.prompt_tokens - self.computed) + max(0, self.expected_tokens - self.generated)

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id!r}, state={self.state}, computed={self.computed}, "
            f"generated={self.generated}/{self.target_tokens})"
        )
