"""Shift test of the output-length bounds: train on one public prompt set, serve another.

For each (train set → served set) pair: the forest is trained on the first set's training split, then
the served set's requests arrive in a fixed random order; each gets its bounds (at submission and at
every 50-token checkpoint) from (a) the static forest as shipped (bounds only relax) and (b) the same
forest through the online calibration (slo_core.predict.calibration, the code the sidecar and the
simulator run), which learns from each completion ``--lag`` completions later (requests in flight).
Reported per pair: coverage and median/p90 bound/true at submission and after 200 tokens over the
first 100 completions (before calibration has data), and over completions N.. (after N), N = 500.

    .venv/bin/python bench/predictor_shift/shift.py --out bench/results/predictor_shift
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from slo_core.data import path as data_path
from slo_core.predict.calibration import (
    CalibratedEstimator,
    CalibrationParams,
    OnlineCalibrator,
    Plan,
)
from slo_core.predict.estimator import BoundQuery, OutputBoundEstimator
from slo_core.predict.training import LengthRow, shipped_rows, split, train_estimator

CAP = 4096


def azure_rows(name: str, limit: int) -> list[LengthRow]:
    rows: list[LengthRow] = []
    with gzip.open(data_path(name), "rt", encoding="utf-8") as fh:
        for i, d in enumerate(csv.DictReader(fh)):
            out = int(d["GeneratedTokens"])
            if out >= 1:
                rows.append(LengthRow(f"{name}:{i}", "", int(d["ContextTokens"]), out, "latency"))
    return rows[:limit]


def sets(limit: int) -> dict[str, list[LengthRow]]:
    rows = shipped_rows()
    sg = [r for r in rows if r.key.startswith("sharegpt")]
    gs = [dataclasses.replace(r, kind="latency") for r in rows if r.key.startswith("gsm8k")]
    return {
        "sharegpt": sg,
        "gsm8k": gs,
        "azure_conv": azure_rows("azure2023_conv.csv.gz", limit),
    }


def _stage(bound: list[float], true: list[float]) -> dict[str, float | int]:
    b, t = np.asarray(bound, dtype=float), np.asarray(true, dtype=float)
    if len(t) == 0:
        return {"n": 0}
    r = b / t
    return {
        "n": len(t),
        "coverage": round(float((t <= b).mean()), 4),
        "median_ratio": round(float(np.median(r)), 3),
        "p90_ratio": round(float(np.percentile(r, 90)), 3),
    }


def replay(
    est: OutputBoundEstimator, served: list[LengthRow], n_after: int, lag: int, params: CalibrationParams
) -> dict[str, object]:
    cal = CalibratedEstimator(est, OnlineCalibrator(est.params.quantile, params))
    queries = [BoundQuery(r.prompt or None, r.prompt_tokens, r.kind, CAP, model=r.model) for r in served]
    plans = cal.plans(queries, [q.kind for q in queries])
    statics = est.schedules([dataclasses.replace(q, prompt_text=None) for q in queries])
    text_static = est.bounds(queries)
    true = [min(r.output_tokens, CAP) for r in served]
    rec: dict[str, dict[str, list[float]]] = {
        k: {"b": [], "t": []} for k in ("static_sub", "static_200", "cal_sub", "cal_200", "textstatic_sub")
    }
    n = len(plans)
    spans = {"first_100": (0, 100), f"after_{n_after}": (n_after, n), "last_500": (max(0, n - 500), n)}
    windows: dict[str, dict[str, dict[str, list[float]]]] = {w: {} for w in spans}
    for w in windows:
        windows[w] = {k: {"b": [], "t": []} for k in rec}
    pending: list[tuple[int, list[int]]] = []
    hits: list[int] = []  # per arrival: the calibrated submission bound covered its length
    static_hits: list[int] = []
    for i, plan in enumerate(plans):
        L = true[i]
        every = plan.every_tokens
        issued = [cal.bound_at(plan, j * every) for j in range((L - 1) // every + 1)]
        vals = {"static_sub": statics[i].at(0), "cal_sub": issued[0], "textstatic_sub": text_static[i]}
        if L > 200:
            vals["static_200"] = statics[i].at(200)
            vals["cal_200"] = cal.bound_at(plan, 200)
        hits.append(int(issued[0] >= L))
        static_hits.append(int(statics[i].at(0) >= L))
        for w, (lo, hi) in spans.items():
            if lo <= i < hi:
                for k, v in vals.items():
                    windows[w][k]["b"].append(v)
                    windows[w][k]["t"].append(L)
        pending.append((i, issued))
        if len(pending) > lag:
            j, iss = pending.pop(0)
            cal.observe(plans[j], true[j], iss)
    out: dict[str, object] = {
        w: {k: _stage(v["b"], v["t"]) for k, v in d.items()} for w, d in windows.items()
    }
    out["rolling_coverage_100"] = [
        {
            "arrivals": k,
            "calibrated": round(float(np.mean(hits[k - 100 : k])), 3),
            "static": round(float(np.mean(static_hits[k - 100 : k])), 3),
        }
        for k in range(100, len(hits) + 1, 100)
    ]
    out["corrections"] = [c for c in cal.calibrator.snapshot() if c["stage"] in (0, 4)]
    out["oracle"] = oracle(plans, true, n_after, est.params.quantile)
    out["oracle_bands"] = oracle(plans, true, n_after, est.params.quantile, per_band=True)
    return out


def oracle(
    plans: list[Plan], true: list[int], start: int, q: float, per_band: bool = False
) -> dict[str, dict[str, float | int]]:
    """The tightest any single correction of this forest could be at coverage q, chosen in hindsight
    on the very requests it is scored on (completions ``start``..): a floor for the calibrated rows.
    ``per_band``: one such correction per prompt-length band (the calibration's submission cells)."""
    out = {}
    for name, g in (("submission", 0), ("after_200", 200)):
        idx = [i for i in range(start, len(true)) if true[i] > g]
        if not idx:
            continue
        j = g // plans[0].every_tokens
        raw = np.asarray([plans[i].raw_at(j) for i in idx])
        t = np.asarray([true[i] for i in idx], dtype=float)
        keys = np.asarray([plans[i].band if per_band else 0 for i in idx])
        bound = np.empty_like(t)
        for k in np.unique(keys):
            m = keys == k
            theta = float(np.quantile(np.log((t[m] - g) / (raw[m] - g)), q))
            bound[m] = g + (raw[m] - g) * np.exp(theta)
        out[name] = _stage(list(bound), list(t))
    return out


def retrained(
    served: list[LengthRow], args: argparse.Namespace, params: CalibrationParams
) -> dict[str, object]:
    """``predictor train --from-history`` after the first N completions: a forest trained on those
    (as the sidecar's history keeps them by default: token counts and kind, no prompt text), then
    serving completions N.. alone ("static") and through a fresh calibration."""
    history = [dataclasses.replace(r, prompt="") for r in served[: args.after]]
    est = train_estimator(history, n_trees=args.trees, min_samples_leaf=16, seed=args.seed)
    later = [dataclasses.replace(r, prompt="") for r in served[args.after :]]
    return replay(est, later, 0, args.lag, params)


PAIRS = (
    ("sharegpt", "sharegpt"),  # no shift: train split -> held-back split
    ("gsm8k", "sharegpt"),  # math answers (human) -> chat (ChatGPT): lengths far longer, under-covered
    ("sharegpt", "azure_conv"),  # ChatGPT answers -> Azure's production conversation service
    ("sharegpt", "gsm8k"),  # chat -> math answers: over-covered, loose
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/predictor_shift")
    ap.add_argument("--served", type=int, default=2000, help="requests served per pair")
    ap.add_argument("--after", type=int, default=500, help="N: report coverage after N completions")
    ap.add_argument("--lag", type=int, default=32, help="completions in flight before feedback")
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data = sets(limit=20000)
    params = CalibrationParams()
    result: dict[str, object] = {"params": params.model_dump(), "args": vars(args), "pairs": {}}
    models: dict[str, OutputBoundEstimator] = {}
    for train_name, served_name in PAIRS:
        t0 = time.perf_counter()
        if train_name not in models:
            models[train_name] = train_estimator(
                split(data[train_name])[0], n_trees=args.trees, min_samples_leaf=16, seed=args.seed
            )
        est = models[train_name]
        pool = split(data[served_name])[1] if served_name == train_name else list(data[served_name])
        random.Random(args.seed).shuffle(pool)
        served = pool[: args.served]
        res = replay(est, served, args.after, args.lag, params)
        res["retrained"] = retrained(served, args, params)
        res["served"] = len(served)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        result["pairs"][f"{train_name}->{served_name}"] = res  # type: ignore[index]
        print(f"{train_name}->{served_name} done in {res['seconds']} s", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shift.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "shift.md").write_text(table(result), encoding="utf-8")
    print(table(result))
    return 0


def table(result: dict[str, object]) -> str:
    a = result["args"]["after"]  # type: ignore[index]
    lines = [
        "| train -> served | bounds | window | n | coverage at submission | median b/t | p90 b/t "
        "| n (>200 tok) | coverage after 200 | median b/t after 200 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, res in result["pairs"].items():  # type: ignore[attr-defined]
        for w in ("first_100", f"after_{a}", "last_500"):
            for label, sub, late in (
                ("static", "static_sub", "static_200"),
                ("calibrated", "cal_sub", "cal_200"),
            ):
                lines.append(_row(pair, label, w, res[w][sub], res[w][late]))
        for label, key in (("hindsight floor", "oracle"), ("hindsight floor, per band", "oracle_bands")):
            o = res[key]
            lines.append(_row(pair, label, f"after_{a}", o["submission"], o.get("after_200", {"n": 0})))
        r = res["retrained"]
        w = r["after_0"]
        for label, sub, late in (
            ("static", "static_sub", "static_200"),
            ("calibrated", "cal_sub", "cal_200"),
        ):
            lines.append(_row(pair, f"retrained on {a} ({label})", f"after_{a}", w[sub], w[late]))
    return "\n".join(lines) + "\n"


def _row(pair: str, label: str, w: str, s: dict[str, Any], t: dict[str, Any]) -> str:
    return (
        f"| {pair} | {label} | {w} | {s['n']} | {s.get('coverage', '-')} | {s.get('median_ratio', '-')} "
        f"| {s.get('p90_ratio', '-')} | {t['n']} | {t.get('coverage', '-')} | {t.get('median_ratio', '-')} |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
