"""Immutable policy snapshots (RequestView) built from the simulator's mutable request state.

A view is rebuilt only when the request changed since the last one (its computed, generated and
preempted counts, its queue state and, for a call of a compound program, the program's attained
service), so requests that merely wait cost one key comparison per decision. A program's attained
service is memoized on the program and recomputed only after one of its calls made progress.
"""

from __future__ import annotations

from slo_core.policies.base import RequestView
from slo_core.predict.estimator import BoundSchedule
from slo_core.sim.request import WAITING, SimRequest


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
    old = r.view_key
    if old == key:
        return r.view  # type: ignore[return-value]
    sched = r.bound_schedule
    # the analyzer re-estimates the bound as tokens stream (§4.1); a plain schedule is a pure function
    # of the tokens generated, so only a new count needs a new bound (a calibrated one learns: always)
    if sched is not None and (old is None or old[1] != r.generated or type(sched) is not BoundSchedule):
        r.output_bound = sched.at(r.generated)
    view = RequestView(
        r.request_id,
        r.slo,
        r.arrival_s,
        r.prompt_tokens,
        r.max_tokens,
        r.generated,
        r.computed,
        r.deadline_at_s,
        r.token_times[0] if r.token_times else None,
        r.output_bound,
        r.target_tokens,
        r.tenant,
        program.program_id if program is not None else None,
        r.stage,
        program.arrival_s if program is not None else None,
        program.deadline_at_s if program is not None else None,
        attained if program is not None else r.attained_tokens(),
        r.preemptions,
        r.waiting_since_s if r.state == WAITING else None,
    )
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
        if p is None:
            if r.view_key == (r.computed, r.generated, r.preemptions, r.state, -1):
                append(r.view)  # type: ignore[arg-type]
            else:
                append(request_view(r))
            continue
        a = p.attained_tokens()
        if r.view_key == (r.computed, r.generated, r.preemptions, r.state, a):
            append(r.view)  # type: ignore[arg-type]
        else:
            append(request_view(r, a))
    return out
