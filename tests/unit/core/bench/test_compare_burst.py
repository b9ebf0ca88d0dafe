"""The burst transform: ×factor arrivals inside the window, the base workload untouched outside it."""

from __future__ import annotations

import pytest

from slo_core.workloads import WorkloadSpec, build_workload
from slo_core.workloads.burst import BurstSpec, burst_workload

SPEC = WorkloadSpec(trace="azure-conv-2023", arrival="poisson", rps=4.0, duration_s=120.0, seed=3)


def _in(jobs: list, lo: float, hi: float) -> int:  # type: ignore[type-arg]
    return sum(1 for j in jobs if lo <= j.arrival_s < hi)


def test_window_rate_is_multiplied_and_outside_is_unchanged() -> None:
    burst = BurstSpec(start_s=30.0, length_s=60.0, factor=5.0)
    base = build_workload(SPEC)
    jobs = burst_workload(SPEC, burst)
    inside_base = _in(base, 30.0, 90.0)
    inside = _in(jobs, 30.0, 90.0)
    # the extra workload adds (factor - 1) × rps × length arrivals, all inside the window
    assert inside - inside_base == pytest.approx(4 * 4.0 * 60.0, rel=0.15)
    assert inside / inside_base == pytest.approx(5.0, rel=0.25)
    outside = [j for j in jobs if not 30.0 <= j.arrival_s < 90.0]
    assert outside == [j for j in base if not 30.0 <= j.arrival_s < 90.0]


def test_burst_jobs_are_sorted_unique_and_reproducible() -> None:
    a = burst_workload(SPEC)
    assert [j.arrival_s for j in a] == sorted(j.arrival_s for j in a)
    assert len({j.job_id for j in a}) == len(a)
    assert a == burst_workload(SPEC)
    assert any(j.job_id.startswith("b") for j in a)


def test_factor_one_is_the_base_workload() -> None:
    assert burst_workload(SPEC, BurstSpec(factor=1.0)) == build_workload(SPEC)


def test_trace_replay_burst_uses_the_spec_rate() -> None:
    spec = WorkloadSpec(trace="azure-conv-2023", rps=2.0, duration_s=90.0)
    jobs = burst_workload(spec, BurstSpec(start_s=15.0, length_s=30.0, factor=3.0))
    assert len(jobs) == len(build_workload(spec)) + round(2 * 2.0 * 30.0)
