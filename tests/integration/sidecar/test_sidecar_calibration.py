"""The sidecar's online bound calibration over real HTTP: completions teach it, metrics show it, it
survives a restart, replicas share it through /slofleet/calibration, and hostile peers change nothing."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import httpx
import pytest

from slo_core.predict import BoundQuery, OutputBoundEstimator
from slo_core.predict.calibration import LiveBound
from slo_core.predict.training import LengthRow, train_estimator
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_core.wire.keyring import KeyRing
from slo_lab.fake_engine import FakeEngine, serve_fake_engine
from slo_proto import slofleet_pb2 as pb
from slo_sidecar import calibration
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.front import COMPLETION, parse_body
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar

GOLD = SLOTier("gold", RequestKind.LATENCY, PriorityClass("high", 4.0), ttft_s=5.0, tbt_s=1.0)
CONFIG = PolicyConfig(tiers={"gold": GOLD}, default_tier="gold", max_wait_s=30)


@pytest.fixture(scope="module")
def forest() -> OutputBoundEstimator:
    """A forest that expects ~150-token answers; the fake engine answers in 1-64 tokens."""
    rng = random.Random(0)
    rows = [LengthRow(f"r{i}", "", rng.randint(1, 40), rng.randint(100, 200), "latency") for i in range(300)]
    return train_estimator(rows, n_trees=5, min_samples_leaf=5)


def _sidecar(url: str, est: OutputBoundEstimator, **knobs: object) -> Sidecar:
    return Sidecar(
        knobs=SidecarKnobs(drain_timeout_s=3, calibration_window=50, **knobs),  # type: ignore[arg-type]
        config=CONFIG,
        engine_url=url,
        estimator=est,
    )


async def _serve_some(http: httpx.AsyncClient, base: str, n: int, seed: int) -> None:
    for i in range(n):
        body = {"model": "fake-model", "prompt": f"question {seed}-{i}", "max_tokens": 300}
        assert (await http.post(base + "/v1/completions", json=body)).status_code == 200


async def test_completions_calibrate_and_the_state_survives_a_restart(
    tmp_path: Path, forest: OutputBoundEstimator
) -> None:
    eng = FakeEngine()
    query = BoundQuery(None, 5, "latency", 300)
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url, forest, calibration_apply=True)
        hub = sc.calibration
        assert hub is not None
        plan = hub.plan(None, 5, "latency", 300, "fake-model", "default")
        uncalibrated = hub.bound_at(plan, 0)
        assert uncalibrated == forest.bounds([query])[0]  # no data yet: the forest as trained
        async with (
            running_sidecar(sc, grpc_port=None, state_dir=tmp_path) as run,
            httpx.AsyncClient() as http,
        ):
            await _serve_some(http, run.http_url, 56, 0)  # past a full window (50): it tightens
            metrics = (await http.get(run.http_url + "/metrics")).text
            peer_doc = (await http.get(run.http_url + calibration.PEER_PATH)).json()
        calibrated = hub.bound_at(plan, 0)
        assert calibrated < uncalibrated / 1.5  # 1-64-token answers: the bound came down
        assert 'slofleet_sidecar_bound_correction_factor{stage="0",stratum="fake-model/latency"}' in metrics
        assert 'slofleet_sidecar_bound_coverage_ratio{stage="0",stratum="fake-model/latency"}' in metrics
        assert peer_doc["format"] == "slofleet-calibration/1" and peer_doc["cells"]
        assert "question" not in json.dumps(peer_doc)  # no prompt text leaves the pod
        assert (tmp_path / calibration.STATE_FILE).exists()
        rows = list(sc.history.rows)
        assert rows and all(r["model"] == "fake-model" and "prompt" not in r for r in rows)
        # the bounds it issued came down as it learned (--calibration-apply)
        assert max(r["bound_at_arrival"] for r in rows[-5:]) < min(r["bound_at_arrival"] for r in rows[:5])

        again = _sidecar(url, forest)
        async with (
            running_sidecar(again, grpc_port=None, state_dir=tmp_path) as run,
            httpx.AsyncClient() as http,
        ):
            assert again.calibration is not None
            assert again.calibration.calibrator.origin == hub.calibrator.origin
            assert again.calibration.bound_at(plan, 0) == calibrated
            assert again.calibration.calibrator.snapshot() == hub.calibrator.snapshot()


async def test_without_apply_the_forest_bounds_are_issued_and_coverage_is_observed(
    forest: OutputBoundEstimator,
) -> None:
    async with serve_fake_engine(FakeEngine()) as url:
        sc = _sidecar(url, forest)  # the default: learn and export, issue the forest's bounds
        async with running_sidecar(sc, grpc_port=None) as run, httpx.AsyncClient() as http:
            await _serve_some(http, run.http_url, 51, 2)  # past a full window (50): it may tighten
        rows = list(sc.history.rows)
        hub = sc.calibration
        assert hub is not None
        assert len(rows) == 51
        for i, r in enumerate(rows):  # what was issued is the forest's bound, not the calibrated one
            text = f"question 2-{i}"
            body = {"model": "fake-model", "prompt": text, "max_tokens": 300}
            n = parse_body(
                body, COMPLETION, 256
            ).prompt_tokens  # the count at admission (rows keep the engine's)
            assert r["bound_at_arrival"] == forest.bound(text, n, "latency", 300)
            plan = hub.plan(text, n, "latency", 300, "fake-model", "default")
            assert r["bound_at_arrival"] > hub.bound_at(plan, 0)
        assert sc.calibration is not None
        cell = sc.calibration.calibrator.snapshot()[0]
        assert cell["completions"] == 51 and cell["coverage"] == 1.0  # the loose forest covered all
        assert cell["factor"] < 1.0  # and the calibration learned it could be tighter


async def test_a_corrupt_state_file_is_moved_aside(tmp_path: Path, forest: OutputBoundEstimator) -> None:
    (tmp_path / calibration.STATE_FILE).write_text('{"format": "slofleet-calibration/1", "cells": 5}')
    async with serve_fake_engine(FakeEngine()) as url:
        sc = _sidecar(url, forest)
        async with running_sidecar(sc, grpc_port=None, state_dir=tmp_path):
            assert sc.calibration is not None and sc.calibration.calibrator.snapshot() == []
    assert (tmp_path / "calibration.json.corrupt").exists()


async def test_replicas_share_calibration_and_ignore_hostile_peers(forest: OutputBoundEstimator) -> None:
    async with serve_fake_engine(FakeEngine()) as url:
        a, b = _sidecar(url, forest), _sidecar(url, forest)
        assert a.calibration is not None and b.calibration is not None
        async with (
            running_sidecar(a, grpc_port=None) as run_a,
            running_sidecar(b, grpc_port=None) as run_b,
            httpx.AsyncClient() as http,
        ):
            await _serve_some(http, run_a.http_url, 30, 1)
            assert b.calibration.calibrator.snapshot() == []
            added = await calibration.sync_once(b.calibration, http, [run_a.http_url, run_b.http_url])
            assert added > 0
            assert await calibration.sync_once(b.calibration, http, [run_a.http_url]) == 0  # idempotent
            plan = a.calibration.plan(None, 5, "latency", 300, "fake-model", "default")
            assert b.calibration.bound_at(plan, 0) == a.calibration.bound_at(plan, 0)
            # a peer that answers garbage (here: the OpenAI front, a 404 path) changes nothing
            before = b.calibration.calibrator.snapshot()
            bad = [run_a.http_url + "/v1/models?x=", "http://127.0.0.1:9"]
            assert await calibration.sync_once(b.calibration, http, bad) == 0
            assert b.calibration.calibrator.snapshot() == before
            assert b.calibration.peer_errors >= 2


RING = KeyRing(b"c" * 32, b"p" * 32, rotated_at_s=time.time() - 3600)
OTHER_RING = KeyRing(b"x" * 32)


async def test_with_a_key_ring_peers_authenticate_both_ways_on_the_calibration_port(
    forest: OutputBoundEstimator,
) -> None:
    """As the operator renders it: the state only on --calibration-port, only to callers with a call
    token, and a fetcher takes only answers signed with the same key ring."""
    async with serve_fake_engine(FakeEngine()) as url:
        a, b = _sidecar(url, forest), _sidecar(url, forest)
        a.keys = b.keys = lambda: RING
        assert a.calibration is not None and b.calibration is not None
        async with (
            running_sidecar(a, grpc_port=None, calibration_port=0) as run_a,
            httpx.AsyncClient() as http,
        ):
            await _serve_some(http, run_a.http_url, 30, 1)
            # not on the public port any more, and refused without a token or with a foreign key's
            assert (await http.get(run_a.http_url + calibration.PEER_PATH)).status_code == 404
            refused = await http.get(run_a.calibration_url + calibration.PEER_PATH)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
            assert await calibration.sync_once(b.calibration, http, [run_a.calibration_url]) == 0
            foreign = await calibration.sync_once(
                b.calibration, http, [run_a.calibration_url], lambda: OTHER_RING
            )
            assert foreign == 0 and b.calibration.calibrator.snapshot() == []
            metrics = (await http.get(run_a.http_url + "/metrics")).text
            assert 'slofleet_sidecar_calibration_peer_refused_total{reason="no token"} 2.0' in metrics
            assert 'slofleet_sidecar_calibration_peer_refused_total{reason="wrong key"} 1.0' in metrics
            # the same ring: shared
            assert await calibration.sync_once(b.calibration, http, [run_a.calibration_url], b.keys) > 0
            plan = a.calibration.plan(None, 5, "latency", 300, "fake-model", "default")
            assert b.calibration.bound_at(plan, 0) == a.calibration.bound_at(plan, 0)
            # a responder without the key (an unkeyed sidecar answering at a peer's address) is not merged
            c = _sidecar(url, forest)
            assert c.calibration is not None
            async with running_sidecar(c, grpc_port=None) as run_c:
                await _serve_some(http, run_c.http_url, 30, 2)
                before, errors = b.calibration.calibrator.snapshot(), b.calibration.peer_errors
                assert await calibration.sync_once(b.calibration, http, [run_c.http_url], b.keys) == 0
                assert b.calibration.calibrator.snapshot() == before
                assert b.calibration.peer_errors == errors + 1


async def test_requests_in_flight_count_in_the_calibration_until_they_end_in_both_modes(
    forest: OutputBoundEstimator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the simulator (core's analyzer tracks every scheduled request): a request in flight is a
    censored score from admission until it ends, whatever the mode and however it ends."""
    # engine mode: the mirror tracks what the engine reports and lets go of what finished
    sc = Sidecar(
        knobs=SidecarKnobs(mode="engine", pod="p"),
        config=CONFIG,
        engine_url="http://127.0.0.1:9",
        estimator=forest,
    )
    hub = sc.calibration
    assert hub is not None
    now = time.time()
    clock = [100.0]  # the calibration's clock: a score is stamped with its request's arrival
    monkeypatch.setattr(hub.calibrator, "_clock", lambda: clock[0])

    def row(key: str, generated: int) -> pb.EngineRequest:
        return pb.EngineRequest(
            request_key=key, phase="decode" if generated else "waiting", prompt_tokens=5,
            generated_tokens=generated, max_tokens=300, arrival_unix_s=now - 1, kind="latency",
            tier="gold", ttft_s=5.0, tbt_s=1.0,
        )  # fmt: skip

    await sc.mirror.take(pb.EngineReport(snapshot_unix_s=now, requests=[row("a", 0), row("b", 0)]))
    assert hub.calibrator.in_flight() == 2
    await sc.mirror.take(pb.EngineReport(snapshot_unix_s=now, requests=[row("a", 7), row("b", 3)]))
    assert sc.mirror.tracked["a"].generated_tokens == 7, "the censored score reads the newest progress"
    done = [pb.FinishedRequest(request_key="a", generated_tokens=9, finish_reason="stop", tier="gold")]
    clock[0] = 200.0
    await sc.mirror.take(pb.EngineReport(snapshot_unix_s=now, requests=[row("b", 4)], finished=done))
    assert hub.calibrator.in_flight() == 1
    stamped = {x[2] for c in hub.calibrator.to_json()["cells"] for x in c["scores"]}
    assert stamped == {100.0}, "the finished request's score carries its arrival, not its end"
    gone = [pb.FinishedRequest(request_key="b", generated_tokens=4, finish_reason="abort", tier="gold")]
    await sc.mirror.take(pb.EngineReport(snapshot_unix_s=now, finished=gone))
    assert hub.calibrator.in_flight() == 0, "an aborted request stops counting too"

    # proxy mode: tracked from admission to the end of the request
    eng = FakeEngine()
    async with serve_fake_engine(eng) as url:
        sc = _sidecar(url, forest)
        hub = sc.calibration
        assert hub is not None
        seen: list[int] = []
        arrivals: list[float] = []
        tick = [0.0]
        track = hub.calibrator.track

        def ticking() -> float:
            tick[0] += 1.0
            return tick[0]

        def spy(live: LiveBound) -> None:
            arrivals.append(tick[0] + 1.0)  # what the clock gives track()
            track(live)
            seen.append(hub.calibrator.in_flight())

        monkeypatch.setattr(hub.calibrator, "_clock", ticking)
        monkeypatch.setattr(hub.calibrator, "track", spy)
        async with running_sidecar(sc) as run, httpx.AsyncClient(timeout=30) as http:
            await _serve_some(http, run.http_url, 5, seed=7)
        assert seen == [1, 1, 1, 1, 1], "each request was in flight alone, and counted"
        assert hub.calibrator.in_flight() == 0
        stamped = {x[2] for c in hub.calibrator.to_json()["cells"] for x in c["scores"]}
        assert stamped and stamped <= set(arrivals), "scores carry their requests' arrival times"
