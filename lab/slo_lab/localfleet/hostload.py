"""Did the host keep up with the simulated GPU? What a live demo run measures about its own machine.

Two signs, both measured during the run: engine-sim's steps falling behind their modelled schedule
(``slofleet_engine_sim_behind_seconds``: GPU time the host could not run in real time, lost for
good) and the replay client sending jobs late against their trace arrival. Either one large means
the live numbers show a CPU-starved machine, not the policies: the demo says so and suggests a
slower ``--speedup``. Reads engines by URL only, so it does not depend on how a fleet is wired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np

BEHIND_METRIC = "slofleet_engine_sim_behind_seconds"
# the host kept up when the engines lost at most this share of the run and the client sent on time.
# The demo's default load sits at the fleet's capacity: in simulation an engine 2% slower than its
# profile moves slofleet's tiers by up to 7 points and one 5% slower by up to 12 (stock's alike), so a
# run whose engines lost more than 2% cannot be held to the 10-point comparison.
MAX_BEHIND_SHARE = 0.02
MAX_SEND_LAG_SHARE = 0.1  # of the tightest SLO target (the chat TTFT)


def engine_behind_s(url: str) -> float | None:
    """Seconds engine-sim at ``url`` has fallen behind its schedule (None: not engine-sim or unreachable)."""
    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(BEHIND_METRIC):
            try:
                return float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
    return None


@dataclass(frozen=True)
class HostLoad:
    """One live run's measurements of the host, and the verdict."""

    span_s: float  # wall seconds the run took
    behind_s: list[float | None]  # per engine
    send_lag_p50_s: float
    send_lag_p99_s: float
    tightest_slo_s: float

    @property
    def behind_share(self) -> float:
        known = [b for b in self.behind_s if b is not None]
        return max(known) / self.span_s if known and self.span_s > 0 else 0.0

    @property
    def kept_up(self) -> bool:
        return (
            self.behind_share <= MAX_BEHIND_SHARE
            and self.send_lag_p99_s <= MAX_SEND_LAG_SHARE * self.tightest_slo_s
        )

    def describe(self) -> str:
        known = [b for b in self.behind_s if b is not None]
        behind = (
            f"engine-sim fell {max(known):.1f} s behind its modelled GPU over {self.span_s:.0f} s "
            f"({self.behind_share:.1%})"
            if known
            else "engine lag not measurable (not engine-sim)"
        )
        return (
            f"{behind}; client send lag p50 {self.send_lag_p50_s * 1e3:.0f} ms, p99 "
            f"{self.send_lag_p99_s * 1e3:.0f} ms (tightest SLO {self.tightest_slo_s:g} s)"
        )


def measure(
    span_s: float, behind_s: Sequence[float | None], send_lags_s: Sequence[float], tightest_slo_s: float
) -> HostLoad:
    lags = np.asarray(send_lags_s, dtype=float) if send_lags_s else np.zeros(1)
    return HostLoad(
        span_s=span_s,
        behind_s=list(behind_s),
        send_lag_p50_s=float(np.percentile(lags, 50)),
        send_lag_p99_s=float(np.percentile(lags, 99)),
        tightest_slo_s=tightest_slo_s,
    )
