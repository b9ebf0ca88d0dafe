"""Immutable policy snapshots (RequestView) built from the simulator's mutable request state.

A view is rebuilt only when the request changed since the last one (its computed, generated and
preempted counts, its queue state and, for a call of a compound program, the program's attained
service), so requests that merely wait cost one key comparison per decision. A program's attained
service is memoized on the program and recomputed only after one of its calls made progress.
"""

from __future__ import annotations

from dataclasses import fields

from slo_core.perf.model import PerfProfile
from slo_core.policies.base import EngineView, RequestView
from slo_core.predict.estimator import BoundSchedule
from slo_core.sim.request import WAITING, SimRequest

# RequestView is a frozen dataclass: its generated __init__ sets each of its 19 fields through
# object.__setattr__, ~7 us a view, and the simulator builds one for every request that moved at
# every decision. The slots' own descriptors set them ~2x faster; the field order is checked here so
# that a field added to RequestView fails at import instead of shifting values.
_FIELDS = (
    "request_id",
    "slo",
    "arrival_s",
    "prompt_tokens",
    "max_tokens",
    "generated_tokens",
    "computed_tokens",
    "deadline_at_s",
    "first_token_s",
    "output_bound",
    "true_output_tokens",
    "tenant",
    "program_id",
    "stage",
    "program_arrival_s",
    "program_deadline_at_s",
    "program_attained_tokens",
    "preemptions",
    "waiting_since_s",
)
if tuple(f.name for f in fields(RequestView)) != _FIELDS:  # pragma: no cover - a changed RequestView
    raise ImportError("slo_core.sim.views: RequestView's fields changed; update _FIELDS and _new_view")
(
    _s_id,
    _s_slo,
    _s_arrival,
    _s_prompt,
    _s_max,
    _s_generated,
    _s_computed,
    _s_deadline,
    _s_first,
    _s_bound,
    _s_true,
    _s_tenant,
    _s_program,
    _s_stage,
    _s_program_arrival,
    _s_program_deadline,
    _s_attained,
    _s_preemptions,
    _s_waiting,
) = (getattr(RequestView, name).__set__ for name in _FIELDS)
_object_new = object.__new__


def _new_view(r: SimRequest, program_attained: int) -> RequestView:
    """``RequestView(...)`` of ``r``'s current state, its fields set through the slots' descriptors."""
    program = r.program
    view: RequestView = _object_new(RequestView)
    _s_id(view, r.request_id)
    _s_slo(view, r.slo)
    _s_arrival(view, r.arrival_s)
    _s_prompt(view, r.prompt_tokens)
    _s_max(view, r.max_tokens)
    _s_generated(view, r.generated)
    _s_computed(view, r.computed)
    _s_deadline(view, r.deadline_at_s)
    _s_first(view, r.token_times[0] if r.token_times else None)
    _s_bound(view, r.output_bound)
    _s_true(view, r.target_tokens)
    _s_tenant(view, r.tenant)
    if program is not None:
        _s_program(view, program.program_id)
        _s_program_arrival(view, program.arrival_s)
        _s_program_deadline(view, program.deadline_at_s)
        _s_attained(view, program_attained)
    else:
        _s_program(view, None)
        _s_program_arrival(view, None)
        _s_program_deadline(view, None)
        _s_attained(view, r.attained_tokens())
    _s_stage(view, r.stage)
    _s_preemptions(view, r.preemptions)
    _s_waiting(view, r.waiting_since_s if r.state == WAITING else None)
    return view


_ENGINE_FIELDS = (
    "now_s",
    "step",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_blocks_total",
    "kv_blocks_free",
    "block_size",
    "profile",
    "engine_id",
)
if tuple(f.name for f in fields(EngineView)) != _ENGINE_FIELDS:  # pragma: no cover - a changed EngineView
    raise ImportError(
        "slo_core.sim.views: EngineView's fields changed; update _ENGINE_FIELDS and new_engine_view"
    )
_e_now, _e_step, _e_seqs, _e_batched, _e_total, _e_free, _e_block, _e_profile, _e_id = (
    getattr(EngineView, name).__set__ for name in _ENGINE_FIELDS
)


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
    """``EngineView(...)``, its slots set through their descriptors (as :func:`_new_view`; one a decision)."""
    view: EngineView = _object_new(EngineView)
    _e_now(view, now_s)
    _e_step(view, step)
    _e_seqs(view, max_num_seqs)
    _e_batched(view, max_num_batched_tokens)
    _e_total(view, kv_blocks_total)
    _e_free(view, kv_blocks_free)
    _e_block(view, block_size)
    _e_profile(view, profile)
    _e_id(view, engine_id)
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
    key = (r.computed, r.generated, r.preemptions, r.state, attained)
    if r.view_key == key:
        return r.view  # type: ignore[return-value]
    return _refresh(r, key, attained)


def _refresh(r: SimRequest, key: tuple[int, int, int, int, int], attained: int) -> RequestView:
    """A new view of ``r`` (its state changed since the last one, which had ``r.view_key``)."""
    old = r.view_key
    sched = r.bound_schedule
    # the analyzer re-estimates the bound as tokens stream (§4.1); a plain schedule is a pure function
    # of the tokens generated, so only a new count needs a new bound (a calibrated one learns: always)
    if sched is not None and (old is None or old[1] != r.generated or type(sched) is not BoundSchedule):
        r.output_bound = sched.at(r.generated)
    view = _new_view(r, attained)
    r.view = view
    r.view_key = key
    return view


def request_views(requests: list[SimRequest]) -> list[RequestView]:
    """Views of ``requests`` in order: a request that did not change since its last view costs one
    key comparison (a program's attained service is memoized on the program, see ProgramState)."""
    out: list[RequestView] = []
    append = out.append
    for r in requests:
        p = r.program
        a = -1 if p is None else p.attained_tokens()
        key = (r.computed, r.generated, r.preemptions, r.state, a)
        if r.view_key == key:
            append(r.view)  # type: ignore[arg-type]
        else:
            append(_refresh(r, key, a))
    return out
