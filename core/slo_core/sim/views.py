"""Immutable policy snapshots (RequestView) built from the simulator's mutable request state.

A view is rebuilt only when the request changed since the last one (its computed, generated and
preempted counts, its queue state and, for a call of a compound program, the program's attained
service), so requests that merely wait cost one comparison per decision. The engine clears a
request's ``view_key`` wherever it changes one of its own counts or its state (as does anyone who
changes a field a view carries, e.g. a new sub-deadline); ``view_key`` otherwise holds the program's
attained service the view was built with (-1 outside a program), so an unchanged request is
recognised without reading its counts. A program's attained service is memoized on the program and
recomputed only after one of its calls made progress.

:class:`LiveViews` hands a columnar policy (GMAX) the running requests without a snapshot of each:
the values their snapshots would carry, read from the requests when the policy's table asks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any, overload

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EngineView, RequestView, RequestViewSlots, request_id_of, slots_twin
from slo_core.policies.gmax_snapshot import PROGRESS, BoundCarrier, LiveSnapshots
from slo_core.predict.estimator import BoundSchedule
from slo_core.sim.request import WAITING, SimRequest

# the simulator builds a RequestView for every request that moved at every decision, and an
# EngineView per decision: through slots twins, not the frozen dataclasses' slow __init__
_EngineViewSlots = slots_twin(
    EngineView,
    (
        "now_s",
        "step",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_blocks_total",
        "kv_blocks_free",
        "block_size",
        "profile",
        "engine_id",
    ),
)
_object_new = object.__new__


def _new_view(r: SimRequest, program_attained: int) -> RequestView:
    """``RequestView(...)`` of ``r``'s current state (``program_attained``: its program's attained
    tokens, when it is a program's call)."""
    program = r.program
    v = _object_new(RequestViewSlots)
    v.request_id = r.request_id
    v.slo = r.slo
    v.arrival_s = r.arrival_s
    v.prompt_tokens = r.prompt_tokens
    v.max_tokens = r.max_tokens
    v.generated_tokens = r.generated
    v.computed_tokens = r.computed
    v.deadline_at_s = r.deadline_at_s
    v.first_token_s = r.token_times[0] if r.token_times else None
    v.output_bound = r.output_bound
    v.true_output_tokens = r.target_tokens
    v.tenant = r.tenant
    if program is not None:
        v.program_id = program.program_id
        v.program_arrival_s = program.arrival_s
        v.program_deadline_at_s = program.deadline_at_s
        v.program_attained_tokens = program_attained
    else:
        v.program_id = None
        v.program_arrival_s = None
        v.program_deadline_at_s = None
        # slo_core.policies.base.attained_service, inline (a call per view was a tenth of its cost)
        g = r.generated
        v.program_attained_tokens = (r.prompt_tokens if g > 0 else min(r.computed, r.prompt_tokens)) + g
    v.stage = r.stage
    v.preemptions = r.preemptions
    v.waiting_since_s = r.waiting_since_s if r.state == WAITING else None
    v.__class__ = RequestView
    view: RequestView = v
    return view


def new_engine_view(
    *,
    now_s: float,
    step: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_blocks_total: int,
    kv_blocks_free: int,
    block_size: int,
    profile: PerfProfile | None,
    engine_id: str,
) -> EngineView:
    """``EngineView(...)``, built through :func:`slots_twin` (one a decision)."""
    v = _object_new(_EngineViewSlots)
    v.now_s = now_s
    v.step = step
    v.max_num_seqs = max_num_seqs
    v.max_num_batched_tokens = max_num_batched_tokens
    v.kv_blocks_total = kv_blocks_total
    v.kv_blocks_free = kv_blocks_free
    v.block_size = block_size
    v.profile = profile
    v.engine_id = engine_id
    v.__class__ = EngineView
    view: EngineView = v
    return view


def request_view(r: SimRequest, program_attained: int | None = None) -> RequestView:
    """The snapshot of ``r`` a policy or router sees (cached while ``r`` does not change).

    ``program_attained``: the program's attained tokens when the caller already summed them.
    """
    program = r.program
    if program is not None:
        attained = program_attained if program_attained is not None else program.attained_tokens()
    else:
        attained = -1
    if r.view_key == attained:
        return r.view  # type: ignore[return-value]
    return _refresh(r, attained)


def _hold_bound(r: SimRequest, sched: BoundSchedule, g: int) -> None:
    """Set ``r``'s bound from its plain schedule at ``g`` generated tokens (``g`` outside the run of
    counts the bound last held for)."""
    r.output_bound, r.bound_until = sched.held(g)
    r.bound_from = g


