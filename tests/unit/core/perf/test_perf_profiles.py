"""Shipped performance profiles: loading by name or path, clear errors, and physically sane shapes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slo_core.perf import PerfProfile, list_profiles, load_profile
from slo_core.perf.profiles import PROFILES_DIR, profile_document

NAMES = [
    "a100-llama2-70b-tp4",
    "a100-llama3-8b-tp1",
    "h100-llama2-70b-tp4",
    "h100-llama2-70b-tp8",
    "h100-llama3-8b-tp1",
]


def test_every_required_profile_is_shipped() -> None:
    assert set(NAMES) <= set(list_profiles())


@pytest.mark.parametrize("name", NAMES)
def test_profile_loads_with_capacity_and_provenance(name: str) -> None:
    p = load_profile(name)
    assert isinstance(p, PerfProfile)
    assert p.name == name
    assert p.kv_cache_tokens > 100_000
    assert p.max_model_len in (4096, 8192)
    doc = profile_document(name)
    prov = doc["provenance"]
    assert prov["sources"] and prov["fitted_by"] == "bench/fit_perf.py"
    kv = prov["kv_cache"]
    usable = kv["gpu_memory_gib"] * 1024**3 * p.tensor_parallel * kv["gpu_memory_utilization"]
    assert p.kv_cache_tokens == int((usable - kv["weight_bytes"]) // kv["kv_bytes_per_token"])


def test_load_by_path(tmp_path: Path) -> None:
    target = tmp_path / "mine.json"
    shutil.copy(PROFILES_DIR / "h100-llama3-8b-tp1.json", target)
    assert load_profile(target) == load_profile("h100-llama3-8b-tp1")
    assert load_profile(str(target)) == load_profile("h100-llama3-8b-tp1")


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="h100-llama3-8b-tp1") as err:
        load_profile("h100-llama3-80b")
    assert "valid names" in str(err.value)


def test_missing_path_and_bad_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "t_c_ms": 1.0}))
    with pytest.raises(ValueError, match="lacks field"):
        load_profile(bad)
    neg = tmp_path / "neg.json"
    doc = profile_document("h100-llama3-8b-tp1") | {"a_ms_per_token": -1.0}
    neg.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="non-negative"):
        load_profile(neg)


def _decode_s(p: PerfProfile, batch: int, kv: int) -> float:
    return p.iteration_time_s([], [kv] * batch)


def _prefill_s(p: PerfProfile, tokens: int) -> float:
    return p.iteration_time_s([(tokens, tokens)], [])


def test_h100_is_faster_than_a100_for_the_same_model() -> None:
    for small, big in (
        ("h100-llama3-8b-tp1", "a100-llama3-8b-tp1"),
        ("h100-llama2-70b-tp4", "a100-llama2-70b-tp4"),
    ):
        h, a = load_profile(small), load_profile(big)
        assert _prefill_s(h, 2048) < _prefill_s(a, 2048)
        assert _decode_s(h, 32, 1024) < _decode_s(a, 32, 1024)


@pytest.mark.parametrize("name", NAMES)
def test_time_grows_with_work(name: str) -> None:
    p = load_profile(name)
    assert _prefill_s(p, 256) < _prefill_s(p, 1024) < _prefill_s(p, 4096)
    assert _decode_s(p, 8, 512) <= _decode_s(p, 64, 512) < _decode_s(p, 64, 4096)
    # an 8B decode step on one GPU takes milliseconds, a 70B one tens of milliseconds
    lo, hi = (0.004, 0.02) if "8b" in name else (0.015, 0.08)
    assert lo < _decode_s(p, 1, 512) < hi


def test_shapes_match_the_published_model_sizes() -> None:
    from slo_core.perf.shapes import LLAMA2_70B, LLAMA3_8B, kv_capacity

    assert LLAMA3_8B.params() == pytest.approx(8.03e9, rel=0.005)
    assert LLAMA2_70B.params() == pytest.approx(68.98e9, rel=0.005)
    assert LLAMA3_8B.kv_bytes_per_token() == 128 * 1024  # 32 layers × 8 KV heads × 128 × K,V × bf16
    assert LLAMA2_70B.kv_bytes_per_token() == 320 * 1024
    tp4, _ = kv_capacity(LLAMA2_70B, "h100", 4)
    tp8, _ = kv_capacity(LLAMA2_70B, "h100", 8)
    assert tp8 > 2 * tp4  # the weights' share shrinks as the cache grows
    assert load_profile("h100-llama2-70b-tp8").kv_cache_tokens == tp8


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h100/llama-3-8b", "h100-llama3-8b-tp1"),
        ("H100-Llama-3-8B", "h100-llama3-8b-tp1"),
        ("a100/llama-2-70b-tp4", "a100-llama2-70b-tp4"),
        ("h100-llama2-70b-tp8", "h100-llama2-70b-tp8"),
    ],
)
def test_aliases_resolve_to_shipped_profiles(alias: str, name: str) -> None:
    assert load_profile(alias).name == name


def test_unknown_alias_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="valid names"):
        load_profile("h100/llama-2-70b")  # no TP1 70B profile
