"""``slofleet demo``: replay a real trace through a local slofleet fleet and through a stock one.

Both fleets run the same processes on the same simulated GPUs; only the policies differ (slofleet:
the engine policy and routing of the demo SLOPolicy, GMAX and GoRouting by default; stock: FCFS
engines behind round-robin routing, what a plain vLLM fleet does). The identical workload (Azure
conv arrivals, 1:1:1 chat streams / deadline calls / deep-research programs, two priority classes)
is replayed through each router with the ``openai`` client; per-tier goodput and attainment update
live; the end is a side-by-side table and a report (markdown, JSON, PNG plots).

Time can run slower than on the profiled GPU (``--speedup`` below 1, 0.5 by default) so that two CPU
cores can carry every streamed token: arrival rate, SLO targets and durations are all scaled by the
same factor, so the scheduling problem is the same one the GPU would face.

The same jobs, seed and policies also go through core's FleetSim (the code the services run;
:mod:`slo_lab.localfleet.simulate`), and the end shows per-tier attainment and token goodput live vs
simulated side by side, with the verdict. Each live run measures whether the host kept up with the
simulated GPU (:mod:`slo_lab.localfleet.hostload`) and says so when it did not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from slo_core.crd.loads import parse_policy
from slo_core.metrics.summary import JobOutcome, goodput_over_time, group_metrics, latency_samples
from slo_core.workloads import DeepResearchParams, WorkloadSpec, build_workload, parse_mix
from slo_core.workloads.jobs import Job, bound_to_tier
from slo_lab.localfleet.hostload import MAX_SEND_LAG_SHARE, HostLoad, engine_behind_s, measure
from slo_lab.localfleet.launcher import FleetError, LocalFleet
from slo_lab.localfleet.replay import (
    CallTrace,
    JobRecord,
    as_sent,
    describe,
    failure_reasons,
    outcomes,
    replay,
)
from slo_lab.localfleet.report import (
    comparison,
    demotion_timing,
    describe_differences,
    job_differences,
    write_report,
)
from slo_lab.localfleet.simulate import simulate
from slo_lab.localfleet.spec import DEFAULT_PROFILE, EngineGroup, FleetSpec


def register(parser: argparse.ArgumentParser) -> None:
    """Replay a real trace through a local slofleet fleet and a stock FCFS/round-robin one; compare."""
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of trace arrivals (GPU time)")
    parser.add_argument("--rps", type=float, default=12.0, help="arrival rate, requests/s (GPU time)")
    parser.add_argument("--engines", type=int, default=1, help="simulated engines per fleet")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="GPU/model performance profile")
    parser.add_argument(
        "--speedup",
        type=float,
        default=0.5,
        help="time runs this fast vs the GPU (< 1: slower; rates, SLOs and durations scaled alike). "
        "Default 0.5: on 2 cores engine-sim fell ~50%% behind a full-speed GPU (the demo measures it)",
    )
    parser.add_argument("--trace", default="azure-conv-2023", help="built-in trace name or trace file path")
    parser.add_argument("--mix", default="1:1:1", help="latency:deadline:compound ratio")
    parser.add_argument("--policy", default="gmax", help="slofleet fleet's engine policy")
    parser.add_argument("--routing", default="go-routing", help="slofleet fleet's routing policy")
    parser.add_argument("--baseline-policy", default="fcfs", help="stock fleet's engine policy")
    parser.add_argument("--baseline-routing", default="round-robin", help="stock fleet's routing policy")
    parser.add_argument("--max-tokens", type=int, default=1024, help="cap on each request's output length")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=3000, help="cap on each request's prompt (fit the context)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--out", default="slofleet-demo", help="report folder")
    parser.set_defaults(func=run)


SETTINGS = {"ttft_s": 2.0, "tbt_s": 0.1, "deadline_s": 20.0, "stage_deadline_s": 20.0}
# What the demo's router does with a request GoRouting finds no replica to serve in time. ``reject``
# (the SLOPolicy default) answers 503; on this workload that refused 58 calls in simulation, 37 of them
# stages of deep-research programs, each failing its whole program, and the slofleet fleet delivered
# 0.89x the stock fleet's token goodput. Demoted to the best-effort tier instead, they still run when
# the engine has room (GMAX puts them last), and every tier met its SLO at least as often as stock.
DEMO_ON_OVERLOAD = "best-effort"


def demo_policy(scale: float, engine_policy: str, routing_policy: str) -> str:
    """The demo's SLOPolicy: JITServe §6.1 SLOs (scaled) in tiers named like the workload's jobs."""
    tiers: list[dict[str, Any]] = []
    for cls in ("high", "low"):
        tiers += [
            {"name": f"latency-{cls}", "kind": "latency", "ttftS": SETTINGS["ttft_s"] * scale,
             "tbtS": SETTINGS["tbt_s"] * scale, "priorityClass": cls},
            {"name": f"deadline-{cls}", "kind": "deadline", "deadlineS": SETTINGS["deadline_s"] * scale,
             "priorityClass": cls},
            # a program states its own deadline (its stages x the stage deadline); the tier's is the
            # shortest program's, so the router keeps every stated one (a stricter one it would raise)
            {"name": f"compound-{cls}", "kind": "compound",
             "deadlineS": SETTINGS["stage_deadline_s"] * min(DeepResearchParams().stage_counts) * scale,
             "priorityClass": cls},
        ]  # fmt: skip
    tiers.append({"name": "best-effort", "kind": "best-effort", "priorityClass": "low"})
    doc = {
        "apiVersion": "slofleet.io/v1alpha1",
        "kind": "SLOPolicy",
        "metadata": {"name": "demo"},
        "spec": {
            "priorityClasses": [{"name": "high", "weight": 2}, {"name": "low", "weight": 1}],
            "tiers": tiers,
            "defaultTier": "latency-low",
            # a request no replica can serve in time is served best-effort, not refused: a refused
            # deep-research call loses its whole program, prompt tokens and all
            "admission": {"onOverload": DEMO_ON_OVERLOAD},
            "goodput": {"name": "token"},
            "scheduling": {"name": engine_policy},
            "routing": {"name": routing_policy},
        },
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    parse_policy(text, "demo policy")  # the same validation a user's file gets
    return text


class Progress:
    """Per-tier attainment and goodput so far, one line every couple of seconds."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done: list[JobRecord] = []
        self.start_s = 0.0
        self.last_print = 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, record: JobRecord, start_s: float) -> None:
        self.done.append(record)
        self.start_s = start_s
        now = time.monotonic()
        if now - self.last_print >= 2.0 or len(self.done) == self.total:
            self.last_print = now
            self.show(now)

    def show(self, now: float) -> None:
        by_tier: dict[str, list[int]] = {}
        for o in outcomes(self.done, self.start_s):
            met, n = by_tier.setdefault(o.tier, [0, 0])
            by_tier[o.tier] = [met + (o.gains["request"] > 0), n + 1]
        parts = " ".join(f"{t}:{m}/{n}" for t, (m, n) in sorted(by_tier.items()))
        line = (
            f"[{self.label}] {now - self.start_s:6.1f}s {len(self.done)}/{self.total} done | met SLO {parts}"
        )
        end = "\r" if self.tty and len(self.done) < self.total else "\n"
        print(line[:200].ljust(120 if self.tty else 0), end=end, file=sys.stderr, flush=True)


