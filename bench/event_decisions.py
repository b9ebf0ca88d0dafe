"""What GMAX's decisions at every arrival and finish buy and cost: the same runs with decisions at frame
boundaries only.

``gmax-every-event`` is GMAX deciding at every frame boundary (``frame_steps`` = 50 engine steps) and at
every engine step where a request arrived or finished (``reschedule_on_events``) whatever the queue's
depth, as GMAX shipped until its deep-queue rule was turned on by default (``deep_queue_from`` 512);
at overload that is nearly every step, each over the whole queue, and it is most of a deep-queue run's
CPU. Every other run is read against it. Two probes decide at
frame boundaries only: ``gmax-frames-50`` (GMAX's own frame) and ``gmax-frames-10``; between frames
the engine keeps the last decision's orders and knobs, and arrivals wait behind the ordered requests
(base.py's protocol). Two probes follow the queue's depth through the engines' own rule
(``deep_queue_from``/``deep_queue_every``, core's ``event_deferred``: no call, no snapshots in between):
``gmax-deep-10`` takes events every 10 steps while 512 or more wait (a latency arrival at once: GMAX
as it ships now, under its old probe name), ``gmax-deep-frames-10`` also preempts at 10-step frames
then. The table gives each run's CPU and its
goodput, so the price of cheaper decisions is read beside the saving, per workload family and objective. A
probe, not a policy: it changes what GMAX decides, so nothing here replaces a committed record.

    PYTHONPATH=core:lab .venv/bin/python bench/event_decisions.py --points tot:26,conv:20.5 \\
        --replicas 4 --duration 120 --objectives request,token \\
        --out bench/results/sim_speed/event_decisions_r4_overload_120s.md
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import gmax_sweep  # bench/ is the script's own folder, first on sys.path
import run_phases

from slo_core.policies import registry
from slo_core.policies.base import Decision, EngineView, RequestView
from slo_core.policies.gmax import GMAX
from slo_core.slo import RequestKind


class GMAXEveryEvent(GMAX):
    """GMAX deciding at every event whatever the queue's depth (its deep-queue rule off): the base every
    probe is read against, and the base of every probe below but the deep-queue ones."""

    name = "gmax-every-event"
    _variant: ClassVar[dict[str, Any]] = {"deep_queue_from": 0}


class GMAXFrames50(GMAXEveryEvent):
    """GMAX deciding at its frame boundaries only (every 50 engine steps)."""

    name = "gmax-frames-50"
    reschedule_on_events = False


class GMAXFrames10(GMAXFrames50):
    """GMAX deciding at frame boundaries only, every 10 engine steps."""

    name = "gmax-frames-10"
    _variant: ClassVar[dict[str, Any]] = {**GMAXEveryEvent._variant, "frame_steps": 10}


class GMAXLatencyEvents(GMAXEveryEvent):
    """GMAX asked at every event, deciding anew only every 10 steps or when a latency
    request arrived since its last decision (its first token is due within a TTFT); at any other
    event it keeps its last orders and token budget (what the engine does between frames)."""

    name = "gmax-latency-events"
    decide_every: ClassVar[int] = 10

    def __init__(self, params: Any = None, **overrides: Any) -> None:
        super().__init__(params, **overrides)
        self._decided: tuple[int, float] | None = None  # (step, now) of the last decision made anew
        self._kept = Decision()

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        last = self._decided
        if (
            last is not None
            and engine.step - last[0] < self.decide_every
            and self._may_keep(waiting)
            and not _latency_since(waiting, last[1])
        ):
            return self._kept
        decision = super().decide(waiting, running, engine, rng)
        self._decided = (engine.step, engine.now_s)
        # no order (the queues stay as the engine holds them), the same budget and admission knobs
        self._kept = Decision(token_budget=decision.token_budget, prefill_first=decision.prefill_first)
        return decision

    def _may_keep(self, waiting: Sequence[RequestView]) -> bool:
        """Whether a decision at an event may keep the last one (always, here)."""
        return True


class GMAXDeepCadence(GMAXLatencyEvents):
    """:class:`GMAXLatencyEvents` only while 512 or more requests wait; below that, every event."""

    name = "gmax-deep-cadence"
    deep_from: ClassVar[int] = 512

    def _may_keep(self, waiting: Sequence[RequestView]) -> bool:
        return len(waiting) >= self.deep_from


def _latency_since(waiting: Sequence[RequestView], since_s: float) -> bool:
    """Whether a latency request arrived after ``since_s``: arrivals wait at the queue's end, in
    arrival order, until a decision orders them."""
    for r in reversed(waiting):
        if r.arrival_s <= since_s:
            return False
        if r.slo.kind is RequestKind.LATENCY:
            return True
    return False


class GMAXDeep10(GMAX):
    """GMAX at every event while fewer than 512 requests wait; from 512 on, the engine takes its events
    only every 10 steps, a latency request's arrival at once (``deep_queue_from``,
    ``deep_queue_every``: no decision, no snapshots in between). GMAX's default since it was turned on,
    named here as the tables made before named it."""

    name = "gmax-deep-10"
    _variant: ClassVar[dict[str, Any]] = {"deep_queue_from": 512, "deep_queue_every": 10}


class GMAXDeepFrames10(GMAXDeep10):
    """:class:`GMAXDeep10` whose preemption frames are 10 steps too while 512 or more wait."""

    name = "gmax-deep-frames-10"

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        p = self.params
        self.frame_steps = p.deep_queue_every if len(waiting) >= p.deep_queue_from else p.frame_steps
        return super().decide(waiting, running, engine, rng)


BASE = "gmax-every-event"
PROBES = {
    "gmax-frames-50": GMAXFrames50,
    "gmax-frames-10": GMAXFrames10,
    "gmax-latency-events": GMAXLatencyEvents,
    "gmax-deep-cadence": GMAXDeepCadence,
    "gmax-deep-10": GMAXDeep10,
    "gmax-deep-frames-10": GMAXDeepFrames10,
}
# sweep tasks build policies by name, through the registry
for _name, _cls in {BASE: GMAXEveryEvent, **PROBES}.items():
    registry.ENGINE_POLICIES.setdefault(_name, f"{__name__}:{_cls.__name__}")


def one(family: str, rps: float, objective: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run (run_phases counts its decisions), keyed by its point."""
    task = gmax_sweep.Task(
        family, args.replicas, args.seed, rps, policy, (objective,), args.duration, args.router
    )
    row = run_phases.phases(task)
    return {
        **row,
        "family": family,
        "rps": rps,
        "objective": objective,
        "goodput": row[f"goodput_{objective}_ratio"],
    }


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """GMAX at every event (:data:`BASE`) and the probes at every point and objective ``args`` names, in
    turn."""
    rows = []
    for point in args.points.split(","):
        family, rps = point.split(":")
        for objective in args.objectives.split(","):
            for policy in (BASE, *(args.probes.split(",") if args.probes else PROBES)):
                rows.append(one(family, float(rps), objective, policy, args))
                print({k: rows[-1][k] for k in ("family", "objective", "policy", "cpu_s", "goodput")})
    return rows


