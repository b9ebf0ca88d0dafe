"""The demo's workload through core's FleetSim: what the services' code predicts for the live run.

Same jobs, seed, SLOPolicy (engine policy, routing, admission, objective), GPU profile slowed by the
same ``speedup`` as engine-sim's, engine limits as engine-sim's defaults, and the sidecar's analyzer
(the shipped QRF bounds), and the router's view of each engine as stale as the live state stream
makes it (:func:`report_age_s`). Nothing here knows how a live fleet is wired: it takes the policy text the
fleet was given and returns the same :class:`~slo_core.metrics.summary.JobOutcome` rows the replay
produces, so live and simulated numbers go through one summary.
"""

from __future__ import annotations

from collections.abc import Sequence

from slo_core.crd.loads import parse_policy
from slo_core.metrics.summary import JobOutcome, job_outcomes
from slo_core.perf import load_profile, sped_up
from slo_core.perf.model import PerfProfile
from slo_core.sim.analyzer import SimAnalyzer
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.fleet import FleetSim, ReplicaSpec, SimConfig
from slo_core.workloads.jobs import Job
from slo_lab.localfleet.replay import CallTrace


def engine_profile(profile: str, speedup: float) -> PerfProfile:
    """The coefficients the demo's engines run with: the named profile at engine-sim's ``--speedup``
    (the same arithmetic; the live router gets them from the step-time correction its pods report)."""
    return sped_up(load_profile(profile), speedup)


def report_age_s() -> float:
    """How stale the live router's view of a pod can get, from the deployed defaults: engine-sim hands
    its sidecar a report every analyzer interval, and the router's state stream polls the sidecar
    every ``interval_ms``. The simulator's router takes a report at most this often."""
    import inspect

    from slo_lab.engine_sim.settings import EngineSimSettings
    from slo_router.statefeed import StateFeed

    stream_ms = inspect.signature(StateFeed.__init__).parameters["interval_ms"].default
    return float(EngineSimSettings.model_fields["analyzer_interval_s"].default) + float(stream_ms) / 1000.0


def simulate(
    jobs: Sequence[Job],
    policy_text: str,
    *,
    profile: str,
    speedup: float,
    engines: int,
    seed: int,
    max_num_seqs: int = 256,
    demoted_by_tier: dict[str, int] | None = None,
    calls: dict[str, list[CallTrace]] | None = None,
) -> list[JobOutcome]:
    """Every job's outcome in the simulator (one SimEngine per live engine, the policy's routing), in
    the order of ``jobs`` (so live and simulated outcomes of one job can be compared).
    ``demoted_by_tier`` (when given) gets how many requests or calls of each tier the router demoted
    to best effort, as the live router counts them (``slofleet_router_downgraded``); ``calls`` (when
    given) gets each job's requests or calls as sent (stage, time, demoted or not), as the replay's
    records show the live ones (:meth:`~slo_lab.localfleet.replay.JobRecord.traces`)."""
    runtime = parse_policy(policy_text, "demo policy").spec.runtime()
    perf = engine_profile(profile, speedup)
    replicas = [ReplicaSpec(perf, EngineConfig(max_num_seqs=max_num_seqs))] * engines
    sim = FleetSim.from_runtime(
        replicas,
        runtime,
        seed=seed,
        analyzer=SimAnalyzer(),
        config=SimConfig(drain="all", report_interval_s=report_age_s()),
    )
    result = sim.run(jobs)
    if demoted_by_tier is not None:
        demoted_by_tier.update(result.demoted_by_tier)
    if calls is not None:
        demoted = set(result.demoted_ids)
        for r in result.requests:
            job_id = r.request_id if r.program is None else r.program.program_id
            stage = None if r.program is None else r.stage
            calls.setdefault(job_id, []).append(CallTrace(stage, r.arrival_s, r.request_id in demoted))
    outs = job_outcomes(result)
    # job_outcomes lists single requests first, then programs
    ids = [r.request_id for r in result.requests if r.program is None]
    ids += [p.program_id for p in result.programs]
    by_id = dict(zip(ids, outs, strict=True))
    return [by_id[j.job_id] for j in jobs]
