"""What happened to each request and program, as goodput Deliveries (shared by metrics and feedback)."""

from __future__ import annotations

from slo_core.gain import (
    Delivery,
    GainParams,
    goodput_function,
    ideal_gain,
    latency_token_outcome,
    request_goodput,
)
from slo_core.policies.base import FinishedView
from slo_core.sim.request import FINISHED, ProgramState, SimRequest
from slo_core.sim.views import request_view
from slo_core.slo import RequestKind, SLOTargets


def request_delivery(r: SimRequest) -> Delivery:
    """A single request's delivery (calls of programs: see :func:`call_delivery`)."""
    return Delivery(
        slo=r.slo,
        arrival_s=r.arrival_s,
        input_tokens=r.prompt_tokens,
        token_times_s=r.token_times,
        completed=r.state == FINISHED,
    )


def call_delivery(r: SimRequest) -> Delivery:
    """A compound call judged on its own against its stage sub-deadline (engine feedback only)."""
    if r.program is None or r.deadline_at_s is None:
        return request_delivery(r)
    slo = SLOTargets(
        kind=RequestKind.DEADLINE,
        deadline_s=max(1e-6, r.deadline_at_s - r.arrival_s),
        priority_class=r.slo.priority_class,
        priority_weight=r.slo.priority_weight,
    )
    return Delivery(slo, r.arrival_s, r.prompt_tokens, r.token_times, r.state == FINISHED)


def program_delivery(p: ProgramState) -> Delivery:
    """One Delivery for a whole compound program: all its calls' tokens, summed inputs."""
    times: list[float] = []
    for c in p.calls:
        times.extend(c.token_times)
    times.sort()
    return Delivery(
        slo=p.slo,
        arrival_s=p.arrival_s,
        input_tokens=sum(i for stage in p.stages for i, _ in stage),
        token_times_s=times,
        completed=p.finish_s is not None and not p.failed,
    )


def program_output_tokens(p: ProgramState) -> int:
    return sum(o for stage in p.stages for _, o in stage)


class Feedback:
    """Builds the FinishedView an engine hands to ``EnginePolicy.observe`` for a finished request."""

    def __init__(self, goodput: str = "token", params: GainParams | None = None) -> None:
        self.fn = goodput_function(goodput)
        self.name = goodput
        self.params = params or GainParams()

    def __call__(self, r: SimRequest) -> FinishedView:
        d = call_delivery(r)
        if self.name == "token" and d.slo.kind is RequestKind.LATENCY:
            gain, ideal, met = latency_token_outcome(d, r.target_tokens)
        else:
            gain = self.fn(d, self.params)
            ideal = ideal_gain(d, self.name, self.params, output_tokens=r.target_tokens)
            met = request_goodput(d, self.params)
        return FinishedView(
            request=request_view(r),
            finish_s=r.finish_s if r.finish_s is not None else r.arrival_s,
            gain=gain,
            ideal_gain=ideal,
            met_slo=met > 0,
        )
