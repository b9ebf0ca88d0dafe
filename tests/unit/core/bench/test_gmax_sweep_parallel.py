"""bench/gmax_sweep.py: runs spread over processes give a serial run's records, and a sweep resumes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from repo_paths import ROOT, load_script


def _sweep() -> ModuleType:
    return load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")


def _args(out: Path, workers: int) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out),
        families="conv",
        replicas="1",
        rps="6,14",
        seeds="0",
        duration=5.0,
        policies="fcfs,tempo",
        router="round-robin",
        objective="token,request",
        workers=workers,
        no_progress=True,
    )


def _records(out: Path) -> dict[str, list[dict[str, Any]]]:
    files = {}
    for path in sorted(out.glob("records-*.json")):
        rows = json.loads(path.read_text(encoding="utf-8"))
        files[path.name] = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    return files


def _runs(out: Path) -> list[dict[str, Any]]:
    lines = (out / "timing.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "run"]


@pytest.mark.slow
def test_parallel_sweep_equals_serial_and_resumes(tmp_path: Path) -> None:
    sweep = _sweep()
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    assert sweep.run(_args(serial, 1)) == 0
    assert sweep.run(_args(parallel, 2)) == 0
    got = _records(parallel)
    assert got == _records(serial)
    assert sorted(got) == ["records-conv-r1-s0-request.json", "records-conv-r1-s0-token.json"]
    # fcfs does not read the objective: one run serves both files; tempo runs once per objective
    assert len(_runs(serial)) == 2 * (1 + 2)
    # each invocation says which host made its records (they differ between hosts at overload)
    starts = [json.loads(ln) for ln in (serial / "timing.jsonl").read_text(encoding="utf-8").splitlines()]
    host = next(e["host"] for e in starts if e["event"] == "start")
    assert host["numpy"] == np.__version__ and host["cpus"] == os.cpu_count() and host["python"]
    for name, objective in (("token", "token"), ("request", "request")):
        rows = got[f"records-conv-r1-s0-{name}.json"]
        assert sorted((r["policy"], r["rps"]) for r in rows) == [
            ("fcfs", 6.0),
            ("fcfs", 14.0),
            ("tempo", 6.0),
            ("tempo", 14.0),
        ]
        assert all(r["objective"] == objective and "error" not in r for r in rows)
    # drop one record: a second invocation runs only that one and ends with the same records
    path = parallel / "records-conv-r1-s0-request.json"
    rows = json.loads(path.read_text(encoding="utf-8"))
    kept = [r for r in rows if r["policy"] != "tempo" or r["rps"] != 14.0]
    path.write_text(json.dumps(kept), encoding="utf-8")
    before = len(_runs(parallel))
    assert sweep.run(_args(parallel, 2)) == 0
    again = _runs(parallel)[before:]
    assert [(e["policy"], e["rps"], e["objectives"]) for e in again] == [("tempo", 14.0, ["request"])]
    assert _records(parallel) == _records(serial)


def test_objectives_that_set_the_same_parameters_share_a_run() -> None:
    sweep = _sweep()
    both = ("token", "request")
    assert sweep.objective_groups("fcfs", both) == [both]
    assert sweep.objective_groups("slide-batching", both) == [both]  # TDG weights 1/1 under either
    assert sweep.objective_groups("gmax", both) == [("token",), ("request",)]
    assert sweep.objective_groups("tempo", both) == [("token",), ("request",)]


@pytest.mark.slow
def test_a_shared_run_is_what_each_objective_alone_would_have_recorded() -> None:
    """The premise of sharing: every registered policy that the sweep runs once for token and request
    goodput schedules exactly alike under each (a short overloaded run, compared record for record)."""
    from slo_core.bench.runner import run_one_timed
    from slo_core.policies.registry import engine_policy_names

    sweep = _sweep()
    shared = [p for p in engine_policy_names() if len(sweep.objective_groups(p, ("token", "request"))) == 1]
    assert "slide-batching" in shared and "fcfs" in shared
    for policy in shared:
        records = []
        for objective in ("token", "request"):
            task = sweep.Task("conv", 1, 0, 9.0, policy, (objective,), 8.0, "round-robin")
            record, _ = run_one_timed(task.config(), (policy, "round-robin", 9.0))
            assert "error" not in record, record
            records.append(
                {k: v for k, v in record.items() if k not in ("objective", "sweep_fingerprint", "wall_s")}
            )
        assert records[0] == records[1], policy


def test_tables_join_folders_and_count_each_run_once(tmp_path: Path) -> None:
    """``tables --also``: runs from several folders, a run recorded twice taken from the first folder."""
    mod = _sweep()

    def rec(policy: str, seed: int, value: float) -> dict[str, Any]:
        return {
            "family": "conv",
            "replicas": 4,
            "rps": 20.5,
            "objective": "token",
            "policy": policy,
            "seed": seed,
            "goodput_token_ratio": value,
        }

    newer, older = tmp_path / "newer", tmp_path / "older"
    newer.mkdir()
    older.mkdir()
    (newer / "records-conv-r4-s2-token.json").write_text(json.dumps([rec("gmax", 2, 0.9)]))
    (newer / "records-conv-r4-s0-token.json").write_text(json.dumps([rec("gmax", 0, 0.7)]))
    (older / "records-conv-r4-s0-token.json").write_text(
        json.dumps([rec("gmax", 0, 0.1), rec("fcfs", 0, 0.3), {**rec("tempo", 0, 0.2), "error": "boom"}])
    )
    got = mod.table_records([newer, older])
    assert sorted((r["policy"], r["seed"], r["goodput_token_ratio"]) for r in got) == [
        ("fcfs", 0, 0.3),
        ("gmax", 0, 0.7),  # the first folder's record of the run, not the older one's
        ("gmax", 2, 0.9),
    ]
    assert [r["policy"] for r in mod.table_records([older, newer]) if r["seed"] == 0] == ["gmax", "fcfs"]
    assert [r["goodput_token_ratio"] for r in mod.table_records([older, newer]) if r["policy"] == "gmax"] == [
        0.1,
        0.9,
    ]
    # a re-sweep of gmax in `newer`: no gmax record from `older`, other policies' still
    got = mod.table_records([newer, older], frozenset({"gmax"}))
    assert sorted((r["policy"], r["seed"], r["goodput_token_ratio"]) for r in got) == [
        ("fcfs", 0, 0.3),
        ("gmax", 0, 0.7),
        ("gmax", 2, 0.9),
    ]
    assert [r["policy"] for r in mod.table_records([older, newer], frozenset({"gmax"}))] == ["gmax", "fcfs"]


def test_numerics_labels_hosts_and_disabled_kernels() -> None:
    mod = _sweep()
    avx512 = {"machine": "x86_64", "simd": ["AVX", "AVX2", "AVX512F", "AVX512_SKX"], "numpy_disabled": None}
    assert mod.numerics(avx512) == "numpy AVX-512"
    assert mod.numerics({**avx512, "numpy_disabled": "X86_V4"}) == "C library"
    assert mod.numerics({**avx512, "numpy_disabled": "AVX512_ICL"}) == "numpy AVX-512"  # SKX kernels stay
    assert mod.numerics({"machine": "x86_64", "simd": ["AVX", "AVX2"]}) == "C library"
    assert mod.numerics({"machine": "aarch64", "simd": []}) == "aarch64 numpy"
    assert mod.numerics(None) == "unrecorded"
    assert mod.numerics({**avx512, "policy_exp_log": "slo_core.detmath"}) == "detmath (any host)"
    assert mod.numerics(mod.host()) == "detmath (any host)"


_EXP_CHECK = """
import importlib.util, json, math, sys
import numpy as np
spec = importlib.util.spec_from_file_location("s", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["s"] = mod
spec.loader.exec_module(mod)
x = np.random.default_rng(0).uniform(-30.0, 30.0, 100_000)
libm = np.array([math.exp(v) for v in x.tolist()])
logs = np.array([math.log(v) for v in np.abs(x).tolist()])
h = mod.host()
h.pop("policy_exp_log")  # numpy's own kernels, which the label described before detmath
print(json.dumps({"label": mod.numerics(h),
                  "same": bool(np.array_equal(np.exp(x), libm) and np.array_equal(np.log(np.abs(x)), logs))}))
"""


@pytest.mark.parametrize("disabled", [None, "X86_V4"])
def test_a_host_labelled_c_library_computes_exp_and_log_as_the_c_library_does(disabled: str | None) -> None:
    """What the label promises: records labelled "C library" were made with numpy's exp/log equal, bit
    for bit, to the C library's (on an AVX-512 host, NPY_DISABLE_CPU_FEATURES=X86_V4 gives that:
    bench/README.md); numpy's AVX-512 kernels differ from it on some of these inputs."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    if disabled:
        env["NPY_DISABLE_CPU_FEATURES"] = disabled
    got = json.loads(
        subprocess.run(
            [sys.executable, "-c", _EXP_CHECK, str(ROOT / "bench" / "gmax_sweep.py")],
            env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "core"), str(ROOT / "lab")])},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    if got["label"] == "C library":
        assert got["same"]
    else:
        assert got["label"] == "numpy AVX-512" and not disabled
        assert not got["same"]


