"""Issue 15's evidence: every registered policy vs the default (gmax), its oracle, the envelope and
an offline upper bound, over workload families × replicas × loads × seeds.

Runs are spread over every core (``--workers``, processes; a record is the same from any worker),
saved as each ends into OUT/records-<family>-r<replicas>-s<seed>-<objective>.json, and an interrupted
sweep resumes: runs already recorded are skipped. A progress bar shows runs done and the time left;
OUT/timing.jsonl records each run's CPU and wall seconds and the load average. A policy runs once for
all the objectives listed that give it the same parameters (its schedule is then the same): once in
all for a policy that does not read the objective, once per objective for GMAX.

    .venv/bin/python bench/gmax_sweep.py run --out bench/results/gmax/sweep \\
        --families conv --replicas 1 --rps 8,12 --seeds 0 --duration 60
    .venv/bin/python bench/gmax_sweep.py tables --out bench/results/gmax/sweep

The full sweep the issue asks for (>= 300 s windows, >= 3 seeds, three families, 1/2/4 replicas,
token and request goodput)::

    .venv/bin/python bench/gmax_sweep.py run --out OUT --families conv,tot,sharegpt --replicas 1,2,4 \\
        --rps overload,light --seeds 0,1,2 --duration 300 --policies all --objective token,request

``--rps overload,light`` picks per family the load where FCFS attains < 50 % and a lighter one
(per replica, times the replica count): from ``--points FILE`` when given (``calibrate`` writes it,
picked on the sweep's own window per family and replica count; the committed one is
bench/results/standard_sweep/issue20_points/load_points.json), else the 60 s-picked defaults below.
``tables`` (``--also DIR`` joins other sweep folders, each run counted once; OUT/tables.md is
written) prints mean ± spread (min–max over seeds) of the objective per policy, the envelope (best
other registered policy's mean at that point), the offline upper bound (slo_core.metrics.ceiling)
and ratios of gmax to each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slo_core.bench.parallel import process_pool
from slo_core.bench.runner import BenchConfig, run_one_timed
from slo_core.metrics.ceiling import offline_bound
from slo_core.objective import Objective
from slo_core.perf import load_profile
from slo_core.policies.registry import engine_policy_names, objective_params
from slo_core.sim.engine_types import EngineConfig
from slo_core.workloads import WorkloadSpec, build_workload

PROFILE = "h100-llama3-8b-tp1"
# family -> (workload fields, per-replica (overload, light) rates in requests/s)
FAMILIES: dict[str, tuple[dict[str, Any], tuple[float, float]]] = {
    "conv": ({"trace": "azure-conv-2023", "mix": (1.0, 1.0, 1.0), "dags": "deep-research"}, (12.0, 8.0)),
    "code": ({"trace": "azure-code-2023", "mix": (1.0, 1.0, 1.0), "dags": "deep-research"}, (8.0, 5.0)),
    "tot": ({"trace": "azure-conv-2023", "mix": (1.0, 1.0, 1.0), "dags": "tot"}, (12.0, 8.0)),
    "sharegpt": (
        {"trace": "sharegpt", "arrival": "poisson", "mix": (1.0, 1.0, 1.0), "dags": "deep-research"},
        (8.0, 5.0),
    ),
}
DEFAULT_POLICIES = (
    "fcfs,sarathi,edf,ltr,sjf-oracle,strict-priority,tempo,slos-serve,"
    "gmax,gmax-oracle,gmax-no-gmax,gmax-no-analyzer"
)


def _spec(family: str, duration: float, seed: int, rps: float) -> WorkloadSpec:
    fields, _ = FAMILIES[family]
    return WorkloadSpec(duration_s=duration, seed=seed, rps=rps, **fields)


POINTS_FILE = "load_points.json"
LIGHT_SHARE = 2.0 / 3.0  # the lighter point, as a share of the overload point (12 -> 8 req/s before)


def _points(path: str | None) -> dict[str, dict[str, tuple[float, float]]]:
    """Calibrated per-replica (overload, light) rates by family and replica count (``calibrate``)."""
    if not path:
        return {}
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    return {
        fam: {n: (float(v["overload_per_replica"]), float(v["light_per_replica"])) for n, v in by.items()}
        for fam, by in raw["points"].items()
    }


def _rates(
    text: str, family: str, replicas: int, points: dict[str, dict[str, tuple[float, float]]] | None = None
) -> list[float]:
    over, light = FAMILIES[family][1]
    if points and family in points and str(replicas) in points[family]:
        over, light = points[family][str(replicas)]
    out = []
    for raw in text.split(","):
        item = raw.strip()
        if item == "overload":
            out.append(over * replicas)
        elif item == "light":
            out.append(light * replicas)
        else:
            out.append(float(item))
    return out


def as_stored(record: dict[str, Any], task: Task) -> dict[str, Any]:
    """``record`` (a run of ``task``) as a sweep stores it, in place: without its goodput over time (the
    tables read none), with its family."""
    record.pop("goodput_over_time", None)
    record["family"] = task.family
    return record


@dataclass(frozen=True)
class Task:
    """One run of the sweep; its record goes to every objective in ``objectives`` (a policy that does
    not read the objective runs once and serves all of them: its schedule is the same)."""

    family: str
    replicas: int
    seed: int
    rps: float
    policy: str
    objectives: tuple[str, ...]
    duration_s: float
    router: str

    def config(self) -> BenchConfig:
        return BenchConfig(
            workload=_spec(self.family, self.duration_s, self.seed, self.rps),
            rps=(self.rps,),
            policies=(self.policy,),
            routers=(self.router,),
            profiles=(load_profile(PROFILE),),
            replicas=self.replicas,
            engine=EngineConfig(),
            objective=Objective(goodput=self.objectives[0]),
        )

    def file(self, objective: str) -> str:
        return f"records-{self.family}-r{self.replicas}-s{self.seed}-{objective}.json"


def add_task_arguments(ap: argparse.ArgumentParser, duration_s: float, *, rps_required: bool = True) -> None:
    """The options that name one run of the grid, for the scripts that look into one
    (``bench/profile_sweep_run.py``, ``bench/run_phases.py``, ``bench/time_in_run.py``): :func:`task_of`
    reads them (``rps_required=False``: a script that also runs something else checks it)."""
    ap.add_argument("--family", default="tot", choices=sorted(FAMILIES))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument(
        "--rps", type=float, required=rps_required, help="total requests/s (the sweep's per-point rate)"
    )
    ap.add_argument("--duration", type=float, default=duration_s)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", default="token")
    ap.add_argument("--router", default="round-robin")


def task_of(args: argparse.Namespace, policy: str) -> Task:
    """The run :func:`add_task_arguments`'s options name, with ``policy``."""
    return Task(
        args.family,
        args.replicas,
        args.seed,
        args.rps,
        policy,
        (args.objective,),
        args.duration,
        args.router,
    )


