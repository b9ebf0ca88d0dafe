"""Workloads: seeded reproducibility, rate scaling, kind mix, SLOs, priorities, trace and DAG files."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from slo_core.slo import RequestKind
from slo_core.workloads import (
    WorkloadSpec,
    build_workload,
    deep_research_dag,
    load_trace,
    parse_mix,
    read_dags_jsonl,
    read_trace,
    tot_dags,
)


def test_the_same_seed_builds_the_same_jobs_and_another_seed_does_not() -> None:
    spec = WorkloadSpec(rps=5.0, duration_s=60.0, seed=7)
    assert build_workload(spec) == build_workload(spec)
    assert build_workload(spec) != build_workload(spec.model_copy(update={"seed": 8}))


@pytest.mark.parametrize("arrival", ["trace", "poisson"])
def test_arrivals_are_scaled_to_the_target_rate(arrival: str) -> None:
    jobs = build_workload(WorkloadSpec(rps=20.0, duration_s=300.0, arrival=arrival))  # type: ignore[arg-type]
    assert len(jobs) == pytest.approx(6000, rel=0.1)
    times = [j.arrival_s for j in jobs]
    assert times == sorted(times) and times[0] >= 0.0 and times[-1] < 300.0


def test_trace_replay_keeps_the_trace_lengths_and_repeats_a_short_trace() -> None:
    trace = load_trace("azure-code-2023")
    jobs = build_workload(WorkloadSpec(trace="azure-code-2023", mix=(1, 0, 0), duration_s=8000.0))
    assert len(jobs) > len(trace)  # 8000 s of a ~57 min trace: replayed twice and a bit
    assert [j.prompt_tokens for j in jobs[:50]] == trace.input_tokens[:50].tolist()
    assert [j.output_tokens for j in jobs[:50]] == trace.output_tokens[:50].tolist()


def test_kinds_follow_the_mix_and_slos_scale() -> None:
    jobs = build_workload(WorkloadSpec(rps=20.0, duration_s=300.0, mix=parse_mix("2:1:1"), slo_scale=1.5))
    kinds = Counter(j.slo.kind for j in jobs)
    assert kinds[RequestKind.LATENCY] / len(jobs) == pytest.approx(0.5, abs=0.03)
    assert kinds[RequestKind.COMPOUND] / len(jobs) == pytest.approx(0.25, abs=0.03)
    lat = next(j for j in jobs if j.slo.kind is RequestKind.LATENCY)
    dl = next(j for j in jobs if j.slo.kind is RequestKind.DEADLINE)
    comp = next(j for j in jobs if j.slo.kind is RequestKind.COMPOUND)
    assert (lat.slo.ttft_s, lat.slo.tbt_s) == pytest.approx((3.0, 0.15))
    assert dl.slo.deadline_s == pytest.approx(30.0)
    assert comp.stages is not None and comp.slo.deadline_s == pytest.approx(30.0 * len(comp.stages))


def test_priority_classes_and_best_effort_share() -> None:
    jobs = build_workload(WorkloadSpec(rps=20.0, duration_s=300.0, best_effort_share=0.1))
    high = [j for j in jobs if j.slo.priority_class == "high"]
    assert len(high) / len(jobs) == pytest.approx(0.5, abs=0.03)
    assert {j.slo.priority_weight for j in high} == {2.0}
    assert {j.slo.priority_weight for j in jobs if j.slo.priority_class == "low"} == {1.0}
    be = [j for j in jobs if j.slo.kind is RequestKind.BEST_EFFORT]
    assert len(be) / len(jobs) == pytest.approx(0.1, abs=0.02)
    assert all(j.tier == f"{j.slo.kind.value}-{j.slo.priority_class}" for j in jobs)


@pytest.mark.parametrize("bad", ["1:1", "a:b:c", "0:0:0", "-1:1:1"])
def test_a_bad_mix_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="latency:deadline:compound"):
        parse_mix(bad)


def test_azure_csv_and_jsonl_trace_files(tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv.gz"
    with gzip.open(csv_path, "wt") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        fh.write("2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:48.1805900,10,0\n")
    t = read_trace(csv_path)
    assert t.arrival_s is not None and t.arrival_s.tolist() == pytest.approx([0.0, 1.5])
    assert t.input_tokens.tolist() == [374, 10] and t.output_tokens.tolist() == [44, 1]  # 0 -> 1
    jl = tmp_path / "t.jsonl"
    jl.write_text(
        '{"timestamp": 2000, "input_length": 5, "output_length": 6}\n'
        '{"timestamp": 500, "input_length": 7, "output_length": 8}\n'
    )
    t = read_trace(jl)
    assert t.arrival_s is not None and t.arrival_s.tolist() == [0.0, 1.5]
    assert t.input_tokens.tolist() == [7, 5]
    jl.write_text('{"time": 1}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: a JSONL trace line needs timestamp"):
        read_trace(jl)
    with pytest.raises(ValueError, match="unknown trace"):
        load_trace("no-such-trace")


def test_sharegpt_lengths_need_poisson_arrivals_and_carry_prompt_ids() -> None:
    jobs = build_workload(WorkloadSpec(trace="sharegpt", rps=2.0, duration_s=30.0, mix=(1, 0, 0)))
    assert jobs and all(j.prompt_id for j in jobs)


def test_deep_research_dags_have_4_or_6_stages_of_1_to_3_calls() -> None:
    rng = random.Random(0)
    dags = [deep_research_dag(rng) for _ in range(200)]
    assert {len(d) for d in dags} == {4, 6}
    assert {len(stage) for d in dags for stage in d} == {1, 2, 3}


def test_tot_dags_keep_the_logs_fan_out_and_token_usage() -> None:
    dags = tot_dags()
    assert len(dags) == 100
    first = dags[0]
    # task 0 of the log: 1 propose call, 12 proposals valued, 5 kept, 35 valued, ...
    assert [len(s) for s in first] == [1, 12, 5, 35, 5, 19, 5, 14]
    assert sum(i for s in first for i, _ in s) == pytest.approx(28451, abs=60)  # its prompt usage
    assert sum(o for s in first for _, o in s) == pytest.approx(9161, abs=60)  # its completion usage


def test_dag_jsonl_file(tmp_path: Path) -> None:
    p = tmp_path / "dags.jsonl"
    p.write_text(json.dumps({"request_id": "x", "stages": [[[10, 2], [5, 1]], [[7, 3]]]}) + "\n")
    assert read_dags_jsonl(p) == [("x", (((10, 2), (5, 1)), ((7, 3),)))]
    jobs = build_workload(WorkloadSpec(rps=2.0, duration_s=10.0, mix=(0, 0, 1), dags=str(p)))
    assert jobs and all(j.stages == (((10, 2), (5, 1)), ((7, 3),)) for j in jobs)
    p.write_text('{"request_id": "x", "stages": [[]]}\n')
    with pytest.raises(ValueError, match=r"dags.jsonl:1"):
        read_dags_jsonl(p)
