"""Benchmark scheduling and routing policies on a simulated fleet: ``slofleet bench``.

Runs every policy × router × load on the identical seeded workload, prints a markdown table to
stdout, and on request writes JSON records (``--json``) and PNG plots (``--plots``). A progress bar
goes to stderr. Bad option values end with a message and exit status 2; a run that fails is
recorded with its error and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slo_core.bench.runner import BenchConfig, fingerprint, markdown_table, record_key, run_bench, run_keys
from slo_core.objective import Objective
from slo_core.perf import list_profiles, load_profile
from slo_core.perf.model import PerfProfile
from slo_core.policies.registry import ENGINE_POLICIES, ROUTER_POLICIES, engine_policy_names
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import SimConfig
from slo_core.workloads import WorkloadSpec, parse_mix
from slo_core.workloads.dags import DAG_SOURCES
from slo_core.workloads.traces import BUILTIN_TRACES

DEFAULT_PROFILE = "h100-llama3-8b-tp1"


class UsageError(ValueError):
    """A bad option value: reported as ``slofleet bench: error: ...`` with exit status 2."""


def register(parser: argparse.ArgumentParser) -> None:
    """Benchmark policies and routers on a simulated fleet (goodput, attainment, latency)."""
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--trace",
        default="azure-conv-2023",
        help=f"built-in trace ({', '.join(BUILTIN_TRACES)}) or a CSV/JSONL trace path",
    )
    w.add_argument(
        "--arrival",
        choices=("trace", "poisson"),
        default="trace",
        help="replay the trace's arrival times (scaled to --rps) or Poisson arrivals",
    )
    w.add_argument(
        "--dags",
        default="deep-research",
        help=f"compound DAG source: {', '.join(DAG_SOURCES)} or a JSONL path",
    )
    w.add_argument("--mix", default="1:1:1", help="latency:deadline:compound ratio (default 1:1:1)")
    w.add_argument(
        "--rps", default=None, help="comma list of arrival rates, requests/s (default: the trace's own rate)"
    )
    w.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals (default 600)")
    w.add_argument("--seed", type=int, default=0, help="workload and policy seed (default 0)")
    w.add_argument("--slo-scale", type=float, default=1.0, help="factor on every SLO target (default 1)")
    w.add_argument("--high-share", type=float, default=0.5, help="share of high-priority requests (0.5)")
    w.add_argument("--best-effort-share", type=float, default=0.0, help="share without SLO (default 0)")
    f = parser.add_argument_group("fleet")
    f.add_argument("--replicas", type=int, default=4, help="number of replicas (default 4)")
    f.add_argument(
        "--profile",
        default=None,
        help="performance profile name or JSON path, or a comma list cycled over the replicas "
        f"(default {DEFAULT_PROFILE}; known: {', '.join(list_profiles())})",
    )
    f.add_argument("--gpu", default=None, help="with --model: the profile <gpu>-<model>-tp<tp>")
    f.add_argument("--model", default=None, help="with --gpu: e.g. llama3-8b, llama2-70b")
    f.add_argument("--tp", type=int, default=1, help="tensor parallelism with --gpu/--model (default 1)")
    f.add_argument("--max-num-seqs", type=int, default=256, help="vLLM max_num_seqs (default 256)")
    f.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="vLLM max_num_batched_tokens (default 8192)"
    )
    p = parser.add_argument_group("policies")
    p.add_argument(
        "--policies",
        default="fcfs,sarathi",
        help="comma list of engine policies, or 'all' for every registered one",
    )
    p.add_argument("--router", default="round-robin", help="router policy, or a comma list of them")
    p.add_argument(
        "--drain",
        choices=("slo", "all"),
        default="slo",
        help="stop once no SLO gain is possible (slo) or when all requests are done (all)",
    )
    p.add_argument(
        "--analyzer",
        choices=("qrf", "qrf-calibrated", "none"),
        default="qrf",
        help="request analyzer: QRF length bounds and pattern-graph sub-deadlines (qrf), the same with "
        "online-calibrated bounds (qrf-calibrated, as a sidecar with --calibration-apply) or none",
    )
    p.add_argument(
        "--objective",
        default=None,
        choices=("token", "request", "tempo", "tdg"),
        help="goodput function SLO-aware policies maximize and the table's headline column "
        "(default: --slo-policy's spec.goodput, else token); every function is recorded",
    )
    p.add_argument(
        "--fairness",
        type=float,
        default=None,
        help="per-tenant fairness weight f in 0..1 (default: --slo-policy's spec.fairness, else 0)",
    )
    p.add_argument(
        "--slo-policy",
        default=None,
        help="SLOPolicy YAML file whose spec.goodput and spec.fairness set the objective",
    )
    o = parser.add_argument_group("output")
    o.add_argument(
        "--goodput",
        default=None,
        choices=("token", "request", "tempo", "tdg"),
        help="deprecated alias of --objective",
    )
    o.add_argument("--json", dest="json_path", default=None, help="write the records to this JSON file")
    o.add_argument("--plots", default=None, help="write PNG plots into this folder")
    o.add_argument("--bucket", type=float, default=60.0, help="goodput-over-time bucket, seconds (60)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    o.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes running simulations at once (default: every core, "
        f"{os.cpu_count() or 1} here); results are those of a serial run",
    )
    o.add_argument(
        "--resume",
        action="store_true",
        help="with --json: keep the runs already recorded there (without error) and run only the rest; "
        "the file is rewritten after every run, so an interrupted sweep resumes",
    )
    parser.set_defaults(func=run)


def _names(text: str, known: dict[str, str], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UsageError(f"--{what}: give at least one name")
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(
            f"--{what}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(sorted(known))}"
        )
    return names


def _rates(text: str | None) -> tuple[float | None, ...]:
    if text is None:
        return (None,)
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--rps {text!r}: expected a comma list of positive numbers, e.g. 2,4,8") from None
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise UsageError(f"--rps {text!r}: expected a comma list of positive numbers, e.g. 2,4,8")
    return rates


def _profiles(args: argparse.Namespace) -> tuple[PerfProfile, ...]:
    if (args.gpu is None) != (args.model is None):
        raise UsageError("--gpu and --model go together (the profile <gpu>-<model>-tp<tp>)")
    if args.gpu is not None:
        names = [f"{args.gpu}-{args.model}-tp{args.tp}"]
    else:
        names = [n.strip() for n in (args.profile or DEFAULT_PROFILE).split(",") if n.strip()]
    try:
        return tuple(load_profile(n) for n in names)
    except (ValueError, OSError) as exc:
        raise UsageError(f"profile: {exc}") from None


def objective_from_args(args: argparse.Namespace) -> Objective:
    """--slo-policy's spec.goodput/spec.fairness, overridden by --objective (or --goodput) and --fairness."""
    base = Objective()
    if args.slo_policy is not None:
        import yaml

        from slo_core.crd.policy import SLOPolicy

        try:
            doc = yaml.safe_load(Path(args.slo_policy).read_text(encoding="utf-8"))
            base = Objective.from_spec(SLOPolicy.model_validate(doc).spec)
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise UsageError(f"--slo-policy {args.slo_policy!r}: {str(exc).splitlines()[0]}") from None
    name = args.objective or args.goodput
    update: dict[str, Any] = {}
    if name is not None:
        update["goodput"] = name
    if args.fairness is not None:
        if not 0 <= args.fairness <= 1:
            raise UsageError(f"--fairness must lie in [0, 1], got {args.fairness}")
        update["fairness"] = args.fairness
    return base.model_copy(update=update) if update else base


