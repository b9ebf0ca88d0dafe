"""``slofleet predictor train --from-history``: one verified artefact per model from sidecar checkpoints;
censored rows (hit max_tokens) left out; prompt text used only where the sidecar kept it (opt-in)."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest

from slo_core.predict import ArtefactError, load_estimator
from slo_core.predict.cli import register, safe_name
from slo_core.predict.history import history_rows


def _state(path: Path, rows: list[dict[str, object]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    doc = {"format": "slofleet-sidecar-state/1", "history": {"rows": rows, "total_rows": len(rows)}}
    (path / "state.json").write_text(json.dumps(doc))
    return path


def _rows(model: str, n: int, seed: int, scale: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for _ in range(n):
        p = rng.randint(5, 200)
        out.append(
            {
                "kind": "latency",
                "prompt_tokens": p,
                "output_tokens": scale * p + rng.randint(0, 10),
                "max_tokens": 4096,
                "model": model,
                "finish_reason": "stop",
            }
        )
    return out


def _run(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_one_verified_artefact_per_model(tmp_path: Path) -> None:
    a = _state(tmp_path / "pod-a", _rows("llama-8b", 150, 0, 1) + _rows("qwen/7b", 150, 1, 4))
    censored = [
        {**r, "output_tokens": 64, "max_tokens": 64, "finish_reason": "length"}
        for r in _rows("llama-8b", 50, 2, 1)
    ]
    b = _state(tmp_path / "pod-b", _rows("llama-8b", 100, 3, 1) + censored + [{"junk": 1}, "x"])  # type: ignore[list-item]
    by_model = history_rows([a, b / "state.json"])
    assert {m: len(r) for m, r in by_model.items()} == {"llama-8b": 250, "qwen/7b": 150}
    assert all(r.prompt == "" for rows in by_model.values() for r in rows)  # no text unless kept

    out = tmp_path / "out"
    code = _run(
        [
            "train",
            "--from-history",
            str(a),
            str(b),
            "--out",
            str(out),
            "--trees",
            "5",
            "--min-rows",
            "100",
            "--configmap",
        ]
    )
    assert code == 0
    llama = load_estimator(str(out / f"{safe_name('llama-8b')}.npz"))
    qwen = load_estimator(str(out / f"{safe_name('qwen/7b')}.npz"))
    assert llama.meta["model"] == "llama-8b" and qwen.meta["trained_from"] == "sidecar history"
    # each learned its own model's lengths: qwen answers ~4x the prompt, llama ~1x
    assert qwen.bound(None, 100, "latency", 4096) > 2 * llama.bound(None, 100, "latency", 4096)
    cm = json.loads((out / "qwen-7b.configmap.json").read_text())
    assert base64.b64decode(cm["binaryData"]["predictor.npz"]) == (out / "qwen-7b.npz").read_bytes()

    # a tampered artefact is refused (checksum-verified as the shipped one)
    path = out / "qwen-7b.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtefactError):
        load_estimator(str(path))


def test_too_few_rows_or_not_a_checkpoint(tmp_path: Path) -> None:
    a = _state(tmp_path / "a", _rows("m", 20, 0, 1))
    assert _run(["train", "--from-history", str(a), "--out", str(tmp_path / "o"), "--trees", "3"]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    assert _run(["train", "--from-history", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o")]) == 2


def test_prompt_text_is_used_when_the_operator_opted_in(tmp_path: Path) -> None:
    rows = [{**r, "prompt": "write an essay"} for r in _rows("m", 10, 0, 1)]
    by_model = history_rows([_state(tmp_path / "a", rows)])
    assert all(r.prompt == "write an essay" for r in by_model["m"])
