"""Engine mode exports the proxy sidecar's autoscaling counters: engine-sim judges each finished request
by core's rule and reports it (``Analyzer.Report`` over loopback gRPC) to an engine-mode sidecar, whose
``/metrics``, parsed by the operator, give the signals the simulator's replica counters give for the
very same requests (their recorded token times): met and missed in several tiers, a policy rejection,
an abort that counts no outcome, prompt and output tokens, and the admitted-work gauges mid-run."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

import httpx

from slo_core.policies.base import BaseEnginePolicy, Decision, EngineView, RequestView
from slo_core.scaling import FleetSignals, PodCounters, window
from slo_core.sim.autoscale import _Counters
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.wire.tags import EngineTags
from slo_lab.engine_sim.runner import EngineRunner, Handle, Submission
from slo_lab.engine_sim.settings import EngineSimSettings
from slo_operator import fleetmetrics
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

# tier name == priority class: the simulator keys its counters by the class, the sidecar by the tier
GOLD = SLOTier("gold", RequestKind.LATENCY, PriorityClass("gold", 4.0), ttft_s=60.0, tbt_s=10.0)
TIGHT = SLOTier("tight", RequestKind.LATENCY, PriorityClass("tight", 2.0), ttft_s=1e-6, tbt_s=1e-6)
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("batch", 1.0), deadline_s=600.0)
LATE = SLOTier("late", RequestKind.DEADLINE, PriorityClass("late", 1.0), deadline_s=1e-6)
DOOMED = SLOTier("doomed", RequestKind.DEADLINE, PriorityClass("doomed", 1.0), deadline_s=600.0)
TIERS = {t.name: t for t in (GOLD, TIGHT, BATCH, LATE, DOOMED)}


class RejectDoomed(BaseEnginePolicy):
    """Admits in arrival order, rejects the "doomed" tier (a policy rejection, as the sidecar's)."""

    name = "reject-doomed"

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision:
        doomed = tuple(v.request_id for v in waiting if v.slo.priority_class == "doomed")
        return Decision(
            admit=tuple(v.request_id for v in waiting if v.request_id not in doomed), reject=doomed
        )


def _submission(rid: str, tier: SLOTier, prompt: int, output: int, program: str | None = None) -> Submission:
    tags = EngineTags(tier.targets(), request_key=f"key-{rid}", tier=tier.name, program_id=program)
    return Submission(rid, prompt, output, output, tags)


async def _until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _scrape(client: httpx.AsyncClient, url: str, t_s: float) -> PodCounters:
    resp = await client.get(url + "/metrics")
    resp.raise_for_status()
    return fleetmetrics.parse(resp.text, t_s)


def _signals(before: PodCounters, after: PodCounters) -> FleetSignals:
    return window(
        {"p": before}, {"p": after}, ready=1, starting=0, capacity_tokens_per_s=1000.0, target=lambda _: 0.9
    )


async def test_engine_mode_counters_give_the_simulators_signals_for_the_same_requests() -> None:
    sc = Sidecar(
        knobs=SidecarKnobs(mode="engine", pod="p"),
        config=PolicyConfig(tiers=TIERS, default_tier="batch"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )
    async with running_sidecar(sc, grpc_port=0) as run, httpx.AsyncClient(timeout=5.0) as client:
        settings = EngineSimSettings(
            speedup=1,  # the long requests outlast the checks however loaded the host
            analyzer=run.grpc_target,
            analyzer_interval_s=0.02,
            report_interval_s=0.01,
            max_num_seqs=2,
        )
        runner = EngineRunner(settings, policy=RejectDoomed())
        await runner.start()
        try:
            await _until(lambda: runner.analyzer.bounds_if_fresh(1.0) is not None)  # the policy runs
            before = await _scrape(client, run.http_url, 0.0)
            # two long requests (one a compound call) fill both batch slots, a third waits: all three
            # are live while the gauges are checked, then aborted
            long = runner.submit(_submission("long", BATCH, 300, 5000))
            call = runner.submit(_submission("call", BATCH, 200, 5000, program="prog-1"))
            queued = runner.submit(_submission("queued", GOLD, 900, 5000))
            handles: list[Handle] = [long, call, queued]
            await _until(lambda: long.seen_tokens >= 20 and call.seen_tokens >= 20)
            await _until(lambda: sc.mirror.report is not None and len(sc.mirror.report.requests) == 3)
            mid = await _scrape(client, run.http_url, 1.0)
            # the waiting prompt and the running ones' output bounds left (exact sums: the unit tests)
            assert mid.outstanding_tokens >= 900
            assert (mid.program_requests, mid.waiting) == (1, 1)

            for h in handles:
                runner.abort(h.request_id)
            await _until(lambda: not runner.live)
            for i, (tier, prompt, output) in enumerate(
                [(GOLD, 400, 12), (GOLD, 90, 5), (TIGHT, 700, 8), (TIGHT, 50, 3), (BATCH, 120, 6),
                 (LATE, 300, 4), (DOOMED, 64, 10)]
            ):  # fmt: skip
                handles.append(runner.submit(_submission(f"r{i}", tier, prompt, output)))
            await _until(lambda: not runner.live)
            give_up = time.monotonic() + 15.0
            expected_output = sum(h.seen_tokens for h in handles)
            while True:  # every finished row has reached the sidecar
                engine_mode = await _scrape(client, run.http_url, 10.0)
                outcomes = sum(engine_mode.met.values()) + sum(engine_mode.missed.values())
                if outcomes == 7 and engine_mode.output_tokens == expected_output:
                    break
                assert time.monotonic() < give_up, engine_mode
                await asyncio.sleep(0.05)
        finally:
            await runner.stop()

    sim = _Counters()  # the simulator's replica counters, fed the same requests as the sidecar counts
    for h in handles:
        sim.prompt_tokens += h.sim.prompt_tokens
        sim.ended(h.sim)
    simulated = PodCounters(
        t_s=10.0,
        met=dict(sim.met),
        missed=dict(sim.missed),
        rejected=sim.rejected,
        prompt_tokens=sim.prompt_tokens,
        output_tokens=sim.output_tokens,
    )
    signals = _signals(before, engine_mode)
    assert signals == _signals(before, simulated)
    tiers = {t.tier: (t.finished, t.met) for t in signals.tiers}
    assert tiers == {"gold": (2, 2), "tight": (2, 0), "batch": (1, 1), "late": (1, 0), "doomed": (1, 0)}
    assert signals.rejected == 1  # the policy's; the three aborts count no outcome
    assert engine_mode.output_tokens == sum(h.seen_tokens for h in handles) > 40
    assert engine_mode.prompt_tokens == sum(h.sub.prompt_tokens for h in handles)
    assert (engine_mode.outstanding_tokens, engine_mode.program_requests, engine_mode.waiting) == (0, 0, 0)
