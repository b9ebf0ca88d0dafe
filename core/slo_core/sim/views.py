"""Immutable policy snapshots (RequestView) built from the simulator's mutable request state.

A view is rebuilt only when the request changed since the last one (its computed, generated and
preempted counts and its queue state), so waiting requests that merely wait cost nothing per
decision. Calls of compound programs are rebuilt every time: their program's attained service moves
while their siblings run.
"""

from __future__ import annotations

from slo_core.policies.base import RequestView
from slo_core.sim.request import WAITING, SimRequest


def request_view(r: SimRequest) -> RequestView:
    """The snapshot of ``r`` a policy or router sees (cached while ``r`` does not change)."""
    key = (r.computed, r.generated, r.preemptions, r.state)
    program = r.program
    if program is None and r.view_key == key:
        return r.view  # type: ignore[return-value]
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
        program.attained_tokens() if program is not None else r.attained_tokens(),
        r.preemptions,
        r.waiting_since_s if r.state == WAITING else None,
    )
    if program is None:
        r.view = view
        r.view_key = key
    return view


def request_views(requests: list[SimRequest]) -> list[RequestView]:
    return [request_view(r) for r in requests]
