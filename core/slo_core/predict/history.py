"""Training rows from the sidecars' served history (``slofleet predictor train --from-history``).

A sidecar checkpoint (``state.json`` in its ``--state-dir``, format ``slofleet-sidecar-state/1``)
holds the last completed requests: prompt tokens, output tokens, request kind, model, finish reason,
max_tokens — and the prompt text only where the operator opted in (``--history-prompt-text``). Rows
that ended at their max_tokens (finish reason ``length``) are censored — their true length is unknown —
and are left out; so are rows without a positive length. Rows are grouped by model: one artefact each.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from pathlib import Path

from slo_core.predict.training import LengthRow

STATE_FORMAT = "slofleet-sidecar-state/1"
STATE_FILE = "state.json"
CONFIGMAP_LIMIT_BYTES = 1_000_000  # the API server refuses larger ConfigMaps (1 MiB with overhead)


def _state_files(paths: Iterable[Path]) -> list[Path]:
    out = []
    for p in paths:
        out.append(p / STATE_FILE if p.is_dir() else p)
    return out


def history_rows(paths: Iterable[Path]) -> dict[str, list[LengthRow]]:
    """Usable rows of every checkpoint, by model id (raises ValueError on a file that is not one)."""
    by_model: dict[str, list[LengthRow]] = {}
    for path in _state_files(paths):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"{path}: not a sidecar checkpoint ({STATE_FORMAT})")
        rows = (doc.get("history") or {}).get("rows") or []
        if not isinstance(rows, list):
            raise ValueError(f"{path}: history.rows is not a list")
        for i, r in enumerate(rows):
            row = _row(r, f"{path.name}:{i}")
            if row is not None:
                by_model.setdefault(row.model, []).append(row)
    return by_model


def _row(r: object, key: str) -> LengthRow | None:
    if not isinstance(r, dict):
        return None
    try:
        out = int(r["output_tokens"])
        prompt_tokens = int(r["prompt_tokens"])
        cap = int(r["max_tokens"]) if r.get("max_tokens") is not None else None
    except (KeyError, TypeError, ValueError):
        return None
    reason = r.get("finish_reason")
    if (
        out < 1
        or prompt_tokens < 0
        or reason == "length"
        or (reason is None and cap is not None and out >= cap)
    ):
        return None
    prompt = r.get("prompt")
    return LengthRow(
        key=key,
        prompt=prompt if isinstance(prompt, str) else "",
        prompt_tokens=prompt_tokens,
        output_tokens=out,
        kind=str(r.get("kind") or ""),
        model=str(r.get("model") or ""),
        max_tokens=cap,
    )


def write_configmap(artefact: Path, digest: str, name: str) -> Path:
    """A ConfigMap manifest carrying the artefact and its hash file (``binaryData``), beside it.

    Raises ValueError when the artefact is too large for a ConfigMap (use a volume instead).
    """
    data = artefact.read_bytes()
    if len(data) > CONFIGMAP_LIMIT_BYTES:
        raise ValueError(
            f"{artefact} is {len(data)} bytes: too large for a ConfigMap; train fewer trees or mount a volume"
        )
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "slofleet"}},
        "binaryData": {
            "predictor.npz": base64.b64encode(data).decode("ascii"),
            "predictor.npz.sha256": base64.b64encode(f"{digest}  predictor.npz\n".encode()).decode("ascii"),
        },
    }
    out = artefact.with_suffix(".configmap.json")
    out.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return out