def run_fleet(label: str, spec: FleetSpec, jobs: list[Job], grace_s: float) -> dict[str, Any]:
    with LocalFleet(spec) as fleet:
        progress = Progress(label, len(jobs))
        model = fleet.served_model()
        records, start = asyncio.run(
            replay(fleet.router_url, jobs, model=model, grace_s=grace_s, on_done=progress)
        )
        span_s = time.monotonic() - start
        behind = [engine_behind_s(url) for url in engine_urls(fleet)]
        demoted = router_demotions(fleet.router_url)
    fleet.cleanup()
    return {
        "records": records,
        "start": start,
        "outcomes": outcomes(records, start),
        "counts": describe(records),
        "failures": failure_reasons(records),
        "span_s": span_s,
        "behind_s": behind,
        "send_lags_s": [r.send_lag_s for r in records],
        "demoted_by_tier": demoted,
        "traces": [r.traces(start) for r in records],
    }


def router_demotions(router_url: str) -> dict[str, int]:
    """How many requests or calls of each tier the live router demoted to best effort (its
    ``slofleet_router_downgraded`` counter); empty when the router cannot be read."""
    import httpx

    try:
        return demotions_from_metrics(httpx.get(f"{router_url}/metrics", timeout=5.0).text)
    except (httpx.HTTPError, ValueError):
        return {}


