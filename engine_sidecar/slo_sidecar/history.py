"""The history of finished requests (predictor training rows, program pattern graphs) and its checkpoints.

A checkpoint is one JSON file (``state.json`` in ``--state-dir``) written atomically (temporary file,
fsync, rename) plus the predictor artefact beside it (``predictor.npz``, SHA-256 verified on load).
It also lists the requests in flight at checkpoint time, so that a restart after a crash reports how
many accepted requests the dead process may have lost instead of losing them silently.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slo_core.predict.pattern_store import PatternHistory
from slo_sidecar.analyzer import patterns_from_json, patterns_to_json

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
FORMAT = "slofleet-sidecar-state/1"


class History:
    """Bounded record of finished requests and completed programs (newest kept)."""

    def __init__(self, max_rows: int = 20000) -> None:
        self.rows: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self.patterns = PatternHistory()  # completed programs' graphs (core's store, bounded by its capacity)
        self.total_rows = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.total_rows += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
            "total_rows": self.total_rows,
            "patterns": patterns_to_json(self.patterns),
        }

    def load_json(self, raw: dict[str, Any]) -> None:
        rows = raw.get("rows", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("history.rows must be a list of objects")
        self.rows.clear()
        self.rows.extend(rows)
        self.total_rows = int(raw.get("total_rows", len(rows)))
        patterns = raw.get("patterns", [])
        if not isinstance(patterns, list):
            raise ValueError("history.patterns must be a list")
        self.patterns = PatternHistory(self.patterns.params)
        patterns_from_json(patterns, self.patterns)


def write_state(state_dir: Path, history: History, in_flight: Iterable[str], extra: dict[str, Any]) -> Path:
    """Atomically write the checkpoint; returns its path."""
    state_dir.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "history": history.to_json(), "in_flight": sorted(in_flight), **extra}
    fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".json", dir=state_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        target = state_dir / STATE_FILE
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_state(state_dir: Path, history: History) -> dict[str, Any] | None:
    """Restore the history from ``state_dir``; returns the checkpoint's other fields, None when absent.

    A corrupt checkpoint is moved aside (``state.json.corrupt``) and reported, never half-loaded.
    """
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        fresh = History(history.rows.maxlen or 20000)
        fresh.load_json(doc["history"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        aside = path.with_suffix(".json.corrupt")
        os.replace(path, aside)
        log.error(
            "checkpoint %s is unusable (%s); moved to %s, starting with an empty history",
            path,
            exc,
            aside.name,
        )
        return None
    history.rows.clear()
    history.rows.extend(fresh.rows)
    history.total_rows = fresh.total_rows
    for i in range(len(fresh.patterns)):
        history.patterns.add(fresh.patterns.graph(i))
    return {k: v for k, v in doc.items() if k not in ("history", "format")}
