"""The sidecar's state over time: gRPC bounds and state stream of live requests, restart from a checkpoint,
config hot reload (a bad file keeps the last good config and says why), drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_proto import slofleet_pb2, slofleet_pb2_grpc
from slo_sidecar import lifecycle
from slo_sidecar.config import PolicyConfig, SidecarKnobs, parse_policy_file
from slo_sidecar.estimators import FallbackEstimator, load_length_estimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

GOLD = SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=2.0, tbt_s=0.5)
BATCH = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=30.0)
FLOW = SLOTier(
    "flow",
    RequestKind.COMPOUND,
    PriorityClass("low", 1.0),
    deadline_s=40.0,
    stage_deadline_share=(0.25, 0.75),
)
CONFIG = PolicyConfig(tiers={"gold": GOLD, "batch": BATCH, "flow": FLOW}, default_tier="gold", max_wait_s=30)

POLICY_YAML = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: demo}
spec:
  priorityClasses: [{name: high, weight: 4}, {name: low, weight: 1}]
  tiers:
    - {name: gold, kind: latency, ttftS: 2, tbtS: 0.5, priorityClass: high}
TIERS
  defaultTier: gold
  admission: {maxWaitS: 5}
  scheduling: {name: edf}
"""


def _sidecar(url: str, **knobs: Any) -> Sidecar:
    return Sidecar(
        knobs=SidecarKnobs(drain_timeout_s=3, **knobs),
        config=CONFIG,
        engine_url=url,
        estimator=FallbackEstimator(),
    )


async def _post(http: httpx.AsyncClient, base: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await http.post(
        base + "/v1/completions", json={"model": "fake-model", "prompt": "p", **body}, headers=headers
    )


async def _until(check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_grpc_bounds_and_state_stream_show_live_requests() -> None:
    eng = FakeEngine(gate=asyncio.Event())
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url)
        async with running_sidecar(sc) as run, httpx.AsyncClient(timeout=20) as http:
            calls = [
                _post(http, run.http_url, {"max_tokens": 7}, **{"x-slo-tier": "gold"}),
                _post(http, run.http_url, {"max_tokens": 9, "slo": {"tier": "batch"}}),
                _post(
                    http,
                    run.http_url,
                    {"max_tokens": 5, "slo": {"tier": "flow", "program_id": "p1", "stage": 0}},
                ),
            ]
            pending = asyncio.gather(*calls)
            await _until(lambda: len(sc.jobs) == 3)
            async with grpc.aio.insecure_channel(run.grpc_target) as channel:
                bounds = await slofleet_pb2_grpc.AnalyzerStub(channel).GetBounds(slofleet_pb2.BoundsRequest())
                by_key = {b.request_key: b for b in bounds.bounds}
                assert set(by_key) == set(sc.jobs)
                for key, job in sc.jobs.items():
                    assert by_key[key].output_bound == job.live.bound <= job.live.max_tokens
                flow = next(j for j in sc.jobs.values() if j.live.tier.name == "flow")
                # compound stage 0 of 2 gets the tier's first share of the program deadline: 0.25 · 40 s
                sub = by_key[flow.request_id].deadline_unix_s - sc.tracker.unix(flow.live.arrival_s)
                assert sub == pytest.approx(10.0, abs=0.01)
                one = await slofleet_pb2_grpc.AnalyzerStub(channel).GetBounds(
                    slofleet_pb2.BoundsRequest(request_keys=[flow.request_id])
                )
                assert [b.request_key for b in one.bounds] == [flow.request_id]

                watch = slofleet_pb2_grpc.StateStub(channel).Watch(slofleet_pb2.WatchRequest(interval_ms=20))
                first = await watch.read()
                second = await watch.read()
                watch.cancel()
            assert second.snapshot_unix_s > first.snapshot_unix_s
            assert first.healthy and not first.draining and first.pod == run.http_url.removeprefix("http://")
            assert sorted(r.tier for r in first.requests) == ["batch", "flow", "gold"]
            assert {r.kind for r in first.requests} == {"latency", "deadline", "compound"}
            assert all(r.phase == "prefill" and r.generated_tokens == 0 for r in first.requests)
            assert first.running == 3 and first.outstanding_tokens > 0
            assert first.capabilities.models == ["fake-model"]
            eng.gate.set()
            answers = await pending
            assert [r.status_code for r in answers] == [200, 200, 200]


async def test_restart_from_checkpoint_keeps_history_and_predictor(tmp_path: Path) -> None:
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url)
        for n in range(60):  # enough natural ends for the fallback predictor to learn this engine's lengths
            sc.estimator.observe(10 + n % 7)  # type: ignore[attr-defined]
        async with (
            running_sidecar(sc, grpc_port=None, state_dir=tmp_path) as run,
            httpx.AsyncClient() as http,
        ):
            for i in range(3):
                assert (
                    await _post(http, run.http_url, {"max_tokens": 4 + i, "ignore_eos": True})
                ).status_code == 200
        rows_before = list(sc.history.rows)
        bound_before = sc.estimator.bound("q", 2, "latency", 500)
        assert len(rows_before) == 3 and bound_before < 20

        estimator, source = load_length_estimator("fallback", tmp_path)
        assert "checkpoint" in source and estimator.bound("q", 2, "latency", 500) == bound_before
        again = Sidecar(knobs=SidecarKnobs(), config=CONFIG, engine_url=url, estimator=estimator)
        async with (
            running_sidecar(again, grpc_port=None, state_dir=tmp_path) as run,
            httpx.AsyncClient() as http,
        ):
            health = (await http.get(run.http_url + "/health")).json()
            assert health["history_rows"] == 3
            assert list(again.history.rows) == rows_before
            assert (await _post(http, run.http_url, {"max_tokens": 2})).status_code == 200
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["history"]["total_rows"] == 4 and state["in_flight"] == []


