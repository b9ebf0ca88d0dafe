"""The named scenarios of the side-by-side comparison (issue 5): what runs, on which traffic and fleet.

Every run of a scenario at one load sees the identical seeded jobs; only the engine policy and the
router differ. Sizes are shrunk from the papers (one hour, >10k requests) to 60 s of arrivals per point
(40 s for the priority, multi-replica and capacity runs; 120 s for the burst) so that the comparison
fits a small time budget on 2 shared cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slo_core.workloads import WorkloadSpec

PROFILE = "h100-llama3-8b-tp1"
DURATION_S = 60.0
SHORT_S = 40.0  # the costlier scenarios (many requests or many replicas per point)

BASELINES = ("fcfs", "sarathi", "edf", "sjf-oracle", "ltr", "autellix", "strict-priority")
GMAX_FAMILY = ("gmax", "gmax-oracle", "gmax-no-analyzer", "gmax-no-gmax")
SEED_PAPERS = ("tempo", "slide-batching", "slos-serve", "annealing")
ALL_ENGINE = BASELINES + GMAX_FAMILY + SEED_PAPERS
ROUTERS = ("round-robin", "min-load", "p2c", "power-of-k", "go-routing", "slos-serve-reroute")
# each paper's router with the engine policy it was designed around
NATIVE_PAIRS = (
    ("gmax", "power-of-k"),
    ("slide-batching", "go-routing"),
    ("slos-serve", "slos-serve-reroute"),
)
CAPACITY_POLICIES = ("fcfs", "sarathi", "gmax", "tempo", "slide-batching", "slos-serve", "annealing")
BURST_POLICIES = CAPACITY_POLICIES
# the slower scenarios (more requests per point) run the baselines that matter there and every seed paper
SUBSET = ("fcfs", "sarathi", "edf", "strict-priority", "gmax", *SEED_PAPERS)


@dataclass(frozen=True)
class Run:
    """One simulation: a workload at one rate on ``replicas`` replicas with a policy and a router."""

    scenario: str
    workload: WorkloadSpec
    policy: str
    router: str = "round-robin"
    replicas: int = 1
    burst: bool = False
    policy_params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class CapacitySearch:
    """A serving-capacity bisection for one policy on one workload (rate replaced per probe)."""

    scenario: str
    workload: WorkloadSpec
    policy: str
    lo_rps: float
    hi_rps: float
    iterations: int
    known: dict[float, float] = field(default_factory=dict)  # rate -> attainment of runs already done


def conv_spec(rps: float, **kw: object) -> WorkloadSpec:
    kw.setdefault("duration_s", DURATION_S)
    return WorkloadSpec(trace="azure-conv-2023", rps=rps, **kw)  # type: ignore[arg-type]


CONV_LOADS = (2.0, 4.0, 6.0, 8.0, 12.0)
CODE_RPS = 6.0
PRIORITY_LOADS = (
    20.0,
    32.0,
)  # requests/s: every SLO-aware policy copes at 20 over 40 s; 32 over 60 s overloads
BURST_BASE_RPS = 2.0
BURST_START_S = 30.0
MULTI_RPS_PER_REPLICA = 12.0
NATIVE_S = 20.0  # the native router/engine pairs run expensive engine policies on 4 replicas


def runs(names: tuple[str, ...]) -> list[Run]:
    """Every simulation of the named scenarios."""
    out: list[Run] = []
    if "conv" in names:  # JITServe §6.2: 1:1:1 on Azure conv arrivals, light to overload
        for rps in CONV_LOADS:
            out += [Run("conv", conv_spec(rps), p) for p in ALL_ENGINE]
    if "code" in names:  # SLOs-Serve Coder: bursty Azure code arrivals, long prompts, short outputs
        spec = WorkloadSpec(trace="azure-code-2023", rps=CODE_RPS, duration_s=DURATION_S, mix=(1.0, 1.0, 0.0))
        out += [Run("code", spec, p) for p in ALL_ENGINE]
    if "priority" in names:  # PROSERVE §5.1: TTFT+TPOT requests, 50% high (weight 2), 50% low (weight 1)
        for rps, dur in zip(PRIORITY_LOADS, (SHORT_S, DURATION_S), strict=True):
            spec = conv_spec(rps, mix=(1.0, 0.0, 0.0), high_share=0.5, high_weight=2.0, duration_s=dur)
            out += [Run("priority", spec, p) for p in SUBSET]
    if "burst" in names:  # SLOs-Serve §6.1: ×5 arrival rate for one minute
        spec = WorkloadSpec(trace="azure-conv-2023", rps=BURST_BASE_RPS, duration_s=120.0)
        out += [Run("burst", spec, p, burst=True) for p in BURST_POLICIES]
    if "multi" in names:  # JITServe §6.4 / PROSERVE §5.2 / SLOs-Serve §6.2: routers on 4 and 8 replicas
        for n in (4, 8):
            spec = conv_spec(MULTI_RPS_PER_REPLICA * n, duration_s=SHORT_S)
            out += [Run("multi", spec, "sarathi", r, replicas=n) for r in ROUTERS]
        spec4 = conv_spec(MULTI_RPS_PER_REPLICA * 4, duration_s=NATIVE_S)
        for policy, router in NATIVE_PAIRS:
            out.append(Run("multi", spec4, policy, router, replicas=4))
            out.append(Run("multi", spec4, policy, "min-load", replicas=4))
        out += [Run("multi", spec4, "sarathi", r, replicas=4) for r in ("round-robin", "min-load")]
    return out


def capacity_searches(names: tuple[str, ...]) -> list[CapacitySearch]:
    """Serving-capacity bisections (SLOs-Serve §6: the largest rate with ≥ 90% attainment).

    The brackets come from the sweeps (conv: 8 to 12 req/s; code: 2 to 6 req/s) and a probe at a rate
    the sweep already ran reuses that run (same spec, so the same result), so each search adds only
    the probes inside the bracket.
    """
    out: list[CapacitySearch] = []
    if "capacity" in names:
        code = WorkloadSpec(trace="azure-code-2023", rps=1.0, duration_s=DURATION_S, mix=(1.0, 1.0, 0.0))
        for p in CAPACITY_POLICIES:
            out.append(CapacitySearch("capacity-conv", conv_spec(1.0), p, 8.0, 12.0, 2))
            out.append(CapacitySearch("capacity-code", code, p, 2.0, CODE_RPS, 2))
    return out


SCENARIOS = ("conv", "code", "priority", "burst", "multi", "capacity")
