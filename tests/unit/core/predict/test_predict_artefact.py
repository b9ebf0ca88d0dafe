"""The length-forest artefact loads only when its bytes match the SHA-256 recorded at training."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from slo_core.predict import ArtefactError, OutputBoundEstimator, load_estimator
from slo_core.predict.training import LengthRow, train_estimator


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [LengthRow(str(i), f"question {i % 7}", 3 + i % 7, 10 + 13 * (i % 7)) for i in range(120)]
    est = train_estimator(rows, n_trees=4, min_samples_leaf=3)
    path = tmp_path_factory.mktemp("model") / "qrf.npz"
    est.save(path)
    return path


def test_round_trip_gives_identical_bounds(saved: Path) -> None:
    a = OutputBoundEstimator.load(saved)
    b = load_estimator(str(saved))
    for i in range(7):
        assert a.bound(f"question {i}", 3 + i, "", 4096) == b.bound(f"question {i}", 3 + i, "", 4096)
    recorded = saved.with_name(saved.name + ".sha256").read_text().split()[0]
    assert recorded == hashlib.sha256(saved.read_bytes()).hexdigest()


def test_a_tampered_artefact_is_refused(saved: Path, tmp_path: Path) -> None:
    bad = tmp_path / "qrf.npz"
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    (tmp_path / "qrf.npz.sha256").write_text(saved.with_name(saved.name + ".sha256").read_text())
    with pytest.raises(ArtefactError, match="does not match"):
        load_estimator(str(bad))


def test_an_artefact_without_its_hash_is_refused(saved: Path, tmp_path: Path) -> None:
    lone = tmp_path / "lone.npz"
    lone.write_bytes(saved.read_bytes())
    with pytest.raises(ArtefactError, match="no valid hash"):
        load_estimator(str(lone))


def test_pickled_content_is_never_unpickled_even_with_a_matching_hash(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.savez(buf, left=np.array([object()], dtype=object))  # an object array needs pickle to load
    path = tmp_path / "evil.npz"
    path.write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (tmp_path / "evil.npz.sha256").write_text(f"{digest}  evil.npz\n")
    with pytest.raises(ArtefactError, match="not a readable artefact"):
        load_estimator(str(path))