def _refresh(r: SimRequest, attained: int) -> RequestView:
    """A new view of ``r`` (it changed since its last view, or has none)."""
    sched = r.bound_schedule
    # the analyzer re-estimates the bound as tokens stream (§4.1); a plain schedule is a pure function
    # of the tokens generated, constant over runs of counts (``held``), so only a count outside the
    # last run needs a new bound (a calibrated one learns: always)
    if sched is not None:
        g = r.generated
        if type(sched) is not BoundSchedule:
            r.output_bound = sched.at(g)
        elif not r.bound_from <= g < r.bound_until:
            _hold_bound(r, sched, g)
    view = _new_view(r, attained)
    r.view = view
    r.view_key = attained
    return view


def request_views(requests: list[SimRequest]) -> list[RequestView]:
    """Views of ``requests`` in order: a request that did not change since its last view costs one
    comparison (a program's attained service is memoized on the program, see ProgramState)."""
    out: list[RequestView] = []
    append = out.append
    for r in requests:
        p = r.program
        if p is None:
            a = -1
        else:
            a = p.attained_cache  # ProgramState.attained_tokens' memo, read here without the call
            if a < 0:
                a = p.attained_tokens()
        if r.view_key == a:
            append(r.view)  # type: ignore[arg-type]
        else:
            append(_refresh(r, a))
    return out


_generated_of = attrgetter("generated")
_computed_of = attrgetter("computed")
_bound_of = attrgetter("output_bound")
_deadline_of = attrgetter("deadline_at_s")
_state_of = attrgetter("state")


class LiveViews(LiveSnapshots):
    """An engine's running requests, for a policy that reads them through its SnapshotTable (see
    :class:`slo_core.policies.gmax_snapshot.LiveSnapshots`): a snapshot is built only for a request
    read by index or iteration (then for all of them, once), the table reads the progress fields from
    the requests themselves. :meth:`close` when the decision returns."""

    __slots__ = ("_n", "_open", "_reqs", "_views")

    def __init__(self, requests: list[SimRequest]) -> None:
        self._reqs = requests
        self._n = len(requests)
        self._views: list[RequestView] | None = None
        self._open = True

    def close(self) -> None:
        """The decision returned: the requests move on, and only snapshots already built stay."""
        self._open = False
        self._reqs = []

    def _built(self) -> list[RequestView]:
        views = self._views
        if views is None:
            views = self._views = request_views(self._live())
        return views

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> RequestView: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestView]: ...
    def __getitem__(self, i: int | slice) -> RequestView | list[RequestView]:
        return self._built()[i]

    def __iter__(self) -> Iterator[RequestView]:
        return iter(self._built())

    def _live(self) -> list[SimRequest]:
        if not self._open:
            raise RuntimeError("live snapshots read after the decision they were passed to")
        return self._reqs

    def request_ids(self) -> list[str]:
        return list(map(request_id_of, self._live()))

    def view_at(self, i: int) -> RequestView:
        return request_view(self._live()[i])

    def progress(self) -> tuple[list[Any], ...]:
        """generated, computed, bound, deadline, waiting-since and program attained tokens, as
        :func:`_new_view` would set them after :func:`_refresh` (a bound from a calibrated schedule,
        which learns as it is read, through the request's view: read where a view would be)."""
        reqs = self._live()
        attained: list[int] = []
        append = attained.append
        for r in reqs:  # bring each bound up to date, and read the service attained
            sched = r.bound_schedule
            g = r.generated
            if sched is not None:
                if type(sched) is not BoundSchedule:
                    return self._progress_through_views()
                if not r.bound_from <= g < r.bound_until:
                    _hold_bound(r, sched, g)
            program = r.program
            if program is None:
                p = r.prompt_tokens
                append((p if g > 0 else min(r.computed, p)) + g)
            else:
                a = program.attained_cache
                append(a if a >= 0 else program.attained_tokens())
        if all(map(WAITING.__ne__, map(_state_of, reqs))):
            since: list[float | None] = [None] * len(reqs)
        else:
            since = [r.waiting_since_s if r.state == WAITING else None for r in reqs]
        return (
            list(map(_generated_of, reqs)),
            list(map(_computed_of, reqs)),
            list(map(_bound_of, reqs)),
            list(map(_deadline_of, reqs)),
            since,
            attained,
        )

    def _progress_through_views(self) -> tuple[list[Any], ...]:
        """:meth:`progress` read from the requests' views (a calibrated schedule: see there)."""
        views = self._built()
        return tuple(list(map(attrgetter(name), views)) for name in PROGRESS)

    def carriers(self) -> Sequence[BoundCarrier]:
        return self._live()
