"""Turns vLLM ``Request`` objects into policy snapshots and tracks frames; no vLLM import here.

The bridge is duck-typed over the few ``Request`` attributes it reads (``request_id``,
``arrival_time``, ``num_prompt_tokens``, ``num_computed_tokens``, ``num_output_tokens``,
``max_tokens``, ``num_preemptions``, ``sampling_params.extra_args``), so it is unit-testable without
an engine and survives vLLM refactors that keep those names.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

from slo_core.policies.apply import ordered
from slo_core.policies.base import (
    MAX_ENGINE_PROGRAMS,
    Decision,
    EnginePolicy,
    EngineView,
    RequestView,
    RequestViewSlots,
    attained_service,
    decision_due,
    quiet_step,
    request_id_of,
)
from slo_core.policies.feedback import Feedback
from slo_core.policies.guard import GuardedPolicy
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags, decode_tags, distrust, program_start_s

log = logging.getLogger(__name__)


BEST_EFFORT = SLOTargets(RequestKind.BEST_EFFORT)
FINISHED = frozenset({"stop", "length"})  # vLLM's finish reasons of a request that ended on its own


@dataclass(slots=True)
class ProgramSeen:
    """A compound program as this engine has seen it: engine-sim's ProgramState rule (arrival of its
    first call here; deadline that arrival plus the SLO's, or the tags' when later), and the service
    its finished calls got here."""

    arrival_s: float
    deadline_at_s: float
    done_tokens: int = 0


def attained_tokens(request: Any) -> int:
    """core's attained service of a vLLM request (as the simulator counts a SimRequest's)."""
    return attained_service(
        int(request.num_prompt_tokens), int(request.num_computed_tokens), int(request.num_output_tokens)
    )


def _delivered(times: list[float], total: int, now_s: float) -> None:
    """Output tokens beyond ``len(times)`` up to ``total`` were delivered at ``now_s``."""
    new = total - len(times)
    if new > 0:
        times.extend(repeat(now_s, new))


# a snapshot's values, in this order: request_id, slo, arrival_s, prompt_tokens, max_tokens,
# generated_tokens, computed_tokens, deadline_at_s, output_bound, tenant, program_id, stage,
# preemptions, program_arrival_s, program_deadline_at_s, program_attained_tokens
_Fields = tuple[
    str,
    SLOTargets,
    float,
    int,
    int,
    int,
    int,
    float | None,
    int | None,
    str,
    str | None,
    int | None,
    int,
    float | None,
    float | None,
    int,
]


@dataclass(slots=True)
class _Fixed:
    """What a request's snapshot takes from its tags and its fixed counts (:meth:`PolicyBridge._fixed`)."""

    tags: EngineTags | None
    targets: SLOTargets
    arrival_s: float
    key: str  # the analyzer's key of its bound and sub-deadline
    tags_deadline_at_s: float | None
    own_deadline_at_s: float | None
    tags_bound: int | None
    tenant: str
    program_id: str | None
    stage: int | None
    prompt_tokens: int
    max_tokens: int


# what a snapshot's values follow from besides the request's fixed part: its output, computed and
# preemption counts as vLLM keeps them, its sub-deadline and bound lookups, and for a program's call
# the program's service, arrival and deadline and its calls' live service here
_Stamp = tuple[Any, Any, Any, float | None, int | None, tuple[int, float, float, int | None] | None]
_Seen = tuple[_Fixed, _Fields, RequestView, _Stamp]


def _view_of(f: _Fields) -> RequestView:
    """``RequestView(...)`` of the values ``f``, built through core's slots twin (a frozen dataclass's
    __init__ costs ~2.7 µs a snapshot, most of a running request's at every decision)."""
    v = object.__new__(RequestViewSlots)
    (
        v.request_id,
        v.slo,
        v.arrival_s,
        v.prompt_tokens,
        v.max_tokens,
        v.generated_tokens,
        v.computed_tokens,
        v.deadline_at_s,
        v.output_bound,
        v.tenant,
        v.program_id,
        v.stage,
        v.preemptions,
        v.program_arrival_s,
        v.program_deadline_at_s,
        v.program_attained_tokens,
    ) = f
    v.first_token_s = None
    v.true_output_tokens = None
    v.waiting_since_s = None
    v.__class__ = RequestView
    view: RequestView = v
    return view