def objective_groups(policy: str, objectives: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``objectives`` grouped by the parameters each sets in ``policy``: one run serves a group (the
    schedule is the same; fcfs reads no objective, slide-batching weighs tokens alike under token and
    request goodput), so no run is repeated for a file that would get the very same record."""
    groups: dict[str, list[str]] = {}
    for o in objectives:
        params = objective_params(policy, Objective(goodput=o))
        groups.setdefault(json.dumps(params, sort_keys=True, default=str), []).append(o)
    return [tuple(g) for g in groups.values()]


def tasks(args: argparse.Namespace) -> list[Task]:
    """Every run of the sweep in the order they start: replicas, family, seed, load, policy (so an
    interrupted sweep has whole points, every policy at a load, with every seed it reached)."""
    policies = tuple(engine_policy_names()) if args.policies == "all" else tuple(args.policies.split(","))
    objectives = tuple(args.objective.split(","))
    points = _points(getattr(args, "points", None))
    out = []
    for replicas in (int(r) for r in args.replicas.split(",")):
        for family in args.families.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                for rps in _rates(args.rps, family, replicas, points):
                    for policy in policies:
                        for group in objective_groups(policy, objectives):
                            out.append(
                                Task(family, replicas, seed, rps, policy, group, args.duration, args.router)
                            )
    return out


def _done_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["policy"], r.get("rps_requested", r["rps"]), r["duration_s"], r["router"])


def _load(out: Path) -> dict[str, list[dict[str, Any]]]:
    files: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("records-*.json")):
        files[path.name] = json.loads(path.read_text(encoding="utf-8"))
    return files


def _save(out: Path, name: str, records: list[dict[str, Any]]) -> None:
    records.sort(key=lambda r: (r["rps"], r["policy"]))
    tmp = out / (name + ".tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / name)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def host() -> dict[str, Any]:
    """What a record depends on beyond the code and the seed: the same snapshot gave different
    overload records on two hosts (bench/results/gmax/issue15/README.md), so records from one host
    are compared with records from the same host only."""
    import importlib.metadata
    import platform

    import numpy as np

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        features = {}
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "")
    except OSError:
        pass
    versions = {}
    for dist in ("scipy", "scikit-learn", "quantile-forest"):  # the analyzer's forest
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        **versions,
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "simd": sorted(k for k, on in features.items() if on and k.startswith("AVX")),
        # numpy's kernels switched off (X86_V4: its AVX-512 float64 exp/log, whose last bits differ from
        # the C library's that other hosts use); __cpu_features__ above still lists them
        "numpy_disabled": os.environ.get("NPY_DISABLE_CPU_FEATURES"),
        # where the policies' exp/log come from: since 147b97c slo_core.detmath, the same on every host
        "policy_exp_log": "slo_core.detmath",
    }


def run(args: argparse.Namespace) -> int:
    """Run the sweep's missing runs over ``--workers`` processes, saving each record as it ends.

    Resumable: runs already in OUT/records-*.json (same policy, load, window, router) are skipped.
    Each run is seeded and independent, so a record is the same from any worker (tests/unit/core/
    bench/test_gmax_sweep_parallel.py). OUT/timing.jsonl gets a line per run (CPU and wall seconds,
    the load average) and a line per invocation.
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = _load(out)
    done = {name: {_done_key(r) for r in recs if "error" not in r} for name, recs in files.items()}
    todo = [
        t
        for t in tasks(args)
        if any(
            (t.policy, t.rps, t.duration_s, t.router) not in done.get(t.file(o), set()) for o in t.objectives
        )
    ]
    total = len(tasks(args))
    workers = max(1, min(args.workers or os.cpu_count() or 1, len(todo) or 1))
    timing = out / "timing.jsonl"
    started = time.time()
    with timing.open("a", encoding="utf-8") as log:
        log.write(
            json.dumps(
                {
                    "event": "start",
                    "runs_total": total,
                    "runs_todo": len(todo),
                    "workers": workers,
                    "at": started,
                    "load": _loadavg(),
                    "host": host(),
                }
            )
            + "\n"
        )
    from tqdm import tqdm

    bar = tqdm(total=len(todo), unit="run", file=sys.stderr, dynamic_ncols=True, disable=args.no_progress)
    if total > len(todo):
        bar.write(f"resuming: {total - len(todo)} of {total} runs already recorded", file=sys.stderr)

    def finished(task: Task, record: dict[str, Any], cpu_s: float) -> None:
        as_stored(record, task)
        for objective in task.objectives:
            rec = dict(record, objective=objective)
            name = task.file(objective)
            recs = [r for r in files.get(name, []) if _done_key(r) != _done_key(rec)]
            recs.append(rec)
            files[name] = recs
            _save(out, name, recs)
        with timing.open("a", encoding="utf-8") as log:
            log.write(
                json.dumps(
                    {
                        "event": "run",
                        "file": task.file(task.objectives[0]),
                        "policy": task.policy,
                        "rps": task.rps,
                        "objectives": list(task.objectives),
                        "cpu_s": round(cpu_s, 3),
                        "wall_s": record.get("wall_s"),
                        "load": _loadavg(),
                        "error": record.get("error"),
                    }
                )
                + "\n"
            )
        status = record.get("error", "")[:60] or f"{cpu_s:.0f} s CPU"
        bar.set_description_str(
            f"{task.family} x{task.replicas} s{task.seed} {task.rps:g}rps {task.policy}: {status}",
            refresh=False,
        )
        bar.update(1)

    try:
        if workers == 1:
            for t in todo:
                finished(t, *run_one_timed(t.config(), (t.policy, t.router, t.rps)))
        else:
            with process_pool(workers) as pool:
                futures = {
                    pool.submit(run_one_timed, t.config(), (t.policy, t.router, t.rps)): t for t in todo
                }
                for fut in as_completed(futures):
                    finished(futures[fut], *fut.result())
    finally:
        bar.close()
        with timing.open("a", encoding="utf-8") as log:
            log.write(
                json.dumps({"event": "end", "wall_s": round(time.time() - started, 1), "load": _loadavg()})
                + "\n"
            )
    return 0


def _fcfs_attainment(
    family: str, replicas: int, seed: int, duration: float, per_replica: float
) -> dict[str, Any]:
    """One FCFS probe at ``per_replica`` req/s on each of ``replicas`` replicas: attainment, token
    goodput and the CPU seconds it took."""
    rps = round(per_replica * replicas, 3)
    task = Task(family, replicas, seed, rps, "fcfs", ("token",), duration, "round-robin")
    record, cpu_s = run_one_timed(task.config(), ("fcfs", task.router, task.rps))
    if "error" in record:
        raise RuntimeError(f"{family} x{replicas} @ {task.rps}: {record['error']}")
    return {
        "per_replica_rps": per_replica,
        "rps": task.rps,
        "attainment": record["attainment"],
        "goodput_token_ratio": record["goodput_token_ratio"],
        "cpu_s": round(cpu_s, 2),
    }


def _calibrate_one(family: str, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    """Bisect the per-replica rate where FCFS's attainment crosses ``--target`` on the sweep's window."""
    from slo_core.metrics.capacity import serving_capacity

    probes: list[dict[str, Any]] = []

    def attainment_at(rate: float) -> float:
        probe = _fcfs_attainment(family, replicas, args.seed, args.duration, rate)
        probes.append(probe)
        return float(probe["attainment"])

    res = serving_capacity(attainment_at, args.lo, args.hi, target=args.target, iterations=args.iterations)
    failing = [p["per_replica_rps"] for p in probes if p["attainment"] < args.target]
    # the overload point: the lightest probed rate where FCFS attains < target (the bracket's top)
    over = min(failing) if failing else args.hi
    light = round(over * LIGHT_SHARE, 2)
    return {
        "family": family,
        "replicas": replicas,
        "overload_per_replica": over,
        "light_per_replica": light,
        "fcfs_capacity_per_replica": res.capacity_rps,
        "censored": res.censored,
        "probes": probes,
    }


def calibrate(args: argparse.Namespace) -> int:
    """Pick the sweep's load points on its own window: per family and replica count, FCFS's attainment
    is bisected over the per-replica rate (seed ``--seed``); the overload point is the lightest probed
    rate where FCFS attains < ``--target`` (issue 15: "the highest load where FCFS attains < 50 %",
    read as the edge of that region, not arbitrarily deep overload) and the light point
    ``LIGHT_SHARE`` of it. Writes OUT/load_points.json for ``run --points`` after each combination
    (a rerun calibrates only the combinations missing from it)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / POINTS_FILE
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"points": {}}
    doc["how"] = (
        f"gmax_sweep.py calibrate: FCFS, seed {args.seed}, {args.duration:g} s windows, "
        f"target attainment {args.target}, bisection of [{args.lo}, {args.hi}] req/s per replica, "
        f"{args.iterations} steps"
    )
    points: dict[str, dict[str, Any]] = doc["points"]
    combos = [
        (f, int(r))
        for r in args.replicas.split(",")
        for f in args.families.split(",")
        if r not in points.get(f, {})  # resumable: combinations already calibrated are kept
    ]
    workers = max(1, min(args.workers or os.cpu_count() or 1, len(combos) or 1))
    c0, wall0 = time.time(), float(doc.get("wall_s") or 0.0)

    def save(res: dict[str, Any]) -> None:
        points.setdefault(res["family"], {})[str(res["replicas"])] = res
        doc["wall_s"] = round(wall0 + time.time() - c0, 1)  # over every invocation
        doc["load_end"] = _loadavg()
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(
            f"{res['family']} x{res['replicas']}: overload {res['overload_per_replica']:g} "
            f"req/s per replica, light {res['light_per_replica']:g}; probes "
            + ", ".join(f"{p['per_replica_rps']:g}->{p['attainment']:.2f}" for p in res["probes"]),
            flush=True,
        )

    if workers == 1:
        for f, r in combos:
            save(_calibrate_one(f, r, args))
    else:
        with process_pool(workers) as pool:
            futures = [pool.submit(_calibrate_one, f, r, args) for f, r in combos]
            for fut in as_completed(futures):
                save(fut.result())
    return 0


def _mean_spread(xs: list[float]) -> str:
    if not xs:
        return "–"
    m = statistics.fmean(xs)
    return f"{m:.3f}" if len(xs) == 1 else f"{m:.3f} ({min(xs):.3f}–{max(xs):.3f})"


def numerics(h: dict[str, Any] | None) -> str:
    """Which float64 exp/log the policies ran, from :func:`host`'s record of it. Before 147b97c they
    called numpy's, which runs its own AVX-512 kernels where it can and the C library's elsewhere, and
    GMAX's records differ between the two (one flipped comparison, amplified by the simulation), so a
    standing compared records made with the same numerics; since, slo_core.detmath's, the same on
    every host."""
    if not h:
        return "unrecorded"
    if h.get("policy_exp_log") == "slo_core.detmath":
        return "detmath (any host)"
    machine = str(h.get("machine", ""))
    if machine not in {"x86_64", "AMD64"}:
        return f"{machine or 'unknown'} numpy"
    off = set(str(h.get("numpy_disabled") or "").replace(",", " ").split())
    if "AVX512F" in h.get("simd", []) and not off & {"X86_V4", "AVX512F", "AVX512_SKX"}:
        return "numpy AVX-512"
    return "C library"


def record_numerics(folder: Path) -> dict[tuple[Any, ...], str]:
    """(record file, policy, rate, objective) → :func:`numerics` of the invocation that made that
    record: OUT/timing.jsonl's run lines follow their invocation's start line, and a later run of the
    same key replaced the record, so the last one counts."""
    out: dict[tuple[Any, ...], str] = {}
    path = folder / "timing.jsonl"
    if not path.exists():
        return out
    label = "unrecorded"
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "start":
            label = numerics(event.get("host"))
        elif event.get("event") == "run" and not event.get("error"):
            for objective in event.get("objectives", ["token"]):
                name = str(event["file"]).rsplit("-", 1)[0] + f"-{objective}.json"
                out[(name, event["policy"], event["rps"], objective)] = label
    return out


# Issue 15's "done when", per point: (criterion, the policy GMAX is measured against, the factor)
CRITERIA: tuple[tuple[str, str, float], ...] = (
    ("≥ 1.0x the envelope", "envelope", 1.0),
    ("≥ 0.95x its oracle", "gmax-oracle", 0.95),
    ("latency-tier attainment ≥ FCFS's", "fcfs-latency", 1.0),
    ("≥ 2.0x FCFS", "fcfs", 2.0),
    ("≥ 2.0x Sarathi", "sarathi", 2.0),
)
# a paired gap under this many standard errors of the per-seed differences is not told apart by the seeds
NOISE_SE = 2.0


@dataclass(frozen=True)
class Miss:
    """One criterion GMAX misses at one point: by how much, per seed, and the class of the reason.

    ``why`` is one of ``unreachable`` (the target exceeds what any schedule can reach: the
    instant-service ideal, 1.0, or the offline bound, both as means over the seeds), ``seed noise``
    (the mean paired per-seed gap to the target is under :data:`NOISE_SE` standard errors of it) or
    ``real`` (the mean gap is that large or larger, or there is one seed)."""

    criterion: str
    against: str
    value: float  # GMAX's mean over the reference's mean (attainment: GMAX's minus FCFS's)
    target: float
    per_seed: tuple[float, ...]  # the same, seed by seed (paired)
    gap_units: str  # the mean shortfall in the objective's own units ("1.3 requests a run"), or ""
    why: str
    detail: str


_UNITS = {"request": ("goodput_request", "requests"), "token": ("goodput_token", "tokens")}


def _paired(xs: dict[int, float], ys: dict[int, float]) -> list[int]:
    return sorted(set(xs) & set(ys))


def latency_attainment(r: dict[str, Any]) -> float | None:
    """A record's latency-tier attainment (None when the run had no latency requests)."""
    kind = r.get("by_kind", {}).get("latency")
    return None if kind is None else float(kind["attainment"])


def point_misses(
    by_seed: dict[str, dict[int, dict[str, Any]]], objective: str, bound: float | None
) -> list[Miss]:
    """The criteria of :data:`CRITERIA` that GMAX misses at one point (see :func:`judge_point`)."""
    return [m for m in judge_point(by_seed, objective, bound) if m is not None]


def judge_point(
    by_seed: dict[str, dict[int, dict[str, Any]]], objective: str, bound: float | None
) -> list[Miss | None]:
    """One entry per criterion of :data:`CRITERIA` judged at one point: its :class:`Miss`, or None
    where GMAX meets it.

    ``by_seed``: policy → seed → record; ``bound``: the offline bound's mean ratio over the seeds
    (None where it is not defined). Every comparison is of means over the seeds the two policies
    share, and the per-seed values are paired by seed. A criterion whose reference policy has no
    records at the point is not judged (no entry)."""
    col = f"goodput_{objective}_ratio"

    def values(pol: str) -> dict[int, float]:
        return {s: float(r[col]) for s, r in by_seed.get(pol, {}).items() if r.get(col) is not None}

    def latency(pol: str) -> dict[int, float]:
        return {s: a for s, r in by_seed.get(pol, {}).items() if (a := latency_attainment(r)) is not None}

    gmax = values("gmax")
    if not gmax:
        return []
    means = {p: statistics.fmean(v.values()) for p in by_seed if (v := values(p))}
    others = {p: m for p, m in means.items() if p not in {"gmax", "gmax-oracle"}}
    ceiling = min(1.0, bound) if bound is not None else 1.0
    judged: list[Miss | None] = []
    for criterion, against, factor in CRITERIA:
        if against == "fcfs-latency":
            mine, ref = latency("gmax"), latency("fcfs")
            seeds = _paired(mine, ref)
            if not seeds:
                continue
            diffs = [mine[s] - ref[s] for s in seeds]
            value = statistics.fmean(mine[s] for s in seeds) - statistics.fmean(ref[s] for s in seeds)
            miss = Miss(criterion, "fcfs", value, 0.0, tuple(diffs), "", _noise_class(diffs), "")
            judged.append(None if value >= 0 else miss)
            continue
        name = max(others, key=lambda p: others[p]) if against == "envelope" and others else against
        ref = values(name)
        seeds = _paired(gmax, ref)
        if not seeds:
            continue
        g_mean = statistics.fmean(gmax[s] for s in seeds)
        r_mean = statistics.fmean(ref[s] for s in seeds)
        value = g_mean / r_mean if r_mean > 0 else math.inf
        if value >= factor:
            judged.append(None)
            continue
        per_seed = tuple(gmax[s] / ref[s] if ref[s] > 0 else math.inf for s in seeds)
        # paired gap to the target in the objective's ratio: gmax_s - factor * ref_s
        diffs = [gmax[s] - factor * ref[s] for s in seeds]
        units = ""
        if objective in _UNITS:
            field, unit = _UNITS[objective]
            rows_g, rows_r = by_seed["gmax"], by_seed[name]
            if all(field in rows_g[s] and field in rows_r[s] for s in seeds):
                short = statistics.fmean(factor * rows_r[s][field] - rows_g[s][field] for s in seeds)
                units = f"{short:,.1f} {unit} a run"
        target_mean = factor * r_mean
        if target_mean > ceiling:
            what = "the instant-service ideal" if ceiling >= 1.0 else "the offline bound"
            why, detail = "unreachable", f"{factor:g}x {name} = {target_mean:.4f} > {ceiling:.4f} ({what})"
        else:
            why = _noise_class(diffs)
            met = sum(1 for d in diffs if d >= 0)
            detail = f"needs {target_mean:.4f} (ceiling {ceiling:.4f}); met in {met} of {len(diffs)} seeds"
        label = f"{name} (envelope)" if against == "envelope" else name
        judged.append(Miss(criterion, label, value, factor, per_seed, units, why, detail))
    return judged


def _noise_class(diffs: list[float]) -> str:
    """``seed noise`` when the mean of the paired differences (each GMAX's value less the target's)
    falls short of 0 by less than :data:`NOISE_SE` standard errors (one seed: never), else ``real``."""
    if len(diffs) < 2:
        return "real"
    gap = -statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return "seed noise" if gap < NOISE_SE * se else "real"


def misses_section(rows: list[tuple[str, str, list[Miss]]], judged: int) -> list[str]:
    """The tables' account of every criterion missed: ``rows`` holds (point, load, misses) per
    point-objective; ``judged`` the number of (point, criterion) pairs with records to judge."""
    flat = [(point, load, m) for point, load, ms in rows for m in ms]
    count = defaultdict(int)
    for _, _, m in flat:
        count[m.why] += 1
    lines = [
        "## Where GMAX misses a criterion, by how much, and why",
        "",
        f"Criteria judged: {judged} (point-objective × criterion with records); missed: {len(flat)} "
        f"({', '.join(f'{n} {why}' for why, n in sorted(count.items())) or 'none'}). `value`: GMAX's mean "
        "over the other's mean (latency: GMAX's attainment minus FCFS's); `per seed`: the same, paired by "
        "seed. `unreachable`: the target is above the instant-service ideal (1.0) or the offline bound, so "
        "no schedule reaches it; `seed noise`: the paired per-seed gap to the target is within "
        f"{NOISE_SE:g} standard errors (the seeds cannot tell GMAX from the target); `real`: below it beyond "
        "the seeds' spread.",
        "",
        "| point | load | criterion | against | value | target | per seed | short by | why | detail |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point, load, m in flat:
        digits = 4 if m.criterion.startswith("≥ 1.0x") else 3
        seeds = " / ".join(f"{x:.{digits}f}" for x in m.per_seed)
        lines.append(
            f"| {point} | {load} | {m.criterion} | {m.against} | {m.value:.{digits}f} | {m.target:g} | "
            f"{seeds} | {m.gap_units or '–'} | {m.why} | {m.detail or '–'} |"
        )
    lines.append("")
    return lines


def table_records(folders: list[Path], first_only: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The records of every folder, each run once: a run (family, replicas, rate, objective, policy,
    seed) recorded in several folders is taken from the first folder listed that has it (a later
    pass that re-ran some policies is listed first, the pass it completes after it). Records of the
    policies in ``first_only`` come from the first folder only (a re-sweep of the policies a code
    change moved: their older records are another code's, not a fill-in)."""
    records: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for i, folder in enumerate(folders):
        made_with = record_numerics(folder)
        for name, file_records in _load(folder).items():
            for r in file_records:
                if "error" in r or (i > 0 and r["policy"] in first_only):
                    continue
                run = (
                    r["family"],
                    r["replicas"],
                    r["rps"],
                    r.get("objective", "token"),
                    r["policy"],
                    r["seed"],
                )
                if run not in seen:
                    seen.add(run)
                    objective = r.get("objective", "token")
                    label = made_with.get((name, r["policy"], r["rps"], objective), "unrecorded")
                    records.append({**r, "numerics": label, "folder": str(folder)})
    return records


def tables(args: argparse.Namespace) -> int:
    out = Path(args.out)
    own = frozenset(p for p in (args.own_policies or "").split(",") if p)
    records = table_records([out, *map(Path, args.also or [])], own)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["family"], r["replicas"], r["rps"], r.get("objective", "token"))].append(r)
    lines = [
        "# GMAX vs every registered policy, the envelope and the offline bound (bench/gmax_sweep.py)",
        "",
        "Objective ratio = goodput over the instant-service gain of the same jobs. Mean over seeds, "
        "(min–max) in brackets. `envelope` = best mean of the other policies at the point; `bound` = "
        "offline upper bound (slo_core/metrics/ceiling.py; a relaxation, mean over seeds); "
        "`lat` = latency-tier attainment.",
        "",
    ]
    summary = [
        "## gmax at each point",
        "",
        "| family | replicas | req/s | objective | seeds | gmax | /envelope (best other) | /oracle | /bound "
        "| /fcfs | /sarathi | lat gmax | lat fcfs | GMAX family's exp/log |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    made_with: dict[tuple[str, str, str], int] = defaultdict(int)
    for r in records:
        made_with[(r["policy"], r["numerics"], r["folder"])] += 1
    heaviest: dict[tuple[str, int], float] = defaultdict(float)
    for family, replicas, rps, _ in groups:
        heaviest[(family, replicas)] = max(heaviest[(family, replicas)], rps)
    missed: list[tuple[str, str, list[Miss]]] = []
    judged = 0
    for key in sorted(groups):
        family, replicas, rps, objective = key
        rs = groups[key]
        by_pol: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            by_pol[r["policy"]].append(r)
        col = f"goodput_{objective}_ratio"

        def vals(pol: str, field: str = col, rows: dict[str, list[dict[str, Any]]] = by_pol) -> list[float]:
            return [float(r[field]) for r in rows.get(pol, []) if r.get(field) is not None]

        def lat(pol: str, rows: dict[str, list[dict[str, Any]]] = by_pol) -> list[float]:
            return [a for r in rows.get(pol, []) if (a := latency_attainment(r)) is not None]

        seeds = sorted({r["seed"] for r in rs})
        bounds = []
        for seed in seeds:
            head = rs[0]
            spec = _spec(family, head["duration_s"], seed, rps)
            c = offline_bound(
                build_workload(spec),
                objective,
                profiles=(load_profile(PROFILE),),
                replicas=replicas,
                max_num_seqs=EngineConfig().max_num_seqs,
            )
            if c is not None:
                bounds.append(c.ratio)
        bound = statistics.fmean(bounds) if bounds else None
        means = {p: statistics.fmean(vals(p)) for p in by_pol if vals(p)}
        others = {p: m for p, m in means.items() if p not in {"gmax", "gmax-oracle"}}
        best = max(others, key=lambda p: others[p]) if others else None
        lines += [
            f"## {family}, {replicas} replica(s), {rps:g} req/s, objective {objective}, seeds {seeds}, "
            f"{rs[0]['duration_s']:g} s",
            "",
            f"offline bound: {bound:.3f}" if bound is not None else "offline bound: not defined",
            "",
            "| policy | objective ratio | token | request | attain | lat attain | of envelope | of bound |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for pol in sorted(means, key=lambda p: -means[p]):
            m = means[pol]
            env = f"{m / others[best]:.2f}" if best and others[best] > 0 else "–"
            ob = f"{m / bound:.2f}" if bound else "–"
            lines.append(
                f"| {pol} | {_mean_spread(vals(pol))} "
                f"| {_mean_spread(vals(pol, 'goodput_token_ratio'))} "
                f"| {_mean_spread(vals(pol, 'goodput_request_ratio'))} "
                f"| {_mean_spread(vals(pol, 'attainment'))} | {_mean_spread(lat(pol))} | {env} | {ob} |"
            )
        lines.append("")
        by_seed: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for r in rs:
            by_seed[r["policy"]][r["seed"]] = r
        verdicts = judge_point(by_seed, objective, bound)
        judged += len(verdicts)
        if verdicts:
            load = "overload" if rps == heaviest[(family, replicas)] else "light"
            point = f"{family} x{replicas} {rps:g} req/s {objective}"
            missed.append((point, load, [m for m in verdicts if m is not None]))
        g = means.get("gmax")
        if g is not None:

            def ratio(p: str | None, g: float = g, means: dict[str, float] = means, digits: int = 2) -> str:
                if p is None or p not in means or means[p] <= 0:
                    return "–"
                return f"{g / means[p]:.{digits}f}"

            lg, lf = lat("gmax"), lat("fcfs")
            summary.append(
                f"| {family} | {replicas} | {rps:g} | {objective} | {len(seeds)} | {g:.3f} | "
                f"{ratio(best, digits=4)} ({best}) | {ratio('gmax-oracle')} | "
                f"{(f'{g / bound:.2f}' if bound else '–')} | {ratio('fcfs')} | {ratio('sarathi')} | "
                f"{(f'{statistics.fmean(lg):.3f}' if lg else '–')} | "
                f"{(f'{statistics.fmean(lf):.3f}' if lf else '–')} | "
                f"{' + '.join(sorted({r['numerics'] for r in rs if r['policy'].startswith('gmax')}))} |"
            )
    provenance = [
        "## Where each policy's records come from",
        "",
        "Which exp/log the policies ran (`numerics` in bench/gmax_sweep.py): before 147b97c numpy's, "
        "its own AVX-512 kernels or the C library's by host, and GMAX-family records differ between the "
        "two, so a point compares GMAX-family records made with one of them; since, slo_core.detmath's, "
        "the same on every host. `unrecorded`: before hosts were recorded.",
        "",
        "| policy | exp/log | records | folder |",
        "|---|---|---|---|",
        *(f"| {pol} | {label} | {n} | {folder} |" for (pol, label, folder), n in sorted(made_with.items())),
        "",
    ]
    account = misses_section(missed, judged)
    text = "\n".join([*lines[:4], *summary, "", *account, *provenance, *lines[4:]]) + "\n"
    (out / "tables.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--families", default="conv")
    r.add_argument("--replicas", default="1")
    r.add_argument("--rps", default="overload,light")
    r.add_argument("--seeds", default="0")
    r.add_argument("--duration", type=float, default=60.0)
    r.add_argument("--policies", default=DEFAULT_POLICIES)
    r.add_argument("--router", default="round-robin")
    r.add_argument(
        "--objective", default="token", help="comma list of token, request, tempo, tdg (one record file each)"
    )
    r.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--points", default=None, help="load_points.json from calibrate (overload, light)")
    r.set_defaults(func=run)
    c = sub.add_parser("calibrate", help="pick overload/light per family and replica count (FCFS bisection)")
    c.add_argument("--out", required=True)
    c.add_argument("--families", default="conv,tot,sharegpt")
    c.add_argument("--replicas", default="1,2,4")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--duration", type=float, default=300.0)
    c.add_argument("--target", type=float, default=0.5, help="FCFS attainment that marks overload")
    c.add_argument("--lo", type=float, default=1.0, help="per-replica req/s (low end of the bracket)")
    c.add_argument("--hi", type=float, default=16.0, help="per-replica req/s (high end of the bracket)")
    c.add_argument("--iterations", type=int, default=4)
    c.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    c.set_defaults(func=calibrate)
    t = sub.add_parser("tables")
    t.add_argument("--out", required=True)
    t.add_argument(
        "--also",
        action="append",
        metavar="DIR",
        help="another sweep folder to read (repeatable; a run in several folders counts once, from "
        "the first listed: --out first)",
    )
    t.add_argument(
        "--own-policies",
        default="",
        metavar="P1,P2",
        help="policies whose records come from --out only (none from --also: a re-sweep after a change "
        "that moved them)",
    )
    t.set_defaults(func=tables)
    args = ap.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
