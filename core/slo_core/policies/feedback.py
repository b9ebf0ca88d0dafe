"""What an engine tells its policy about a request that finished (``EnginePolicy.observe``).

One rule for every engine that runs a slofleet policy: the simulator (core's SimEngine, engine-sim)
and the vLLM plugin build the same :class:`~slo_core.policies.base.FinishedView` from a request's
last snapshot and the times its output tokens were delivered. A compound call is judged on its own,
against its stage sub-deadline (the analyzer's ``deadline_at_s``), as the policy planned it; the gain
is the objective's goodput function (token, request, Tempo, TDG) and the ideal is what the same
request would earn delivered instantly.
"""

from __future__ import annotations

from collections.abc import Sequence

from slo_core.gain import (
    Delivery,
    GainParams,
    goodput_function,
    ideal_gain,
    latency_token_outcome,
    request_goodput,
)
from slo_core.objective import Objective
from slo_core.policies.base import FinishedView, RequestView
from slo_core.slo import RequestKind, SLOTargets


def call_delivery(
    view: RequestView, token_times_s: Sequence[float], *, completed: bool = True, times_in_order: bool = False
) -> Delivery:
    """``view``'s delivery; a compound call's against its stage sub-deadline (``times_in_order``:
    see :class:`~slo_core.gain.Delivery`)."""
    if view.program_id is None or view.deadline_at_s is None:
        slo = view.slo
    else:
        slo = SLOTargets(
            kind=RequestKind.DEADLINE,
            deadline_s=max(1e-6, view.deadline_at_s - view.arrival_s),
            priority_class=view.slo.priority_class,
            priority_weight=view.slo.priority_weight,
        )
    return Delivery(slo, view.arrival_s, view.prompt_tokens, token_times_s, completed, times_in_order)


class Feedback:
    """Builds the FinishedView an engine hands to ``EnginePolicy.observe`` for a finished request."""

    def __init__(self, goodput: str = "token", params: GainParams | None = None) -> None:
        self.fn = goodput_function(goodput)
        self.name = goodput
        self.params = params or GainParams()

    @classmethod
    def for_objective(cls, objective: Objective | None, default_goodput: str = "token") -> Feedback:
        """Feedback in the objective's goodput (its weights); without one, ``default_goodput``."""
        if objective is None:
            return cls(default_goodput)
        return cls(objective.goodput, objective.gain)

    def __call__(
        self,
        view: RequestView,
        token_times_s: Sequence[float],
        *,
        finish_s: float,
        output_tokens: int,
        times_in_order: bool = False,
    ) -> FinishedView:
        """``view``: the request's last snapshot; ``output_tokens``: its whole output (it finished);
        ``times_in_order``: the times never decrease (see :class:`~slo_core.gain.Delivery`)."""
        d = call_delivery(view, token_times_s, times_in_order=times_in_order)
        if self.name == "token" and d.slo.kind is RequestKind.LATENCY:
            gain, ideal, met = latency_token_outcome(d, output_tokens)
        else:
            gain = self.fn(d, self.params)
            ideal = ideal_gain(d, self.name, self.params, output_tokens=output_tokens)
            met = request_goodput(d, self.params)
        return FinishedView(request=view, finish_s=finish_s, gain=gain, ideal_gain=ideal, met_slo=met > 0)
