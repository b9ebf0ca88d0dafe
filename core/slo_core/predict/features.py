"""Request features for the output-length forest: counts, hashed word n-grams, kind and model id.

Everything here is stateless (a hashing trick over CRC-32 word hashes, bigrams combined from the
two word hashes; no fitted vocabulary), so an artefact only records the feature parameters and the
same request always maps to the same vector. It needs numpy only, so serving needs no scikit-learn.
Prompt token counts come from the caller; :func:`approx_tokens` is a tokenizer-free stand-in.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from slo_core import detmath

F32 = npt.NDArray[np.float32]

# Request kinds (slo_core.slo.RequestKind values) get a one-hot column each; anything else none.
KINDS: tuple[str, ...] = ("latency", "deadline", "compound", "best-effort")
_WORD = re.compile(r"\w+|[^\w\s]")
_NO_DIGITS = str.maketrans("", "", "0123456789")


class FeatureParams(BaseModel):
    """How a request becomes a feature vector (recorded in every artefact)."""

    ngram_features: int = Field(256, ge=8, le=4096, description="hashed word 1-2 gram buckets (count)")
    model_buckets: int = Field(8, ge=1, le=256, description="hashed model-id buckets (count)")
    text_chars: int = Field(4000, ge=100, description="characters of text hashed per request (chars)")


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the forest sees of one request (text optional: the simulator has none)."""

    prompt_tokens: int
    text: str | None = None
    kind: str = ""
    model: str = ""


def n_features(p: FeatureParams) -> int:
    return 6 + len(KINDS) + p.model_buckets + p.ngram_features


def _bucket(token: str, n: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % n


@functools.lru_cache(maxsize=1 << 16)
def _word_hash(word: str) -> int:
    return zlib.crc32(word.encode("utf-8"))


def _text_stats(text: str) -> tuple[float, float, float]:
    n = max(1, len(text))
    lines = float(text.count("\n") + 1)
    questions = float(text.count("?"))
    digits = (len(text) - len(text.translate(_NO_DIGITS))) / n
    return lines, questions, digits


def featurize(requests: Sequence[RequestFeatures], p: FeatureParams) -> F32:
    """Dense float32 matrix (rows = requests) of the features described in the module docstring."""
    width = n_features(p)
    out = np.zeros((len(requests), width), dtype=np.float32)
    kind_at = {k: 6 + i for i, k in enumerate(KINDS)}
    model_at = 6 + len(KINDS)
    gram_at = model_at + p.model_buckets
    for row, r in enumerate(requests):
        tokens = max(1, int(r.prompt_tokens))
        out[row, 0] = detmath.log1p_f(tokens)
        out[row, 1] = 1.0 if r.text is not None else 0.0
        if r.text:
            text = r.text[: p.text_chars]
            out[row, 2] = detmath.log1p_f(len(r.text))
            out[row, 3:6] = _text_stats(text)
            h = np.fromiter(map(_word_hash, _WORD.findall(text.lower())), dtype=np.uint64)
            if len(h):
                # unigram buckets, then bigram buckets from the two words' hashes (no string joins)
                pair = (h[:-1] * np.uint64(1_000_003)) ^ h[1:]
                idx = np.concatenate((h, pair)) % np.uint64(p.ngram_features)
                counts = np.bincount(idx.astype(np.int64), minlength=p.ngram_features).astype(np.float32)
                out[row, gram_at:] = counts / float(np.linalg.norm(counts))
        column = kind_at.get(r.kind)
        if column is not None:
            out[row, column] = 1.0
        if r.model:
            out[row, model_at + _bucket(r.model, p.model_buckets)] = 1.0
    return out