class PolicyBridge:
    """Builds snapshots, decides when a frame is due, and remembers the last admission order."""

    def __init__(
        self,
        policy: EnginePolicy,
        *,
        bounds: Callable[[], Mapping[str, int] | None] = lambda: {},
        deadlines: Callable[[], Mapping[str, float]] = lambda: {},
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        tag_keys: Sequence[bytes] | Callable[[], Sequence[bytes]] | None = None,
        on_unsigned: Callable[[str], None] = lambda _why: None,
        on_quiet: Callable[[], None] = lambda: None,
        feedback: Feedback | None = None,
    ) -> None:
        self.policy = policy
        self.guard = GuardedPolicy(
            policy
        )  # core's degrade-to-stock guard (engine-sim and sidecar use it too)
        # a policy that learns from finishes (observe) is told of each, as the simulator tells it:
        # core's Feedback over the output tokens' times (kept only for such a policy)
        self.feedback = feedback if feedback is not None and self.guard.observes_feedback else None
        self._token_times: dict[str, list[float]] = {}
        # None: tags are trusted as they come; keys (or a function giving the current ones, as the
        # mounted Secret is rotated): only tags signed by one of them count
        self.tag_keys = tag_keys
        self.on_unsigned = on_unsigned
        self.on_quiet = on_quiet  # told of each decision left out as quiet (the plugin's metric)
        self.unsigned = 0
        self._bounds = bounds
        self._deadlines = deadlines
        self._deadline_now: Mapping[str, float] = {}
        self._clock = clock
        self._rng = random.Random(seed)
        self._tags: dict[str, EngineTags | None] = {}
        # per request id: its fixed fields, the values of its last decision's snapshot, that snapshot,
        # and what those values followed from (_Stamp)
        self._snapshots: dict[str, _Seen] = {}
        self._programs: OrderedDict[str, ProgramSeen] = OrderedDict()
        self._events = True
        # a latency request arrived since the last decision: a deep queue's decision is not left for
        # later then (core's event_deferred, as the simulator applies it)
        self._urgent = False
        self.step = 0
        self.last_admit: tuple[str, ...] = ()
        self.last_running_order: tuple[str, ...] | None = None
        self.token_budget: int | None = None
        self.hold_unlisted = False
        self.decisions = 0
        self.quiet_skipped = 0  # decisions left out as quiet

    def note_event(self) -> None:
        """An arrival or a finish happened: policies that reschedule on events get a call."""
        self._events = True

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._tags.pop(rid, None)

    def program(self, tags: EngineTags | None, arrival_s: float) -> ProgramSeen | None:
        """The compound program a request's tags name (None: none, or a latency SLO, which has no
        program deadline); first seen now, it arrives with this request."""
        if tags is None or not tags.program_id or tags.targets.kind is RequestKind.LATENCY:
            return None
        pid = tags.program_id
        p = self._programs.get(pid)
        if p is None:
            arrival_s = program_start_s(arrival_s, tags.program_start_at_s)
            deadline = arrival_s + tags.targets.effective_deadline_s
            if tags.deadline_at_s is not None:
                deadline = max(deadline, tags.deadline_at_s)
            p = self._programs[pid] = ProgramSeen(arrival_s, deadline)
            while len(self._programs) > MAX_ENGINE_PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(pid)
        return p

    def arrived(self, request: Any) -> None:
        """A request entered the engine (its output tokens' times are kept for the feedback)."""
        if self.feedback is not None:
            self._token_times[request.request_id] = []
        if self.guard.deep_queue_from:
            tags = self.tags(request)
            if tags is not None and tags.targets.kind is RequestKind.LATENCY:
                self._urgent = True

    def made_tokens(self, request: Any, now_s: float) -> None:
        """``request`` has ``num_output_tokens`` at ``now_s``: the new ones were delivered now."""
        times = self._token_times.get(request.request_id)
        if times is not None:
            _delivered(times, int(request.num_output_tokens), now_s)

    def call_ended(
        self,
        request: Any,
        finish_reason: str = "abort",
        *,
        rejected: bool = False,
        now_s: float | None = None,
    ) -> None:
        """A request left the engine (finished, aborted or rejected): one that finished on its own
        ("stop", "length") is fed back to the policy as the simulator does (an aborted or rejected one
        is not); its program keeps its service."""
        times = self._token_times.pop(request.request_id, None)
        if times is not None and self.feedback is not None and finish_reason in FINISHED and not rejected:
            try:
                self._feed_back(request, times, finish_reason, now_s)
            except Exception:  # the feedback must never fail an engine step
                log.exception("request %s: could not feed back its finish", request.request_id)
        tags = self._tags.get(request.request_id)
        if tags is not None and tags.program_id and (p := self._programs.get(tags.program_id)):
            p.done_tokens += attained_tokens(request)

    def _feed_back(self, request: Any, times: list[float], finish_reason: str, now_s: float | None) -> None:
        assert self.feedback is not None
        now = self._clock() if now_s is None else now_s
        generated = int(request.num_output_tokens)
        _delivered(times, generated, now)  # the step that finished it
        view = self.view(request, {})
        if finish_reason == "length":
            # cut at a length (max_tokens, or the context): as the simulator caps max_tokens to the
            # context, the view says it was cut, so no one reads the cut as the request's true length
            view = replace(view, max_tokens=generated)
        done = self.feedback(view, times, finish_s=now, output_tokens=generated)
        self.guard.observe([done], now)

    def frame_due(
        self, n_waiting: int, running: Sequence[Any], stock_budget: int, free_blocks: int, block_size: int
    ) -> bool:
        """Whether the policy decides this step: a frame boundary or an event, events taken every so
        many steps over a deep queue (core's ``decision_due``), unless the decision is quiet and the
        policy leaves those out (core's ``quiet_step``): the rules the simulator applies.
        ``n_waiting``: requests waiting, held ones included; ``running``: vLLM's running requests;
        ``stock_budget``: the engine's own token budget, in force while the policy set none;
        ``free_blocks``, ``block_size``: the KV pool's free blocks and their size."""
        g = self.guard
        if not decision_due(
            self.step,
            g.frame_steps,
            g.reschedule_on_events,
            self._events,
            n_waiting,
            deep_queue_from=g.deep_queue_from,
            deep_queue_every=g.deep_queue_every,
            urgent=self._urgent,
        ):
            return False
        b = self.token_budget
        budget = b if b is not None and 0 < b < stock_budget else stock_budget  # as schedule() applies it
        if self.guard.skip_quiet_decisions and quiet_step(
            n_waiting,
            ((int(r.num_tokens), int(r.num_computed_tokens)) for r in running),
            budget,
            free_blocks,
            block_size,
        ):
            self._events = False  # the finishes it would have seen are taken into account
            self.quiet_skipped += 1
            self.on_quiet()
            return False
        return True

    def tags(self, request: Any) -> EngineTags | None:
        rid = request.request_id
        if rid not in self._tags:
            extra = getattr(request.sampling_params, "extra_args", None) if request.sampling_params else None
            try:
                tags = decode_tags(extra)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "request %s: ignoring malformed SLO tags (%s); scheduling it best-effort", rid, exc
                )
                tags = None
            if self.tag_keys is not None:
                keys = self.tag_keys() if callable(self.tag_keys) else self.tag_keys
                why = distrust(tags, extra, keys, self._clock())
                if why is not None:
                    # SLO tags not signed by the router: a caller that skipped it. Best-effort.
                    self.unsigned += 1
                    self.on_unsigned(why)
                    if self.unsigned == 1 or self.unsigned % 1000 == 0:
                        log.warning(
                            "request %s: SLO tags %s; scheduled best-effort (%d so far)",
                            rid,
                            why,
                            self.unsigned,
                        )
                    tags = None
            self._tags[rid] = tags
        return self._tags[rid]

    def view(
        self, request: Any, bounds: Mapping[str, int], live_service: Mapping[str, int] | None = None
    ) -> RequestView:
        """The policy's snapshot of a request. ``live_service``: per program, the attained tokens of
        its calls live in this engine now (:meth:`decide` sums them; without it, this request's)."""
        return _view_of(self._fields(self._fixed(request), request, bounds, live_service))

    def _fixed(self, request: Any) -> _Fixed:
        """What a request's snapshot takes from its tags and its fixed counts (the same for its life
        in the engine: its tags are decoded once)."""
        tags = self.tags(request)
        targets = tags.targets if tags else BEST_EFFORT
        arrival = float(request.arrival_time)
        return _Fixed(
            tags=tags,
            targets=targets,
            arrival_s=arrival,
            key=(tags.request_key if tags else "") or request.request_id,
            tags_deadline_at_s=tags.deadline_at_s if tags else None,
            # without a deadline from the analyzer or the tags: the SLO's from arrival (none for latency)
            own_deadline_at_s=None
            if targets.kind is RequestKind.LATENCY
            else arrival + targets.effective_deadline_s,
            tags_bound=tags.output_bound if tags else None,
            tenant=tags.tenant if tags else "default",
            program_id=tags.program_id if tags else None,
            stage=tags.stage if tags else None,
            prompt_tokens=int(request.num_prompt_tokens),
            max_tokens=int(request.max_tokens),
        )

    def _fields(
        self, f: _Fixed, request: Any, bounds: Mapping[str, int], live_service: Mapping[str, int] | None
    ) -> _Fields:
        """What :meth:`view` puts in the snapshot, in :data:`_Fields` order: equal tuples, equal views."""
        program = self.program(f.tags, f.arrival_s) if f.program_id else None
        sub_deadline = self._deadline_now.get(f.key) if f.tags else None
        return self._fields_from(
            f,
            request,
            sub_deadline_at_s=sub_deadline,
            bound=bounds.get(f.key, f.tags_bound),
            program=program,
            live_service=live_service,
        )

    @staticmethod
    def _fields_from(
        f: _Fixed,
        request: Any,
        *,
        sub_deadline_at_s: float | None,
        bound: int | None,
        program: ProgramSeen | None,
        live_service: Mapping[str, int] | None,
    ) -> _Fields:
        """:meth:`_fields` from what it looks up: the analyzer's sub-deadline and bound for ``f``'s key
        and the program its tags name (:meth:`program`), each looked up once a decision."""
        # a compound call's stage sub-deadline from the analyzer, else the deadline its tags carry
        deadline_at = sub_deadline_at_s or f.tags_deadline_at_s
        if deadline_at is None:
            deadline_at = f.own_deadline_at_s
        prompt = f.prompt_tokens
        generated = int(request.num_output_tokens)
        computed = int(request.num_computed_tokens)
        attained = attained_service(prompt, computed, generated)
        pid = f.program_id
        if program is not None and pid:  # as core's simulator views a call: its program's, not its own
            live = live_service.get(pid) if live_service is not None else None
            program_arrival: float | None = program.arrival_s
            program_deadline: float | None = program.deadline_at_s
            attained = program.done_tokens + (attained if live is None else live)
        else:
            program_arrival = program_deadline = None
        return (
            request.request_id,
            f.targets,
            f.arrival_s,
            prompt,
            f.max_tokens,
            generated,
            computed,
            deadline_at,
            bound,
            f.tenant,
            f.program_id,
            f.stage,
            int(getattr(request, "num_preemptions", 0)),
            program_arrival,
            program_deadline,
            attained,
        )

    def decide(
        self, waiting: Sequence[Any], running: Sequence[Any], engine: Callable[[float], EngineView]
    ) -> Decision:
        """Call the policy on fresh snapshots (the caller checked :meth:`frame_due`).

        A policy error yields the stock decision (``guard.degraded_reason`` says why)."""
        bounds = self._bounds() or {}
        self._deadline_now = deadline_now = self._deadlines() if bounds else {}
        now = self._clock()
        # a request whose snapshot would carry the same values as at the last decision gets the same
        # snapshot object: building ~5,000 of them was most of a deep queue's decision, and a
        # columnar policy (GMAX's table) re-reads only the ones that changed
        last = self._snapshots
        kept: dict[str, _Seen] = {}
        reqs = (*waiting, *running)
        seen_of = list(map(last.get, map(request_id_of, reqs)))  # an attrgetter: any request's id
        fixed_of = [
            self._fixed(req) if seen is None else seen[0] for req, seen in zip(reqs, seen_of, strict=True)
        ]
        live: dict[str, int] = {}  # per program, the service of its calls live here
        for req, fixed in zip(reqs, fixed_of, strict=True):
            pid = fixed.program_id
            if pid:
                live[pid] = live.get(pid, 0) + attained_tokens(req)
        views: list[RequestView] = []
        append = views.append
        for req, seen, fixed in zip(reqs, seen_of, fixed_of, strict=True):
            pid = fixed.program_id
            program = self.program(fixed.tags, fixed.arrival_s) if pid else None
            sub_deadline = deadline_now.get(fixed.key) if fixed.tags else None
            bound = bounds.get(fixed.key, fixed.tags_bound)
            # a snapshot's values follow from these (and the fixed part): equal stamps, equal values
            stamp: _Stamp = (
                req.num_output_tokens,
                req.num_computed_tokens,
                getattr(req, "num_preemptions", 0),
                sub_deadline,
                bound,
                None
                if program is None or not pid
                else (program.done_tokens, program.arrival_s, program.deadline_at_s, live.get(pid)),
            )
            if seen is not None and seen[3] == stamp:
                kept[req.request_id] = seen
                append(seen[2])
                continue
            fields = self._fields_from(
                fixed, req, sub_deadline_at_s=sub_deadline, bound=bound, program=program, live_service=live
            )
            view = seen[2] if seen is not None and seen[1] == fields else _view_of(fields)
            kept[req.request_id] = (fixed, fields, view, stamp)
            append(view)
        w, r = views[: len(waiting)], views[len(waiting) :]
        self._snapshots = kept  # requests that left the engine drop out
        decision = self.guard.decide(w, r, engine(now), self._rng)
        self._events = False
        self._urgent = False
        self.decisions += 1
        self.last_admit = decision.admit
        self.last_running_order = decision.running_order
        self.token_budget = decision.token_budget
        self.hold_unlisted = decision.hold_unlisted
        return decision

    def order_running(self, running: Sequence[Any]) -> list[Any]:
        """Order running requests by the last decision (listed first, the rest in current order).

        vLLM v1 hands the token budget to running requests in list order and, when KV blocks run
        out, preempts from the end of the list, so this order is also the policy's preemption order.
        """
        if not self.last_running_order:
            return list(running)
        listed, rest = ordered(running, self.last_running_order)  # as slo_core.policies.apply orders
        return listed + rest

    def order_waiting(self, waiting: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Order waiting requests by the last decision: (to offer the engine, to hold back)."""
        listed, unlisted = ordered(waiting, self.last_admit)  # as slo_core.policies.apply orders
        if self.hold_unlisted:
            return listed, unlisted
        return listed + unlisted, []