async def test_crash_with_requests_in_flight_is_reported_on_restart(tmp_path: Path, caplog: Any) -> None:
    eng = FakeEngine(gate=asyncio.Event())
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url)
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient() as http:
            pending = asyncio.gather(*(_post(http, run.http_url, {"max_tokens": 3}) for _ in range(2)))
            await _until(lambda: len(sc.jobs) == 2)
            await lifecycle.checkpoint(sc, tmp_path)  # the periodic checkpoint of a process about to die
            eng.gate.set()
            await pending
        again = _sidecar(url)
        lifecycle.restore(again, tmp_path)
        assert again.metrics.lost_on_restart._value.get() == 2
        assert "2 accepted requests in flight" in caplog.text


async def test_hot_reload_applies_good_files_and_keeps_the_last_good_config(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_YAML.replace("TIERS\n", ""))
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url)
        sc.config = parse_policy_file(policy)
        async with (
            running_sidecar(sc, grpc_port=None, policy_file=policy, reload_every_s=0.05) as run,
            httpx.AsyncClient() as http,
        ):
            assert (await _post(http, run.http_url, {"slo": {"tier": "batch"}})).status_code == 400
            policy.write_text(
                POLICY_YAML.replace(
                    "TIERS", "    - {name: batch, kind: deadline, deadlineS: 60, priorityClass: low}"
                )
            )
            await _until(lambda: "batch" in sc.config.tiers)
            assert (
                await _post(http, run.http_url, {"slo": {"tier": "batch"}, "max_tokens": 2})
            ).status_code == 200
            good = sc.config.digest

            policy.write_text(
                POLICY_YAML.replace("TIERS", "    - {name: batch, kind: deadline, priorityClass: low}")
            )
            await _until(lambda: bool(sc.config_error))
            health = (await http.get(run.http_url + "/health")).json()
            assert "deadlineS" in health["config_error"] and health["config_digest"] == good
            assert (
                await _post(http, run.http_url, {"slo": {"tier": "batch"}, "max_tokens": 2})
            ).status_code == 200


async def test_sigterm_drains_hands_back_waiting_requests_and_finishes_running_ones() -> None:
    eng = FakeEngine(gate=asyncio.Event(), tbt_s=0.01)
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url, max_running=1)
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient(timeout=20) as http:
            first = asyncio.create_task(_post(http, run.http_url, {"max_tokens": 20, "ignore_eos": True}))
            await _until(lambda: len(sc.scheduler.running) == 1)
            second = asyncio.create_task(_post(http, run.http_url, {"max_tokens": 20}))
            await _until(lambda: len(sc.scheduler.waiting) == 1)
            run.server.handle_exit(signal.SIGTERM, None)
            await _until(lambda: sc.draining)
            handed_back = await second
            assert handed_back.status_code == 503 and handed_back.json()["error"]["code"] == "draining"
            assert handed_back.headers["retry-after"] == "1"
            assert (await _post(http, run.http_url, {"max_tokens": 2})).status_code == 503
            eng.gate.set()
            finished = await first
            assert finished.status_code == 200 and finished.json()["usage"]["completion_tokens"] == 20
            await _until(lambda: run.server.should_exit)


async def test_the_qrf_predictor_is_checkpointed_verified_and_restored(tmp_path: Path, caplog: Any) -> None:
    estimator, source = await asyncio.to_thread(load_length_estimator, "shipped", tmp_path)
    assert source == "shipped"
    sc = Sidecar(knobs=SidecarKnobs(), config=CONFIG, engine_url="http://127.0.0.1:9", estimator=estimator)
    await lifecycle.checkpoint(sc, tmp_path)
    assert (tmp_path / "predictor.npz").exists() and (tmp_path / "predictor.npz.sha256").exists()
    prompts = [("What is a KV cache?", 7), ("Write a long essay about the history of Rome. " * 5, 60)]
    before = [estimator.bound(p, n, "latency", 2000) for p, n in prompts]

    restored, source = await asyncio.to_thread(load_length_estimator, "shipped", tmp_path)
    assert (
        source.startswith("checkpoint")
        and [restored.bound(p, n, "latency", 2000) for p, n in prompts] == before
    )

    raw = bytearray((tmp_path / "predictor.npz").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a damaged checkpoint fails its SHA-256 check and is never parsed
    (tmp_path / "predictor.npz").write_bytes(bytes(raw))
    _, source = await asyncio.to_thread(load_length_estimator, "shipped", tmp_path)
    assert source == "shipped" and "unusable" in caplog.text
