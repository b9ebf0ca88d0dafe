"""What happened to each request and program, as goodput Deliveries (shared by metrics and feedback)."""

from __future__ import annotations

from slo_core.gain import Delivery
from slo_core.policies.base import FinishedView
from slo_core.policies.feedback import Feedback
from slo_core.sim.request import FINISHED, ProgramState, SimRequest
from slo_core.sim.views import request_view


def request_delivery(r: SimRequest) -> Delivery:
    """A single request's delivery (a program's call as its engine's policy judged it:
    :func:`slo_core.policies.feedback.call_delivery`)."""
    return Delivery(
        slo=r.slo,
        arrival_s=r.arrival_s,
        input_tokens=r.prompt_tokens,
        token_times_s=r.token_times,
        completed=r.state == FINISHED,
        times_in_order=True,  # the engine appends each token at its step's end: its clock never goes back
    )


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
        times_in_order=True,  # sorted above
    )


def program_output_tokens(p: ProgramState) -> int:
    return sum(o for stage in p.stages for _, o in stage)


def finished_view(feedback: Feedback, r: SimRequest) -> FinishedView:
    """What ``feedback`` tells the policy of ``r``, which finished (core's rule, as the vLLM plugin)."""
    return feedback(
        request_view(r),
        r.token_times,
        finish_s=r.finish_s if r.finish_s is not None else r.arrival_s,
        output_tokens=r.target_tokens,
        times_in_order=True,
    )
