"""Training data and fitting for the length forest (needs the ``predictor`` extra: quantile-forest).

Shipped data: ShareGPT first turns (chat, labelled kind ``latency``) and GSM8K questions with the
token counts of their reference answers (labelled ``deadline``); neither says which model answered,
so the model id is empty. Every row is also trained on without its text (token count only), the
case of the simulator and of callers that do not pass the prompt. A deterministic 20 % of rows
(by a CRC of the row's key) is held back for evaluation and never trained on.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slo_core.data import path as data_path
from slo_core.predict.estimator import EstimatorParams, OutputBoundEstimator
from slo_core.predict.features import F32, FeatureParams, RequestFeatures, featurize
from slo_core.predict.forest import ArrayForest
from slo_core.wire.tokens import approx_tokens

HOLDOUT_MODULUS = 5  # one row in five is held back


@dataclass(frozen=True, slots=True)
class LengthRow:
    """One request with its true output length."""

    key: str
    prompt: str
    prompt_tokens: int
    output_tokens: int
    kind: str = ""
    model: str = ""
    max_tokens: int | None = None

    @property
    def features(self) -> RequestFeatures:
        return RequestFeatures(self.prompt_tokens, self.prompt, self.kind, self.model)


def is_holdout(key: str) -> bool:
    return zlib.crc32(key.encode("utf-8")) % HOLDOUT_MODULUS == 0


def _gz_lines(name: str) -> Iterator[dict[str, object]]:
    with gzip.open(data_path(name), "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def shipped_rows() -> list[LengthRow]:
    """Every shipped ShareGPT and GSM8K row."""
    rows = [
        LengthRow(
            key=f"sharegpt:{d['id']}",
            prompt=str(d["prompt"]),
            prompt_tokens=int(str(d["prompt_tokens"])),
            output_tokens=int(str(d["output_tokens"])),
            kind="latency",
        )
        for d in _gz_lines("sharegpt_first_turn_5k.jsonl.gz")
    ]
    rows += [
        LengthRow(
            key=f"gsm8k:{i}",
            prompt=str(d["question"]),
            prompt_tokens=int(str(d["question_tokens"])),
            output_tokens=int(str(d["answer_tokens"])),
            kind="deadline",
        )
        for i, d in enumerate(_gz_lines("gsm8k_train_lengths.jsonl.gz"))
    ]
    return [r for r in rows if r.output_tokens >= 1]


def split(rows: Iterable[LengthRow]) -> tuple[list[LengthRow], list[LengthRow]]:
    """(train, held back)."""
    train: list[LengthRow] = []
    held: list[LengthRow] = []
    for r in rows:
        (held if is_holdout(r.key) else train).append(r)
    return train, held


def read_jsonl(path: Path) -> list[LengthRow]:
    """Rows of a JSONL file with ``prompt`` and ``output_tokens`` (``prompt_tokens``, ``kind``,
    ``model``, ``max_tokens`` optional; a missing token count is approximated without a tokenizer)."""
    rows: list[LengthRow] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            d = json.loads(line)
            if "prompt" not in d or "output_tokens" not in d:
                raise ValueError(f"{path}:{i + 1}: needs 'prompt' and 'output_tokens'")
            prompt = str(d["prompt"])
            tokens = d.get("prompt_tokens")
            cap = d.get("max_tokens")
            rows.append(
                LengthRow(
                    key=str(d.get("id", i)),
                    prompt=prompt,
                    prompt_tokens=int(tokens) if tokens is not None else approx_tokens(prompt),
                    output_tokens=int(d["output_tokens"]),
                    kind=str(d.get("kind", "")),
                    model=str(d.get("model", "")),
                    max_tokens=int(cap) if cap is not None else None,
                )
            )
    return rows


def fit_forest(
    x: F32,
    y: np.ndarray,
    *,
    n_trees: int,
    min_samples_leaf: int,
    seed: int,
    max_values_per_leaf: int = 64,
) -> ArrayForest:
    """Fit quantile-forest's RandomForestQuantileRegressor and flatten it.

    Every training row is placed in its leaf of every tree (Meinshausen's QRF, not only the bootstrap
    sample); a leaf with more rows keeps ``max_values_per_leaf`` evenly spaced order statistics of
    their lengths, which keeps the leaf's distribution and bounds the work per prediction.
    """
    from quantile_forest import RandomForestQuantileRegressor

    qrf = RandomForestQuantileRegressor(
        n_estimators=n_trees,
        min_samples_leaf=min_samples_leaf,
        max_features=0.3,
        random_state=seed,
        n_jobs=1,
    )
    qrf.fit(x, y)
    leaf_of = qrf.apply(x)  # (rows, trees), node ids local to each tree
    left, right, feature, threshold, roots = [], [], [], [], []
    leaf_start, leaf_count, values = [], [], []
    offset = 0
    n_values = 0
    depth = 0
    for t, est in enumerate(qrf.estimators_):
        tree = est.tree_
        n = tree.node_count
        is_leaf = tree.children_left < 0
        left.append(np.where(is_leaf, -1, tree.children_left + offset))
        right.append(np.where(is_leaf, -1, tree.children_right + offset))
        feature.append(np.where(is_leaf, -1, tree.feature))
        threshold.append(tree.threshold)
        roots.append(offset)
        depth = max(depth, int(tree.max_depth))
        order = np.lexsort((y, leaf_of[:, t]))
        counts = np.bincount(leaf_of[:, t], minlength=n)
        ends = np.cumsum(counts)
        kept: list[np.ndarray] = []
        stored = np.zeros(n, dtype=np.int64)
        for leaf in np.flatnonzero(counts):
            sorted_y = y[order[ends[leaf] - counts[leaf] : ends[leaf]]]
            if len(sorted_y) > max_values_per_leaf:  # keep evenly spaced order statistics
                pick = np.round(np.linspace(0, len(sorted_y) - 1, max_values_per_leaf)).astype(np.int64)
                sorted_y = sorted_y[pick]
            kept.append(sorted_y)
            stored[leaf] = len(sorted_y)
        starts = np.concatenate(([0], np.cumsum(stored)[:-1])) + n_values
        leaf_start.append(np.where(stored > 0, starts, 0))
        leaf_count.append(stored)
        values.append(np.concatenate(kept))
        n_values += int(stored.sum())
        offset += n
    return ArrayForest(
        left=np.concatenate(left).astype(np.int32),
        right=np.concatenate(right).astype(np.int32),
        feature=np.concatenate(feature).astype(np.int32),
        threshold=np.concatenate(threshold).astype(np.float64),
        roots=np.asarray(roots, dtype=np.int32),
        leaf_start=np.concatenate(leaf_start).astype(np.int32),
        leaf_count=np.concatenate(leaf_count).astype(np.int32),
        leaf_values=np.concatenate(values).astype(np.float32),
        max_depth=depth,
        marginal=np.sort(y).astype(np.float32),
    )


def training_matrix(
    rows: list[LengthRow], params: FeatureParams, text_free_copies: bool = True
) -> tuple[F32, np.ndarray]:
    """Features and lengths; with ``text_free_copies`` every row also appears without its text, so
    callers that only know token counts (the simulator) get bounds learnt for that case."""
    feats = [r.features for r in rows]
    y = [r.output_tokens for r in rows]
    if text_free_copies:
        feats += [RequestFeatures(r.prompt_tokens, None, r.kind, r.model) for r in rows]
        y += y
    return featurize(feats, params), np.asarray(y, dtype=np.float64)


def train_estimator(
    rows: list[LengthRow],
    *,
    n_trees: int = 50,
    min_samples_leaf: int = 8,
    seed: int = 0,
    features: FeatureParams | None = None,
    params: EstimatorParams | None = None,
    text_free_copies: bool = True,
) -> OutputBoundEstimator:
    """Fit a forest on ``rows`` and wrap it as an estimator (metadata says what it was trained on)."""
    fp = features or FeatureParams()
    x, y = training_matrix(rows, fp, text_free_copies)
    forest = fit_forest(x, y, n_trees=n_trees, min_samples_leaf=min_samples_leaf, seed=seed)
    meta = {
        "trained_rows": len(rows),
        "n_trees": n_trees,
        "min_samples_leaf": min_samples_leaf,
        "seed": seed,
        "max_values_per_leaf": 64,
        "text_free_copies": text_free_copies,
        "holdout": f"crc32(key) % {HOLDOUT_MODULUS} == 0 held back",
    }
    return OutputBoundEstimator(forest, fp, params, meta)
