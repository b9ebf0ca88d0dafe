"""What two simulator runs must agree on when a shortcut claims to change no outcome: every request's
state, replica, finish time, preemptions, tokens and token times."""

from __future__ import annotations

from slo_core.sim.fleet import SimResult


def outcomes(result: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.state, r.replica, r.finish_s, r.preemptions, r.generated, tuple(r.token_times))
        for r in sorted(result.requests, key=lambda r: r.request_id)
    ]
