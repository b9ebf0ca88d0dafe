"""The plugin reuses a request's snapshot while every value it carries is unchanged, and builds a new
one the moment any is not: at every decision of a random run the snapshots the policy gets equal
freshly built ones, field for field, and an unchanged request keeps its snapshot object (what makes a
deep queue's decision cheap, for the bridge and for GMAX's column table)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from slo_core.policies.base import Decision, EngineView, RequestView
from slo_core.policies.registry import make_engine_policy
from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_vllm_plugin.bridge import PolicyBridge, attained_tokens

SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=60.0, priority_weight=2.0),
    SLOTargets(RequestKind.BEST_EFFORT),
)


def _request(rng: random.Random, i: int) -> Any:
    slo = rng.choice(SLOS)
    program = f"p{rng.randint(0, 3)}" if slo.kind is RequestKind.COMPOUND else None
    tags = EngineTags(
        slo,
        program_id=program,
        stage=rng.randint(0, 2) if program else None,
        deadline_at_s=rng.choice([None, 100.0 + rng.uniform(1, 50)]),
        output_bound=rng.choice([None, rng.randint(1, 500)]),
        request_key=rng.choice(["", f"k{i}"]),
    )
    extra = None if rng.random() < 0.1 else tags.to_xargs()  # untagged: best effort
    return SimpleNamespace(
        request_id=f"r{i}",
        sampling_params=SimpleNamespace(extra_args=extra),
        arrival_time=100.0 + rng.uniform(0, 10),
        num_prompt_tokens=rng.randint(1, 2000),
        max_tokens=rng.randint(1, 1000),
        num_output_tokens=0,
        num_computed_tokens=0,
        num_preemptions=0,
    )


class Recorder:
    """Stands in for the policy: keeps the snapshots of each decision."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[RequestView], list[RequestView]]] = []

    def __call__(self, w: list[RequestView], r: list[RequestView], *_: Any) -> Decision:
        self.calls.append((list(w), list(r)))
        return Decision()


@pytest.mark.parametrize("seed", range(6))
def test_every_snapshot_equals_a_fresh_one_and_unchanged_ones_are_kept(seed: int) -> None:
    rng = random.Random(seed)
    bounds: dict[str, int] = {}
    deadlines: dict[str, float] = {}
    now = [110.0]
    b = PolicyBridge(
        make_engine_policy("gmax", {}),
        bounds=lambda: bounds,
        deadlines=lambda: deadlines,
        clock=lambda: now[0],
    )
    rec = Recorder()
    b.guard.decide = rec  # type: ignore[method-assign]
    waiting = [_request(rng, i) for i in range(40)]
    running: list[Any] = []
    before: dict[str, RequestView] = {}
    reused = rebuilt = 0
    for step in range(60):
        now[0] += 0.05
        # the engine moves: admissions, tokens, preemptions, finishes; the analyzer moves its maps
        for r in running:
            r.num_computed_tokens = r.num_prompt_tokens + r.num_output_tokens
            r.num_output_tokens += 1
        if waiting and rng.random() < 0.5:
            running.append(waiting.pop(rng.randrange(len(waiting))))
        if running and rng.random() < 0.1:
            r = running.pop(rng.randrange(len(running)))
            r.num_computed_tokens = 0
            r.num_preemptions += 1
            waiting.insert(0, r)
        if running and rng.random() < 0.15:
            gone = running.pop(rng.randrange(len(running)))
            b.call_ended(gone, "stop")  # its program keeps its service
            b.forget([gone.request_id])
        if rng.random() < 0.3:
            waiting.append(_request(rng, 100 + step))
        for _ in range(rng.randint(0, 3)):
            key = f"k{rng.randint(0, 140)}"
            if rng.random() < 0.5:
                bounds[key] = rng.randint(1, 600)
            else:
                deadlines[key] = 100.0 + rng.uniform(1, 80)
        b.decide(waiting, running, lambda t: None)  # type: ignore[arg-type,return-value]
        w, r = rec.calls[-1]
        # the live service of each program, as decide sums it
        live: dict[str, int] = {}
        for req in (*waiting, *running):
            tags = b.tags(req)
            if tags is not None and tags.program_id:
                live[tags.program_id] = live.get(tags.program_id, 0) + attained_tokens(req)
        fresh = [b.view(req, bounds, live) for req in (*waiting, *running)]
        assert [*w, *r] == fresh
        for v in (*w, *r):
            old = before.get(v.request_id)
            if old is not None and old == v:
                assert old is v  # unchanged: the same object
                reused += 1
            elif old is not None:
                rebuilt += 1
        before = {v.request_id: v for v in (*w, *r)}
    assert reused > 200 and rebuilt > 50


def test_requests_that_left_are_dropped() -> None:
    rng = random.Random(7)
    b = PolicyBridge(make_engine_policy("fcfs", {}), clock=lambda: 110.0)
    reqs = [_request(rng, i) for i in range(10)]
    engine = EngineView(
        now_s=110.0,
        step=0,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        kv_blocks_total=100,
        kv_blocks_free=100,
        block_size=16,
    )
    b.decide(reqs, [], lambda t: engine)
    assert set(b._snapshots) == {r.request_id for r in reqs}
    b.decide(reqs[:3], [], lambda t: engine)
    assert set(b._snapshots) == {r.request_id for r in reqs[:3]}


def test_a_program_whose_service_moved_gets_new_snapshots() -> None:
    """A program's service here moves with its finished calls (done_tokens) as well as its live ones:
    its waiting calls' next snapshots carry the new total, even when their own counts did not move."""
    rng = random.Random(3)
    b = PolicyBridge(make_engine_policy("gmax", {}), clock=lambda: 110.0)
    rec = Recorder()
    b.guard.decide = rec  # type: ignore[method-assign]
    calls = []
    for i in range(3):
        r = _request(rng, i)
        tags = EngineTags(SLOS[2], program_id="prog", stage=0)
        r.sampling_params = SimpleNamespace(extra_args=tags.to_xargs())
        calls.append(r)
    b.decide(calls, [], lambda t: None)  # type: ignore[arg-type,return-value]
    first = rec.calls[-1][0]
    b._programs["prog"].done_tokens += 17  # a call of it that ended here
    b.decide(calls, [], lambda t: None)  # type: ignore[arg-type,return-value]
    second = rec.calls[-1][0]
    assert [v.program_attained_tokens for v in second] == [v.program_attained_tokens + 17 for v in first]
    b.decide(calls, [], lambda t: None)  # type: ignore[arg-type,return-value]
    assert all(x is y for x, y in zip(rec.calls[-1][0], second, strict=True))  # unchanged: kept