def demotions_from_metrics(text: str) -> dict[str, int]:
    """Demotions by the tier each request asked for, from the router's Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "slofleet_router_downgraded":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                tier = sample.labels.get("tier", "")
                out[tier] = out.get(tier, 0) + int(sample.value)
    return out


def engine_urls(fleet: LocalFleet) -> list[str]:
    """The engines' own URLs (where engine-sim reports how far it fell behind)."""
    return [p.engine_url for p in fleet.pods]


def simulated(
    jobs: list[Job],
    policy_text: str,
    args: argparse.Namespace,
    demoted_by_tier: dict[str, int] | None = None,
    traces: list[list[CallTrace]] | None = None,
) -> list[JobOutcome]:
    """The same jobs, seed and policy through core's FleetSim (the code the services run), each job as
    the replay sends it (:func:`~slo_lab.localfleet.replay.as_sent`); ``traces`` gets each job's calls
    as sent, in the jobs' order."""
    sent = [as_sent(j) for j in jobs]
    calls: dict[str, list[CallTrace]] = {}
    outs = simulate(
        sent, policy_text, profile=args.profile, speedup=args.speedup, engines=args.engines, seed=args.seed,
        demoted_by_tier=demoted_by_tier, calls=calls,
    )  # fmt: skip
    if traces is not None:
        traces[:] = [calls.get(j.job_id, []) for j in jobs]
    return outs


