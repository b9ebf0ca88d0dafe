"""Fixtures for tests that run a real vLLM (CPU build) in its own virtual environment (.venv-vllm).

These tests are marked ``vllm``; scripts/test.sh runs them with .venv-vllm's interpreter. Under any
other interpreter (without vllm) the modules skip themselves at import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build

    cache = os.environ.get("SLOFLEET_TINY_MODEL_DIR")
    target = Path(cache) if cache else tmp_path_factory.mktemp("tiny-llama")
    return build(target)


@pytest.fixture
def vllm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A per-test temp/cache folder so vLLM leaves no sockets or caches behind."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    yield tmp_path
