"""Train and evaluate the output-length bound estimator (QRF, JITServe §4.1).

``slofleet predictor train [--out PATH]`` fits the forest on the shipped data's training split and
writes the artefact plus its ``.sha256``; ``slofleet predictor eval --data PATH|holdout [--json OUT]``
prints coverage and tightness at submission and after 50/200/500 tokens, with baselines and latency.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def _train_from_history(args: argparse.Namespace) -> int:
    """One artefact per model from sidecar checkpoints (state.json files or their directories)."""
    from slo_core.predict.estimator import EstimatorParams
    from slo_core.predict.history import history_rows, write_configmap
    from slo_core.predict.training import train_estimator

    try:
        by_model = history_rows([Path(p) for p in args.from_history])
    except (OSError, ValueError) as exc:
        print(f"cannot read the history: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else Path("predictors")
    chosen = {"compound_quantile": args.compound_quantile} if args.compound_quantile is not None else {}
    params = EstimatorParams(quantile=args.quantile, refine_every_tokens=args.refine_every, **chosen)
    written = 0
    for model, rows in sorted(by_model.items()):
        if len(rows) < args.min_rows:
            print(f"model {model!r}: {len(rows)} usable rows < --min-rows {args.min_rows}; skipped")
            continue
        est = train_estimator(
            rows, n_trees=args.trees, min_samples_leaf=args.min_samples_leaf, seed=args.seed, params=params
        )
        est.meta["trained_from"] = "sidecar history"
        est.meta["model"] = model
        path = out_dir / f"{safe_name(model)}.npz"
        digest = est.save(path)
        with_text = sum(1 for r in rows if r.prompt)
        print(f"model {model!r}: {len(rows)} rows ({with_text} with prompt text) -> {path} sha256={digest}")
        if args.configmap:
            try:
                cm = write_configmap(path, digest, f"slofleet-predictor-{safe_name(model)}")
                print(f"  ConfigMap manifest: {cm}")
            except ValueError as exc:
                print(f"  no ConfigMap: {exc}", file=sys.stderr)
        written += 1
    return 0 if written else 2


def safe_name(model: str) -> str:
    """A file and Kubernetes name for a model id (lowercase alphanumerics and dashes)."""
    out = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")
    return (out or "default")[:50]


def _train(args: argparse.Namespace) -> int:
    from slo_core.predict import SHIPPED_ARTEFACT
    from slo_core.predict.estimator import EstimatorParams
    from slo_core.predict.training import read_jsonl, shipped_rows, split, train_estimator

    if args.from_history:
        return _train_from_history(args)
    rows = read_jsonl(Path(args.data)) if args.data else split(shipped_rows())[0]
    if not rows:
        print("no training rows", file=sys.stderr)
        return 2
    chosen = {"compound_quantile": args.compound_quantile} if args.compound_quantile is not None else {}
    params = EstimatorParams(quantile=args.quantile, refine_every_tokens=args.refine_every, **chosen)
    est = train_estimator(
        rows, n_trees=args.trees, min_samples_leaf=args.min_samples_leaf, seed=args.seed, params=params
    )
    out = Path(args.out) if args.out else SHIPPED_ARTEFACT
    digest = est.save(out)
    print(f"trained on {len(rows)} rows ({args.trees} trees); wrote {out} sha256={digest}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from slo_core.predict import ArtefactError, load_estimator
    from slo_core.predict.estimator import EstimatorParams
    from slo_core.predict.evaluation import evaluate, format_report
    from slo_core.predict.training import read_jsonl, shipped_rows, split

    try:
        est = load_estimator(args.model)
    except (ArtefactError, FileNotFoundError) as exc:
        print(f"cannot load the estimator: {exc}", file=sys.stderr)
        return 2
    if args.quantile is not None:
        est.params = EstimatorParams(**{**est.params.model_dump(), "quantile": args.quantile})
    if args.data == "holdout":
        rows = split(shipped_rows())[1]
    else:
        try:
            rows = read_jsonl(Path(args.data))
        except (OSError, ValueError) as exc:
            print(f"cannot read {args.data}: {exc}", file=sys.stderr)
            return 2
    if args.limit:
        rows = rows[: args.limit]
    if not rows:
        print("no rows to evaluate", file=sys.stderr)
        return 2
    result = evaluate(
        est,
        rows,
        mean_tokens=est.training_mean_tokens,
        default_max_tokens=args.max_tokens,
        latency_repeats=args.latency_repeats,
    )
    result["data"] = args.data
    print(format_report(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    """Train or evaluate the output-length bound predictor (quantile regression forest)."""
    sub = parser.add_subparsers(dest="predictor_command", metavar="ACTION", required=True)
    train = sub.add_parser("train", help="fit the forest on the shipped data (or --data) and save it")
    train.add_argument(
        "--out",
        help="artefact path (default: the shipped artefact in slo_core/data/models); "
        "--from-history: a directory (default ./predictors)",
    )
    train.add_argument("--data", help="JSONL with prompt and output_tokens (default: shipped training split)")
    train.add_argument("--trees", type=int, default=50, help="number of trees")
    train.add_argument("--min-samples-leaf", type=int, default=8, help="minimum training rows per leaf")
    train.add_argument("--quantile", type=float, default=0.95, help="bound quantile (fraction)")
    train.add_argument(
        "--compound-quantile",
        type=float,
        help="bound quantile for the calls of compound programs (fraction; default: --quantile)",
    )
    train.add_argument("--refine-every", type=int, default=50, help="refinement period (tokens)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--from-history",
        nargs="+",
        metavar="STATE",
        help="sidecar checkpoints (state.json or --state-dir directories): one artefact per model in --out",
    )
    train.add_argument("--min-rows", type=int, default=200, help="--from-history: fewest rows per model")
    train.add_argument(
        "--configmap",
        action="store_true",
        help="--from-history: also write a ConfigMap manifest per artefact (binaryData; at most 1 MiB)",
    )
    train.set_defaults(func=_train)
    ev = sub.add_parser("eval", help="coverage and tightness of the bounds on a JSONL file")
    ev.add_argument(
        "--data", required=True, help="JSONL with prompt and output_tokens, or 'holdout' (shipped split)"
    )
    ev.add_argument("--json", help="also write the figures to this JSON file")
    ev.add_argument("--model", help="artefact path (default: the shipped artefact)")
    ev.add_argument("--quantile", type=float, help="override the artefact's quantile (fraction)")
    ev.add_argument("--max-tokens", type=int, default=4096, help="cap for rows without max_tokens (tokens)")
    ev.add_argument("--limit", type=int, default=0, help="evaluate only the first N rows (0 = all)")
    ev.add_argument("--latency-repeats", type=int, default=5, help="timed passes per batch size")
    ev.set_defaults(func=_eval)