def summary(outs: list[JobOutcome], span_s: float, bucket_s: float) -> dict[str, Any]:
    m = group_metrics(outs, span_s)
    groups: dict[str, list[JobOutcome]] = {}
    for o in outs:
        groups.setdefault(o.tier, []).append(o)
    m["by_tier"] = {t: group_metrics(g, span_s) for t, g in sorted(groups.items())}
    end = max((o.delivery.finish_s or 0.0) for o in outs) if outs else span_s
    m["goodput_over_time"] = {
        "bucket_s": bucket_s,
        "token": goodput_over_time(outs, bucket_s, max(end, span_s)),
    }
    m["latency_samples"] = latency_samples(outs)
    return m


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the running fleet is stopped instead of orphaned."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace) -> int:
    _stop_on_sigterm()
    try:
        mix = parse_mix(args.mix)
        if not 0 < args.speedup <= 100:
            raise ValueError("--speedup must be in (0, 100]")
        scale = 1.0 / args.speedup
        workload = WorkloadSpec(
            trace=args.trace, rps=args.rps * args.speedup, duration_s=args.duration * scale, mix=mix,
            slo_scale=scale, max_tokens=args.max_tokens, seed=args.seed,
        )  # fmt: skip
        jobs = [j for j in build_workload(workload) if j.total_output_tokens > 0]
        # each job states what its tier gives it, as the router binds it (and as the simulator does):
        # the client then measures the SLO the fleet was asked for, not a stricter one it refused
        policy = parse_policy(demo_policy(scale, args.policy, args.routing), "demo policy")
        tiers = policy.spec.runtime().tiers
        jobs = [bound_to_tier(_capped(j, args.max_tokens, args.max_prompt_tokens), tiers) for j in jobs]
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        runs: dict[str, dict[str, Any]] = {}
        sims: dict[str, dict[str, Any]] = {}
        hosts: dict[str, HostLoad] = {}
        sim_by_job: dict[str, list[JobOutcome]] = {}
        sim_traces: dict[str, list[list[CallTrace]]] = {}
        bucket_s = max(1.0, workload.duration_s / 30)
        fleets = (
            ("slofleet", args.policy, args.routing),
            ("stock", args.baseline_policy, args.baseline_routing),
        )
        for label, engine_policy, routing in fleets:  # first, so it never competes with a live run
            print(f"== {label}: simulating {len(jobs)} jobs (core FleetSim)", file=sys.stderr)
            sim_demoted: dict[str, int] = {}
            sim_traces[label] = []
            sim_outs = simulated(
                jobs, demo_policy(scale, engine_policy, routing), args, sim_demoted, sim_traces[label]
            )
            sim_by_job[label] = sim_outs
            sims[label] = {"engine_policy": engine_policy, "routing": routing, "demoted_by_tier": sim_demoted,
                           **summary(sim_outs, workload.duration_s, bucket_s=bucket_s)}  # fmt: skip
        for label, engine_policy, routing in fleets:
            policy_path = out / f"policy-{label}.yaml"
            policy_path.write_text(demo_policy(scale, engine_policy, routing), encoding="utf-8")
            group = EngineGroup(count=args.engines, profile=args.profile, speedup=args.speedup)
            spec = FleetSpec(engines=[group], port=0, policy_file=policy_path, workdir=out / f"fleet-{label}")
            print(
                f"== {label}: engine policy {engine_policy}, routing {routing}, {len(jobs)} jobs",
                file=sys.stderr,
            )
            result = run_fleet(label, spec, jobs, grace_s=10.0 * scale)
            late_s = MAX_SEND_LAG_SHARE * SETTINGS["ttft_s"] * scale  # sent this late: the host's doing
            host = measure(
                result["span_s"], result["behind_s"], result["send_lags_s"], SETTINGS["ttft_s"] * scale
            )
            hosts[label] = host
            print(f"   host: {host.describe()}", file=sys.stderr)
            runs[label] = {
                "engine_policy": engine_policy,
                "routing": routing,
                "counts": result["counts"],
                "failures": result["failures"],
                "demoted_by_tier": result["demoted_by_tier"],
                "host": {**asdict(host), "kept_up": host.kept_up},
                **summary(result["outcomes"], workload.duration_s, bucket_s=bucket_s),
                "versus_sim_jobs": job_differences(
                    [j.job_id for j in jobs],
                    result["outcomes"],
                    sim_by_job[label],
                    [j.tier for j in jobs],
                    late=[lag > late_s for lag in result["send_lags_s"]],
                    traces=(result["traces"], sim_traces[label]),
                ),
                "demotion_timing": demotion_timing(result["traces"], sim_traces[label]),
            }
    except (ValueError, FleetError) as exc:
        print(f"slofleet demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nslofleet demo: interrupted; the fleets are stopped", file=sys.stderr)
        return 130
    versus, verdict = comparison(runs, sims)
    meta = {"workload": workload.model_dump(mode="json"), "speedup": args.speedup, "engines": args.engines,
            "profile": args.profile, "jobs": len(jobs), "versus_simulator": verdict,
            "simulated": {k: {m: v for m, v in r.items() if m != "latency_samples"} for k, r in sims.items()},
            "load_average": os.getloadavg()}  # fmt: skip
    table = write_report(out, runs, meta, versus=versus)
    print(table)
    print("\nLive vs simulated (core FleetSim: same jobs, seed, policies, GPU profile and speed):\n")
    print(versus)
    per_job = [describe_differences(lab, runs[lab]["versus_sim_jobs"]) for lab in runs]
    if any(per_job):
        print("\nJobs whose live and simulated outcomes differ (results.json has every id):")
        print("\n".join(line for line in per_job if line))
    starved = [lab for lab, h in hosts.items() if not h.kept_up]
    if starved:
        print(
            f"\nWARNING: the host did not keep up with the simulated GPU in {', '.join(starved)} "
            f"({'; '.join(hosts[lab].describe() for lab in starved)}); load average "
            f"{os.getloadavg()[0]:.1f}. The live numbers show a CPU-starved machine, not the policies: "
            f"rerun with a slower --speedup (e.g. {args.speedup / 2:g}) on a quieter host."
        )
    print(f"\nreport: {out / 'report.md'} (plots and results.json beside it)")
    return 0


def _capped(job: Job, max_tokens: int, max_prompt_tokens: int) -> Job:
    """Cap lengths so every request fits the model's context and one very long answer cannot dominate
    a short demo (both fleets replay the same capped jobs)."""
    from dataclasses import replace

    if job.stages is None:
        return replace(
            job,
            prompt_tokens=min(job.prompt_tokens, max_prompt_tokens),
            output_tokens=min(job.output_tokens, max_tokens),
            max_tokens=max_tokens,
        )
    stages = tuple(
        tuple((min(i, max_prompt_tokens), min(o, max_tokens)) for i, o in stage) for stage in job.stages
    )
    return replace(job, stages=stages, max_tokens=max_tokens)
