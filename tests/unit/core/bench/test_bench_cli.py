"""`slofleet bench` end to end: the table, JSON records, plots, and clear errors for bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo_core.cli import main

PROFILE = {
    "name": "test-h100",
    "gpu": "h100",
    "model": "test-8b",
    "tensor_parallel": 1,
    "t_c_ms": 5.0,
    "floor_ms": 2.0,
    "a_ms_per_token": 0.02,
    "b_ms_per_token_ctx": 5e-7,
    "d_ms_per_kv_token": 4e-5,
    "kv_cache_tokens": 200000,
    "max_model_len": 8192,
}


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(PROFILE))
    return p


@pytest.mark.slow
def test_bench_writes_a_table_json_records_and_plots(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    plots = tmp_path / "plots"
    argv = ["bench", "--rps", "1,3", "--duration", "15", "--replicas", "2", "--profile", str(profile_path)]
    argv += ["--policies", "fcfs,sarathi", "--router", "round-robin,min-load", "--json", str(out)]
    argv += ["--plots", str(plots), "--seed", "4"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert table.startswith("| policy | router | rps | token goodput |")
    records = json.loads(out.read_text())
    assert len(records) == 2 * 2 * 2
    assert {(r["policy"], r["router"], r["rps"]) for r in records} == {
        (p, rt, rps) for p in ("fcfs", "sarathi") for rt in ("round-robin", "min-load") for rps in (1.0, 3.0)
    }
    for r in records:
        for key in (
            "goodput_token",
            "goodput_request_ratio",
            "goodput_tempo",
            "goodput_tdg_per_s",
            "attainment",
            "ttft_p99_s",
            "tbt_p50_s",
            "e2e_p95_s",
            "queue_p95_s",
            "throughput_tokens_per_s",
            "preemptions",
            "jobs_offered",
            "seed",
            "goodput_over_time",
        ):
            assert key in r, key
        assert set(r["by_kind"]) == {"latency", "deadline", "compound"}
        assert set(r["by_priority"]) == {"high", "low"}
        assert r["jobs"] == r["jobs_offered"]
    # the identical workload for every policy and router at a load
    assert len({r["jobs_offered"] for r in records if r["rps"] == 3.0}) == 1
    assert sorted(p.name for p in plots.iterdir()) == [
        "attainment_by_kind.png",
        "goodput_over_time.png",
        "goodput_vs_load.png",
        "latency_cdf.png",
    ]


def test_policies_all_runs_every_registered_engine_policy(
    tmp_path: Path, profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slo_core.policies.registry import engine_policy_names

    out = tmp_path / "r.json"
    argv = ["bench", "--rps", "1", "--duration", "6", "--replicas", "1", "--profile", str(profile_path)]
    argv += ["--policies", "all", "--json", str(out), "--no-progress"]
    code = main(argv)
    records = json.loads(out.read_text())
    assert [r["policy"] for r in records] == engine_policy_names()
    assert code == (1 if any("error" in r for r in records) else 0)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--rps", "2,x"], "--rps"),
        (["--rps", "-1"], "--rps"),
        (["--policies", "fcfs,nope"], "unknown 'nope'"),
        (["--router", "nope"], "--router"),
        (["--mix", "1:1"], "--mix"),
        (["--duration", "0"], "--duration"),
        (["--replicas", "0"], "--replicas"),
        (["--trace", "no/such.csv"], "--trace"),
        (["--dags", "no/such.jsonl"], "--dags"),
        (["--profile", "no-such-profile"], "profile"),
        (["--gpu", "h100"], "--gpu and --model"),
        (["--high-share", "2"], "high_share"),
        (["--arrival", "poisson"], "needs --rps"),
    ],
)
def test_bad_option_values_are_a_clear_error_with_exit_2(
    option: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--no-progress", *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slofleet bench: error:") and message in err