def build_config(args: argparse.Namespace) -> BenchConfig:
    """The sweep the options describe; UsageError says which option is wrong."""
    policies = (
        tuple(engine_policy_names())
        if args.policies.strip() == "all"
        else (_names(args.policies, ENGINE_POLICIES, "policies"))
    )
    routers = _names(args.router, ROUTER_POLICIES, "router")
    for flag, value in (
        ("--duration", args.duration),
        ("--slo-scale", args.slo_scale),
        ("--bucket", args.bucket),
    ):
        if not (value > 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be a positive number, got {value}")
    if args.replicas < 1:
        raise UsageError(f"--replicas must be at least 1, got {args.replicas}")
    try:
        mix = parse_mix(args.mix)
    except ValueError as exc:
        raise UsageError(f"--mix: {exc}") from None
    if args.dags not in DAG_SOURCES and not Path(args.dags).is_file():
        raise UsageError(f"--dags {args.dags!r}: neither {', '.join(DAG_SOURCES)} nor an existing file")
    if args.trace not in BUILTIN_TRACES and not Path(args.trace).is_file():
        raise UsageError(
            f"--trace {args.trace!r}: neither a built-in ({', '.join(BUILTIN_TRACES)}) nor a file"
        )
    try:
        workload = WorkloadSpec(
            trace=args.trace,
            arrival=args.arrival,
            duration_s=args.duration,
            mix=mix,
            dags=args.dags,
            slo_scale=args.slo_scale,
            high_share=args.high_share,
            best_effort_share=args.best_effort_share,
            seed=args.seed,
        )
        engine = EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UsageError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return BenchConfig(
        objective=objective_from_args(args),
        workload=workload,
        rps=_rates(args.rps),
        policies=policies,
        routers=routers,
        profiles=_profiles(args),
        replicas=args.replicas,
        engine=engine,
        sim=SimConfig(drain=args.drain),
        bucket_s=args.bucket,
        analyzer=args.analyzer,
    )


def run(args: argparse.Namespace) -> int:
    try:
        cfg = build_config(args)
        for rps in cfg.rps:  # fail fast on an unreadable trace or DAG file, before any run
            if rps is None and cfg.workload.arrival == "poisson":
                raise UsageError("--arrival poisson needs --rps")
        from slo_core.workloads.traces import load_trace

        load_trace(cfg.workload.trace)
    except (UsageError, ValueError) as exc:
        print(f"slofleet bench: error: {exc}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        print(f"slofleet bench: error: --workers must be at least 1, got {workers}", file=sys.stderr)
        return 2
    if args.resume and not args.json_path:
        print("slofleet bench: error: --resume needs --json (the earlier runs' records)", file=sys.stderr)
        return 2
    json_path = Path(args.json_path) if args.json_path else None
    done: list[dict[str, Any]] = []
    if args.resume and json_path is not None and json_path.exists():
        done = _resumable(json.loads(json_path.read_text(encoding="utf-8")), cfg)
    total = len(cfg.rps) * len(cfg.policies) * len(cfg.routers)
    skip = {record_key(r) for r in done if "error" not in r}
    todo = sum(1 for k in run_keys(cfg) if k not in skip)
    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        # runs done of those to do, elapsed < time left (tqdm's estimate from the runs done so far)
        bar = tqdm(
            total=todo,
            unit="run",
            file=sys.stderr,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.2f}/{total} runs [{elapsed}<{remaining}]",
        )
        if total > todo:
            bar.write(f"resuming: {total - todo} of {total} runs already recorded", file=sys.stderr)
    state: dict[str, Any] = {"label": None, "index": -1, "done": 0.0, "finished": 0}
    saved: list[dict[str, Any]] = list(done)

    def progress(label: str, frac: float) -> None:
        if bar is None:
            return
        if workers > 1:  # runs end out of order: count whole runs
            if frac >= 1.0:
                state["finished"] += 1
                bar.set_description(label, refresh=False)
                bar.update(1)
            return
        if label != state["label"]:
            state["label"] = label
            state["index"] += 1
            bar.set_description(label, refresh=False)
        target = state["index"] + min(1.0, frac)
        if target > state["done"]:
            bar.update(target - state["done"])
            state["done"] = target

    def save(record: dict[str, Any]) -> None:
        if json_path is None:
            return
        saved.append(record)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = json_path.with_suffix(json_path.suffix + ".tmp")
        tmp.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
        tmp.replace(json_path)

    try:
        result = run_bench(cfg, progress, workers=workers, done=done, on_record=save)
    finally:
        if bar is not None:
            bar.close()
    print(markdown_table(result.records, cfg.objective.goodput))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.records, indent=1) + "\n", encoding="utf-8")
    if args.plots:
        from slo_core.sim.plots import write_plots

        write_plots(result.records, result.samples, args.plots, cfg.objective.goodput)
    errors = [r for r in result.records if "error" in r]
    for r in errors:
        print(
            f"slofleet bench: {r['policy']}/{r['router']} at {r['rps']:g} rps failed: {r['error']}",
            file=sys.stderr,
        )
    return 1 if errors else 0


def _resumable(records: Any, cfg: BenchConfig) -> list[dict[str, Any]]:
    """The records of an earlier sweep this one can reuse: the same workload, fleet and analyzer."""
    if not isinstance(records, list):
        return []
    mine = fingerprint(cfg)
    return [r for r in records if isinstance(r, dict) and r.get("sweep_fingerprint") == mine]
