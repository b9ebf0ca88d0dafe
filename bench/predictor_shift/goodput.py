"""Simulator goodput with static vs online-calibrated length bounds, with and without a length shift.

The forest is trained on one public prompt set (token counts and kinds: what the simulator gives it);
the workload's true output lengths come either from the same set's held-back rows (no shift) or from
another set (shift). One GMAX replica (H100, Llama-3-8B profile) at an overload rate, 1:1:1
latency:deadline:compound (compound calls draw deep-research lengths in both cases), Poisson arrivals.
``static``: the forest's bounds as the simulator has used them (refinement only relaxes).
``calibrated``: the same forest through slo_core.predict.calibration (the sidecar's code), starting
uncalibrated and learning from the run's own completions.

    .venv/bin/python bench/predictor_shift/goodput.py --out bench/results/predictor_shift
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shift import sets

from slo_core.metrics import job_outcomes, summarize
from slo_core.perf.profiles import load_profile
from slo_core.predict.calibration import CalibrationParams, OnlineCalibrator
from slo_core.predict.estimator import OutputBoundEstimator
from slo_core.predict.training import LengthRow, split, train_estimator
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.fleet import FleetSim, ReplicaSpec
from slo_core.workloads.builder import WorkloadSpec, build_workload

SCENARIOS = (
    ("no shift", "sharegpt", "sharegpt"),
    ("shift: under-covered", "gsm8k", "sharegpt"),
    ("shift: over-covered", "sharegpt", "azure_conv"),
    # the three above train on single requests only, so the compound calls (deep-research DAGs) are
    # a shift in every one of them; here the forest also learns compound calls (other DAG draws)
    ("no shift, compound calls trained", "sharegpt+calls", "sharegpt"),
)
CALLS_SEED = 1_000_003  # the training DAGs' seed: never one of the served runs' seeds


def _trace(rows: list[LengthRow], path: Path) -> str:
    with path.open("w", encoding="utf-8") as fh:
        for i, r in enumerate(rows):
            fh.write(
                json.dumps({"id": str(i), "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens})
            )
            fh.write("\n")
    return str(path)


def compound_call_rows(trace: str, n_jobs: int = 3000) -> list[LengthRow]:
    """Every call of the compound programs of a workload drawn with :data:`CALLS_SEED` (kind compound)."""
    spec = WorkloadSpec(trace=trace, arrival="poisson", rps=24.0, duration_s=n_jobs / 24.0, seed=CALLS_SEED)
    rows: list[LengthRow] = []
    for job in build_workload(spec):
        for stage in job.stages or ():
            for inp, out in stage:
                rows.append(LengthRow(f"call{len(rows)}", "", inp, out, "compound"))
    return rows


def run_one(
    est: OutputBoundEstimator,
    spec: WorkloadSpec,
    policy: str,
    calibration: CalibrationParams | None,
    profile: str,
    *,
    policy_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One simulation; ``calibration`` None: the static forest's bounds; ``policy_params``: the
    policy's parameters (None: its defaults)."""
    jobs = build_workload(spec)
    cal = OnlineCalibrator(est.params.quantile, calibration) if calibration is not None else None
    analyzer = SimAnalyzer(est, calibrator=cal)
    sim = FleetSim(
        [ReplicaSpec(load_profile(profile))],
        policy,
        "round-robin",
        seed=spec.seed,
        analyzer=analyzer,
        policy_params=policy_params,
    )
    result = sim.run(jobs)
    m = summarize(result, bucket_s=60.0, jobs=job_outcomes(result))
    out = {
        k: m.get(k) for k in ("goodput_token_ratio", "goodput_request_ratio", "attainment", "jobs", "wall_s")
    }
    out["by_kind"] = {k: round(v.get("attainment") or 0.0, 3) for k, v in m["by_kind"].items()}
    if cal is not None:
        snap = cal.snapshot()
        out["calibration"] = [
            {k: c[k] for k in ("stratum", "stage", "factor", "scores", "coverage")}
            for c in snap
            if c["stage"] in (0, 4)
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/predictor_shift")
    ap.add_argument("--rps", type=float, default=12.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--policy", default="gmax")
    ap.add_argument("--profile", default="h100-llama3-8b-tp1")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument(
        "--scenario",
        type=int,
        nargs="+",
        default=[0, 1, 2, 3],
        help="which scenarios (0 no shift, 1 under, 2 over, 3 no shift with compound calls trained)",
    )
    ap.add_argument(
        "--calibration",
        default="{}",
        help="CalibrationParams fields as JSON for the calibrated runs, e.g. '{\"prompt_bands\": false}'",
    )
    ap.add_argument(
        "--policy-params",
        default="{}",
        help="the policy's parameters as JSON, for both bounds (e.g. GMAX fields: a variant's runs)",
    )
    ap.add_argument("--label", default="calibrated", help="the calibrated runs' label in the tables")
    ap.add_argument("--calibrated-only", action="store_true", help="skip the static runs")
    ap.add_argument("--merge", nargs="+", help="only merge these goodput.json files into --out")
    args = ap.parse_args(argv)
    if args.merge:
        docs = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.merge]
        return _write(
            Path(args.out), {"args": [d["args"] for d in docs]}, [r for d in docs for r in d["records"]]
        )
    data = sets(limit=20000)
    models: dict[str, OutputBoundEstimator] = {}
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, train_name, served_name in (SCENARIOS[i] for i in args.scenario):
            base = train_name.removesuffix("+calls")
            pool = split(data[served_name])[1] if served_name == base else list(data[served_name])
            random.Random(0).shuffle(pool)
            trace = _trace(pool, Path(tmp) / f"{base}-{served_name}.jsonl")  # traces are cached by path
            if train_name not in models:
                rows = split(data[base])[0]
                if train_name.endswith("+calls"):
                    rows = rows + compound_call_rows(trace)
                models[train_name] = train_estimator(rows, n_trees=args.trees, min_samples_leaf=16)
            for seed in args.seeds:
                spec = WorkloadSpec(
                    trace=trace, arrival="poisson", rps=args.rps, duration_s=args.duration, seed=seed
                )
                for calibrated in (True,) if args.calibrated_only else (False, True):
                    t0 = time.perf_counter()
                    params = CalibrationParams(**json.loads(args.calibration)) if calibrated else None
                    res = run_one(
                        models[train_name],
                        spec,
                        args.policy,
                        params,
                        args.profile,
                        policy_params=json.loads(args.policy_params) or None,
                    )
                    rec = {
                        "scenario": label,
                        "train": train_name,
                        "served": served_name,
                        "seed": seed,
                        "bounds": args.label if calibrated else "static",
                        **res,
                        "run_s": round(time.perf_counter() - t0, 1),
                    }
                    records.append(rec)
                    print(
                        json.dumps(
                            {
                                k: rec[k]
                                for k in (
                                    "scenario",
                                    "seed",
                                    "bounds",
                                    "goodput_token_ratio",
                                    "attainment",
                                    "run_s",
                                )
                            }
                        ),
                        file=sys.stderr,
                    )
    return _write(Path(args.out), {"args": vars(args)}, records)


def _write(out: Path, doc: dict[str, Any], records: list[dict[str, Any]]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "records": records}
    (out / "goodput.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    text = summary(records) + "\n" + table(records)
    (out / "goodput.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def _mean_sd(values: list[float]) -> str:
    m = sum(values) / len(values)
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}"


def summary(records: list[dict[str, Any]]) -> str:
    """Mean ± sample standard deviation over the seeds, per scenario and bounds."""
    lines = [
        "| scenario (train -> served) | bounds | seeds | token goodput | request goodput | attainment "
        "| attain latency | attain deadline | attain compound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["scenario"], r["train"], r["served"], r["bounds"]), []).append(r)
    for (scenario, train, served, bounds), rs in groups.items():
        overall = ("goodput_token_ratio", "goodput_request_ratio", "attainment")
        cells = [_mean_sd([r[k] for r in rs]) for k in overall]
        kinds = ("latency", "deadline", "compound")
        cells += [_mean_sd([r["by_kind"].get(k, 0.0) for r in rs]) for k in kinds]
        head = f"| {scenario} ({train} -> {served}) | {bounds} | {len(rs)} | "
        lines.append(head + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario (train -> served) | seed | bounds | token goodput | request goodput | attainment "
        "| attain latency / deadline / compound |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        k = r["by_kind"]
        by_kind = " / ".join(f"{k.get(name, 0):.3f}" for name in ("latency", "deadline", "compound"))
        lines.append(
            f"| {r['scenario']} ({r['train']} -> {r['served']}) | {r['seed']} | {r['bounds']} "
            f"| {r['goodput_token_ratio']:.3f} | {r['goodput_request_ratio']:.3f} | {r['attainment']:.3f} "
            f"| {by_kind} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
