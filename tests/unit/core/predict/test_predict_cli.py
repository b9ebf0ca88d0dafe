"""``slofleet predictor train`` and ``eval`` end to end on small JSONL files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from slo_core.cli import main


def write_jsonl(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(n):
            long = i % 3 == 0
            prompt = "explain in depth how tides work" if long else "say hi"
            out = rng.randint(300, 700) if long else rng.randint(2, 12)
            fh.write(json.dumps({"prompt": prompt, "output_tokens": out}) + "\n")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    write_jsonl(d / "train.jsonl", 150, 0)
    out = d / "m.npz"
    rc = main(["predictor", "train", "--data", str(d / "train.jsonl"), "--out", str(out), "--trees", "5"])
    assert rc == 0
    return out


def test_train_writes_the_artefact_and_its_hash(model: Path) -> None:
    assert model.exists()
    assert len(model.with_name(model.name + ".sha256").read_text().split()[0]) == 64


def test_eval_prints_and_writes_every_figure(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, 90, 1)
    out = tmp_path / "figures.json"
    args = ["predictor", "eval", "--data", str(data), "--model", str(model), "--json", str(out)]
    assert main([*args, "--latency-repeats", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["rows"] == 90 and result["quantile"] == 0.95
    for method in ("qrf", "qrf_text_free", "mean_length", "max_tokens"):
        assert set(result[method]) == {"submission", "after_50", "after_200", "after_500"}
        for stage in result[method].values():
            assert {"n", "coverage", "median_ratio", "p90_ratio"} <= set(stage)
    assert result["max_tokens"]["submission"]["coverage"] == 1.0
    assert result["qrf"]["submission"]["coverage"] >= 0.85
    # tighter than the cap, and refined bounds still cover the requests that are still running
    assert result["qrf"]["submission"]["median_ratio"] < result["max_tokens"]["submission"]["median_ratio"]
    assert result["qrf"]["after_200"]["n"] == result["max_tokens"]["after_200"]["n"] > 0
    assert set(result["latency_ms_per_request"]) == {"batch_1", "batch_64"}
    printed = capsys.readouterr().out
    assert "coverage" in printed and "latency ms/request" in printed


def test_eval_rejects_a_file_without_the_needed_fields(model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "x"}) + "\n")
    assert main(["predictor", "eval", "--data", str(bad), "--model", str(model)]) == 2


def test_eval_refuses_an_unverified_model(model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.npz"
    copy.write_bytes(model.read_bytes())  # no .sha256 beside it
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, 5, 2)
    assert main(["predictor", "eval", "--data", str(data), "--model", str(copy)]) == 2
