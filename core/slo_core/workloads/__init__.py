"""Seeded, reproducible workloads: trace or Poisson arrivals, request kinds and SLOs, compound DAGs.

``build_workload(WorkloadSpec(...))`` returns the jobs a FleetSim runs; see builder, traces, dags.
"""

from __future__ import annotations

from slo_core.workloads.builder import SLOSettings, WorkloadSpec, build_workload, parse_mix
from slo_core.workloads.dags import DeepResearchParams, deep_research_dag, read_dags_jsonl, tot_dags
from slo_core.workloads.traces import BUILTIN_TRACES, Trace, load_trace, read_trace

__all__ = [
    "BUILTIN_TRACES",
    "DeepResearchParams",
    "SLOSettings",
    "Trace",
    "WorkloadSpec",
    "build_workload",
    "deep_research_dag",
    "load_trace",
    "parse_mix",
    "read_dags_jsonl",
    "read_trace",
    "tot_dags",
]
