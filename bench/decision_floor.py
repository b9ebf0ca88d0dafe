"""What deciding at every engine step costs a run before any policy arithmetic: the floor under every
SLO-aware policy at a deep queue.

FCFS as shipped makes no decision (the engine keeps arrival order itself). Two probes run FCFS's very
schedule through the decision path at every step: ``fcfs-every-step`` (the engine builds a view of
every queued request, the policy returns the whole queue in order, the engine applies that order) and
``views-every-step`` (the views, then an empty decision). Their outcomes equal FCFS's (checked: the
record digests without the policy's name); their CPU over FCFS's is what the engine–policy interface
costs at that queue depth, which an SLO-aware policy pays on top of its own work.

    PYTHONPATH=core:lab .venv/bin/python bench/decision_floor.py --family tot --replicas 4 --rps 26 \\
        --duration 300 --out bench/results/sim_speed/decision_floor_tot_r4_overload_300s.md
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gmax_sweep  # bench/ is the script's own folder, first on sys.path
import run_phases

from slo_core.policies import registry
from slo_core.policies.base import Decision, EngineView, RequestView
from slo_core.policies.baselines import FCFS


class FCFSEveryStep(FCFS):
    """FCFS asked at every step: its order of the whole queue is applied by the engine."""

    name = "fcfs-every-step"
    frame_steps = 1
    reschedule_on_events = True
    fifo_fast_path = False


class ViewsEveryStep(FCFSEveryStep):
    """Asked at every step with every queued request's view, it decides nothing: the engine keeps its
    order (FCFS's) and its knobs (FCFS's prefill-first)."""

    name = "views-every-step"

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        return Decision(prefill_first=self.params.prefill_first, reason="views")


PROBES = {"fcfs-every-step": FCFSEveryStep, "views-every-step": ViewsEveryStep}
for _name, _cls in PROBES.items():  # sweep tasks build policies by name, through the registry
    registry.ENGINE_POLICIES.setdefault(_name, f"{__name__}:{_cls.__name__}")


def floor(args: Any) -> list[dict[str, Any]]:
    """FCFS and the two probes on the task ``args`` names (gmax_sweep's task arguments), in turn."""
    rows = [run_phases.phases(gmax_sweep.task_of(args, policy)) for policy in ("fcfs", *PROBES)]
    if len({r["outcome"] for r in rows}) != 1:
        raise SystemExit("a probe's run differs from FCFS's: it is not FCFS's schedule")
    return rows


def table(rows: list[dict[str, Any]], title: str) -> str:
    base = rows[0]["cpu_s"]
    lines = [
        f"# {title}",
        "",
        "| policy | outcome | CPU s | / FCFS | decisions | queued at drain (waiting + running) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['outcome']} | {r['cpu_s']:.1f} | {r['cpu_s'] / base:.2f} "
            f"| {r['decisions']} | {r['waiting_at_drain']} + {r['running_at_drain']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gmax_sweep.add_task_arguments(ap, duration_s=120.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = floor(args)
    text = table(
        rows,
        f"Decision floor: {args.family} x{args.replicas}, {args.rps:g} req/s, {args.duration:g} s, "
        f"seed {args.seed}",
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