def test_table_records_say_which_numerics_made_each_record(tmp_path: Path) -> None:
    mod = _sweep()
    avx512 = {"machine": "x86_64", "simd": ["AVX2", "AVX512F"], "numpy_disabled": None}
    rec = {"family": "tot", "replicas": 1, "rps": 6.5, "seed": 0, "goodput_token_ratio": 0.5}
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "records-tot-r1-s0-token.json").write_text(
        json.dumps(
            [{**rec, "policy": "gmax", "objective": "token"}, {**rec, "policy": "fcfs", "objective": "token"}]
        )
    )
    (out / "records-tot-r1-s0-request.json").write_text(
        json.dumps([{**rec, "policy": "gmax", "objective": "request"}])
    )
    lines = [
        {"event": "start", "host": avx512},
        {
            "event": "run",
            "file": "records-tot-r1-s0-token.json",
            "policy": "gmax",
            "rps": 6.5,
            "objectives": ["token", "request"],
            "error": None,
        },
        {"event": "start", "host": {**avx512, "numpy_disabled": "X86_V4"}},
        {
            "event": "run",
            "file": "records-tot-r1-s0-token.json",
            "policy": "gmax",
            "rps": 6.5,
            "objectives": ["token"],
            "error": None,
        },
        {
            "event": "run",
            "file": "records-tot-r1-s0-request.json",
            "policy": "gmax",
            "rps": 6.5,
            "objectives": ["request"],
            "error": "boom",
        },
    ]
    (out / "timing.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    got = {(r["policy"], r["objective"]): r["numerics"] for r in mod.table_records([out])}
    # the token record was re-made with the C library's; the failed request re-run did not replace it
    assert got == {
        ("gmax", "token"): "C library",
        ("gmax", "request"): "numpy AVX-512",
        ("fcfs", "token"): "unrecorded",
    }


def _point(objective: str = "request", **by_policy: list[float]) -> dict[str, dict[int, dict[str, Any]]]:
    """policy → seed → a record with the objective's ratio (and 100 jobs' worth of counts)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for policy, xs in by_policy.items():
        pol = policy.replace("_", "-")
        out[pol] = {
            s: {
                f"goodput_{objective}_ratio": x,
                f"goodput_{objective}": 100.0 * x,
                "by_kind": {"latency": {"attainment": 1.0}},
            }
            for s, x in enumerate(xs)
        }
    return out


def test_a_point_gmax_wins_everywhere_misses_nothing() -> None:
    mod = _sweep()
    point = _point(
        gmax=[0.9, 0.92, 0.91], gmax_oracle=[0.9, 0.9, 0.9], fcfs=[0.4, 0.41, 0.39], sarathi=[0.3] * 3
    )
    assert mod.point_misses(point, "request", 1.0) == []


def test_misses_say_by_how_much_per_seed_and_why() -> None:
    mod = _sweep()
    # the envelope (edf) is ahead by one request in one seed of three: the seeds cannot tell them apart
    tie = _point(
        gmax=[0.99, 1.0, 0.98],
        edf=[0.99, 1.0, 0.99],
        gmax_oracle=[0.99] * 3,
        fcfs=[0.45] * 3,
        sarathi=[0.3] * 3,
    )
    (miss,) = mod.point_misses(tie, "request", 1.0)
    assert (miss.criterion, miss.against, miss.why) == ("≥ 1.0x the envelope", "edf (envelope)", "seed noise")
    assert miss.value == pytest.approx((0.99 + 1.0 + 0.98) / (0.99 + 1.0 + 0.99))
    assert miss.per_seed == pytest.approx((1.0, 1.0, 0.98 / 0.99))
    assert miss.gap_units == "0.3 requests a run"
    assert "met in 2 of 3 seeds" in miss.detail
    # behind in every seed, by more than the seeds' spread: real
    behind = _point(
        gmax=[0.80, 0.81, 0.82], strict_priority=[0.90, 0.91, 0.92], gmax_oracle=[0.8] * 3, fcfs=[0.4] * 3
    )
    (miss,) = mod.point_misses(behind, "request", 1.0)
    assert (miss.against, miss.why) == ("strict-priority (envelope)", "real")
    # below 0.95x the oracle, and a latency tier below FCFS's
    oracle = _point(gmax=[0.80, 0.80, 0.80], gmax_oracle=[0.9, 0.9, 0.9], fcfs=[0.3] * 3)
    oracle["gmax"][1]["by_kind"]["latency"]["attainment"] = 0.5
    oracle["gmax"][2]["by_kind"]["latency"]["attainment"] = 0.5
    got = {m.criterion: m for m in mod.point_misses(oracle, "request", 1.0)}
    assert set(got) == {"≥ 0.95x its oracle", "latency-tier attainment ≥ FCFS's"}
    assert got["≥ 0.95x its oracle"].why == "real"
    assert got["latency-tier attainment ≥ FCFS's"].value == pytest.approx(-1.0 / 3)
    assert got["latency-tier attainment ≥ FCFS's"].per_seed == pytest.approx((0.0, -0.5, -0.5))


def test_a_target_above_the_ideal_or_the_bound_is_unreachable() -> None:
    mod = _sweep()
    point = _point(gmax=[0.9, 0.9, 0.9], fcfs=[0.6, 0.55, 0.65], sarathi=[0.46, 0.46, 0.46])
    got = {m.against: m for m in mod.point_misses(point, "request", 1.0)}
    assert got["fcfs"].why == "unreachable"
    assert got["fcfs"].detail == "2x fcfs = 1.2000 > 1.0000 (the instant-service ideal)"
    # 2x Sarathi = 0.92 is under the ideal, but over an offline bound of 0.85
    assert got["sarathi"].why != "unreachable"
    got = {m.against: m for m in mod.point_misses(point, "request", 0.85)}
    assert got["sarathi"].why == "unreachable"
    assert got["sarathi"].detail.endswith("(the offline bound)")
    # no records of a reference policy: its criterion is not judged
    assert {m.against for m in mod.point_misses(_point(gmax=[0.5], fcfs=[0.2]), "request", None)} == set()


def test_misses_section_counts_every_miss_by_its_reason() -> None:
    mod = _sweep()
    point = _point(gmax=[0.9, 0.9, 0.9], fcfs=[0.6, 0.55, 0.65], edf=[0.95, 0.96, 0.97])
    misses = mod.point_misses(point, "request", 1.0)
    lines = mod.misses_section([("conv x1 5 req/s request", "overload", misses)], judged=3)
    text = "\n".join(lines)
    assert "Criteria judged: 3" in text
    assert "missed: 2 (1 real, 1 unreachable)" in text
    assert sum(1 for line in lines if line.startswith("| conv x1 5 req/s request | overload |")) == 2
