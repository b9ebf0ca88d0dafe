"""Request analyzer: output-length upper bounds (QRF) and compound-request pattern graphs (JITServe §4.1).

Stable API (the sidecar and the simulator call exactly this)::

    from slo_core.predict import BoundQuery, load_estimator

    est = load_estimator()            # shipped artefact (verified by SHA-256); path=... for your own
    b0 = est.bound(prompt_text, prompt_tokens, kind, max_tokens)                 # at submission
    b = est.refine(b0, prompt_text, prompt_tokens, generated_tokens, generated_text, kind, max_tokens)
    many = est.bounds([BoundQuery(prompt_text, prompt_tokens, kind, max_tokens), ...])

- ``load_estimator(path: str | None = None) -> OutputBoundEstimator``: ``None`` loads the shipped
  artefact ``slo_core/data/models/output_bound_qrf.npz``, or, if it is absent, trains a small forest
  from the shipped data (tens of seconds; needs the ``predictor`` extra). A file whose SHA-256 does
  not match the ``.sha256`` written beside it at training raises :class:`ArtefactError`, unparsed.
- ``bound(prompt_text, prompt_tokens, kind, max_tokens) -> int``: q-quantile (default 0.95) of the
  total output length, in [1, max_tokens]. ``prompt_text`` may be None (token count only).
- ``refine(bound_at_start, prompt_text, prompt_tokens, generated_tokens, generated_text, kind,
  max_tokens) -> int``: the bound at checkpoint g = 50·⌊generated/50⌋, conditioned on length > g
  (re-featurized with the generated text when given). Never below ``bound_at_start``, never below
  generated_tokens + 1 (or generated_tokens at the cap), never above max_tokens.
- ``bounds(batch: Sequence[BoundQuery]) -> list[int]``: many of either, in one forest pass.
- ``schedules(batch) -> list[BoundSchedule]``: every refinement at once (``schedule.at(g)`` equals the
  text-free ``refine`` at g); the simulator's fast path.

Compound requests (pattern graphs, ``slo_core.predict.compound.CompoundTracker``):
``stage_finished(program_id, Stage(ident, output_tokens, input_tokens, duration_s, calls))`` as stages
end, ``sub_deadline_at_s(program_id, next_ident, program_arrival_s, deadline_s)`` when one starts
(arrival + φ(s)·D, never after arrival + D; None without a matching pattern), ``finish(...)`` to store.

All calls are synchronous CPU work (≈ 0.1–1 ms per request); services run them off the event loop.
Serving needs only numpy; training needs quantile-forest (``slofleet predictor train``).
"""

from __future__ import annotations

from pathlib import Path

from slo_core.predict.artefact import ArtefactError
from slo_core.predict.estimator import BoundQuery, BoundSchedule, EstimatorParams, OutputBoundEstimator

__all__ = [
    "SHIPPED_ARTEFACT",
    "ArtefactError",
    "BoundQuery",
    "BoundSchedule",
    "EstimatorParams",
    "OutputBoundEstimator",
    "load_estimator",
]

SHIPPED_ARTEFACT = Path(__file__).resolve().parent.parent / "data" / "models" / "output_bound_qrf.npz"


def load_estimator(path: str | None = None) -> OutputBoundEstimator:
    """The estimator from ``path`` (verified), or the shipped one (trained on the fly if absent)."""
    if path is not None:
        return OutputBoundEstimator.load(Path(path))
    if SHIPPED_ARTEFACT.exists():
        return OutputBoundEstimator.load(SHIPPED_ARTEFACT)
    from slo_core.predict.training import shipped_rows, split, train_estimator

    train, _ = split(shipped_rows())
    return train_estimator(train, n_trees=20, min_samples_leaf=16)
