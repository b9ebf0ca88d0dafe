"""Output-length bounds for the analyzer: the QRF predictor (``slo_core.predict``) or a light fallback.

The fallback bounds a request by the q-quantile of known output lengths above what it has generated
(the shipped ShareGPT lengths until it has observed ``min_observed`` completions here, then this
engine's own), capped by max_tokens. It learns online, so it is checkpointed every time (JSON); the
QRF artefact is written once (``.npz`` with its SHA-256, verified on load). A checkpointed predictor
in ``--state-dir`` is preferred over training or loading a fresh one.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import logging
from collections import deque
from pathlib import Path
from typing import Protocol

from slo_core import data

log = logging.getLogger(__name__)

QRF_FILE = "predictor.npz"
FALLBACK_FILE = "predictor.json"
FALLBACK_FORMAT = "slofleet-fallback-estimator/1"


class LengthEstimator(Protocol):
    """What the sidecar needs from a predictor (``slo_core.predict.OutputBoundEstimator`` fits)."""

    def bound(self, prompt_text: str | None, prompt_tokens: int, kind: str, max_tokens: int) -> int: ...

    def refine(  # noqa: PLR0917 - the predictor's signature
        self,
        bound_at_start: int,
        prompt_text: str | None,
        prompt_tokens: int,
        generated_tokens: int,
        generated_text: str | None,
        kind: str,
        max_tokens: int,
    ) -> int: ...


@functools.cache
def _shipped_lengths() -> tuple[int, ...]:
    with gzip.open(data.path("sharegpt_first_turn_5k.jsonl.gz"), "rt") as f:
        return tuple(sorted(int(json.loads(line)["output_tokens"]) for line in f if line.strip()))


class FallbackEstimator:
    """Quantile of known output lengths above the generated count (see the module docstring)."""

    learns_online = True
    cheap = True  # microseconds: called on the event loop
    reads_text = False  # refine() looks at the generated count only: the sidecar need not decode chunks
    checkpoint_name = FALLBACK_FILE

    def __init__(self, quantile: float = 0.9, min_observed: int = 50, window: int = 5000) -> None:
        self.quantile = quantile
        self.min_observed = min_observed
        self.observed: deque[int] = deque(maxlen=window)
        self._sorted: list[int] | None = None
        _shipped_lengths()  # load now, not on the first request

    def observe(self, output_tokens: int) -> None:
        """A request finished with ``output_tokens`` tokens (it did not hit max_tokens)."""
        self.observed.append(int(output_tokens))
        self._sorted = None

    def _lengths(self) -> list[int] | tuple[int, ...]:
        if len(self.observed) < self.min_observed:
            return _shipped_lengths()
        if self._sorted is None:
            self._sorted = sorted(self.observed)
        return self._sorted

    def _above(self, generated: int) -> int:
        lengths = self._lengths()
        start = bisect.bisect_right(lengths, generated)
        n = len(lengths) - start
        if n <= 0:
            return int(generated * 1.25) + 50
        return int(lengths[start + min(n - 1, int(self.quantile * n))])

    def bound(self, prompt_text: str | None, prompt_tokens: int, kind: str, max_tokens: int) -> int:
        return max(1, min(max_tokens, self._above(0)))

    def refine(  # noqa: PLR0917 - the predictor's signature
        self,
        bound_at_start: int,
        prompt_text: str | None,
        prompt_tokens: int,
        generated_tokens: int,
        generated_text: str | None,
        kind: str,
        max_tokens: int,
    ) -> int:
        value = max(bound_at_start, self._above(generated_tokens), generated_tokens + 1)
        return max(min(value, max_tokens), generated_tokens, 1)

    def save(self, path: Path) -> None:
        doc = {"format": FALLBACK_FORMAT, "quantile": self.quantile, "observed": list(self.observed)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> FallbackEstimator:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("format") != FALLBACK_FORMAT:
            raise ValueError(f"{path} is not a {FALLBACK_FORMAT} file")
        est = cls(quantile=float(doc["quantile"]))
        for n in doc["observed"]:
            est.observe(int(n))
        return est


def load_length_estimator(
    spec: str, state_dir: Path | None, expected_sha256: str | None = None
) -> tuple[LengthEstimator, str]:
    """``fallback``, ``shipped`` or an artefact path; a predictor checkpointed in ``state_dir`` wins.

    Returns the estimator and where it came from (for /health and the log).
    """
    if spec == "fallback":
        saved = state_dir / FALLBACK_FILE if state_dir is not None else None
        if saved is not None and saved.exists():
            try:
                return FallbackEstimator.load(saved), f"fallback, checkpoint {saved}"
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("predictor checkpoint %s unusable (%s); starting fresh", saved, exc)
        return FallbackEstimator(), "fallback"
    from slo_core.predict import load_estimator

    saved = state_dir / QRF_FILE if state_dir is not None else None
    if saved is not None and saved.exists() and spec == "shipped":
        try:
            return load_estimator(str(saved)), f"checkpoint {saved}"
        except Exception as exc:  # a corrupt checkpoint must not stop the sidecar: load the shipped one
            log.warning("predictor checkpoint %s unusable (%s); loading the shipped one", saved, exc)
    if expected_sha256 is not None and spec not in ("shipped", "fallback"):
        from slo_core.predict.estimator import OutputBoundEstimator

        return OutputBoundEstimator.load(
            Path(spec), expected_sha256
        ), f"{spec} (sha256 {expected_sha256[:12]})"
    try:
        return load_estimator(None if spec == "shipped" else spec), spec
    except Exception as exc:  # serving without the QRF beats not serving: say so loudly
        if spec != "shipped":
            raise
        log.error("the shipped QRF predictor is unusable (%s); bounding lengths with the fallback", exc)
        return FallbackEstimator(), f"fallback (shipped QRF unusable: {exc})"