def table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "Goodput: the objective's ratio (goodput over the instant-service gain of the same jobs).",
        "",
        f"Read against `{BASE}` (GMAX deciding at every arrival and finish) at the same point.",
        "",
        "| family | req/s | objective | policy | record | CPU s | / base | decisions | goodput "
        "| − base (points) | attainment | latency-tier attainment |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple[str, float, str], dict[str, Any]] = {
        (r["family"], r["rps"], r["objective"]): r for r in rows if r["policy"] == BASE
    }
    for r in rows:
        b = base[(r["family"], r["rps"], r["objective"])]
        lat = r["latency_attainment"]
        lines.append(
            f"| {r['family']} | {r['rps']:g} | {r['objective']} | {r['policy']} | {r['record']} "
            f"| {r['cpu_s']:.1f} | {r['cpu_s'] / b['cpu_s']:.2f} | {r['decisions']} | {r['goodput']:.4f} "
            f"| {100 * (r['goodput'] - b['goodput']):+.2f} | {r['attainment']:.4f} "
            f"| {'' if lat is None else f'{lat:.4f}'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="tot:26,conv:20.5", help="family:total req/s, comma-separated")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objectives", default="request,token")
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--probes", default="", help="comma-separated probes (default: all)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = compare(args)
    text = table(
        rows,
        f"GMAX deciding at events or at frames only: x{args.replicas}, {args.duration:g} s, seed {args.seed}",
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
