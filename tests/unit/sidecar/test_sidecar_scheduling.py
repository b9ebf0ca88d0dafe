"""Proxy-mode scheduling decisions and the bodies the sidecar sends upstream (no network)."""

from __future__ import annotations

import asyncio

import pytest
from sidecars import queued_job, scripted_sidecar

from slo_core.policies.base import Decision
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.front import CHAT, COMPLETION
from slo_sidecar.job import Job


def test_release_follows_the_policy_order_up_to_max_running_with_vllm_priorities() -> None:
    sc, policy = scripted_sidecar(max_running=2, engine_priority=True)
    jobs = {rid: queued_job(sc, rid) for rid in ("a", "b", "c")}
    policy.next = Decision(admit=("c", "a", "b"))
    for job in jobs.values():
        sc.scheduler.waiting.append(job)
    sc.scheduler.frame()
    assert [j.request_id for j in sc.scheduler.running] == ["c", "a"]
    assert jobs["c"].released.is_set() and jobs["a"].released.is_set() and not jobs["b"].released.is_set()
    assert (jobs["c"].engine_priority, jobs["a"].engine_priority) == (0, 1)
    assert jobs["c"].live.priority > jobs["a"].live.priority > jobs["b"].live.priority
    assert policy.seen[-1] == (["a", "b", "c"], [])


def test_rejected_requests_get_a_503_with_a_retry_hint() -> None:
    sc, policy = scripted_sidecar()
    job = queued_job(sc, "a")
    sc.scheduler.waiting.append(job)
    policy.next = Decision(reject=("a",))
    sc.scheduler.frame()
    assert job.rejection is not None and job.rejection.status == 503 and job.rejection.code == "infeasible"
    assert job.rejection.retry_after_s is not None and job.rejection.retry_after_s >= 1
    assert not sc.scheduler.running


def test_preemption_requeues_resumable_requests_only() -> None:
    sc, policy = scripted_sidecar(max_running=1)
    text = queued_job(sc, "text")
    ids = queued_job(sc, "ids", {"model": "m", "prompt": [5, 6, 7], "max_tokens": 9, "stream": True})
    whole = queued_job(
        sc, "whole", {"model": "m", "prompt": "p", "max_tokens": 9}
    )  # the engine's body, as sent
    for job in (text, ids, whole):
        job.release(None)
        sc.scheduler.running.append(job)
    policy.next = Decision(preempt=("text", "ids", "whole"))
    sc.scheduler.waiting.append(queued_job(sc, "new"))
    sc.scheduler.frame()
    assert text in sc.scheduler.waiting and not text.released.is_set() and text.live.preemptions == 1
    assert ids in sc.scheduler.running and ids.live.preemptions == 0  # token ids: nothing to resume from
    assert whole in sc.scheduler.running and whole.live.preemptions == 0  # non-streamed: never spliced


def test_a_failing_policy_falls_back_to_arrival_order() -> None:
    sc, policy = scripted_sidecar(max_running=1)
    policy.fail = True
    first, second = queued_job(sc, "first"), queued_job(sc, "second")
    sc.scheduler.waiting += [first, second]
    sc.scheduler.frame()
    assert sc.scheduler.running == [first] and sc.scheduler.policy_errors == 1


def test_a_resumed_completion_continues_from_the_generated_text() -> None:
    sc, _ = scripted_sidecar()
    job = queued_job(
        sc,
        "a",
        {"model": "m", "prompt": "Once upon", "max_tokens": 20, "temperature": 0, "slo": {}, "stream": True},
    )
    assert sc.upstream_body(job)["prompt"] == "Once upon"
    sc.tracker.record_tokens(job.live, 3, " a time there", 1.0)
    body = sc.upstream_body(job)
    assert body["prompt"] == "Once upon a time there" and body["max_tokens"] == 17
    assert body["temperature"] == 0 and "slo" not in body and body["stream"] is True


def test_a_resumed_chat_continues_the_assistant_message() -> None:
    sc, _ = scripted_sidecar()
    messages = [{"role": "user", "content": "hi"}]
    job = queued_job(sc, "a", {"model": "m", "messages": messages, "max_tokens": 10}, endpoint=CHAT)
    sc.tracker.record_tokens(job.live, 2, "Hello there", 1.0)
    body = sc.upstream_body(job)
    assert body["messages"] == [*messages, {"role": "assistant", "content": "Hello there"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8


def test_engine_mode_carries_the_slo_as_vllm_xargs() -> None:
    sc, _ = scripted_sidecar(mode="engine")
    job = queued_job(sc, "a", {"model": "m", "prompt": "x", "vllm_xargs": {"mine": 1}})
    xargs = sc.upstream_body(job)["vllm_xargs"]
    assert xargs["mine"] == 1 and xargs["slo_request_key"] == "a" and xargs["slo_kind"] == "deadline"
    assert xargs["slo_deadline_at_s"] == pytest.approx(sc.tracker.unix(job.live.deadline_at_s))
    assert xargs["slo_output_bound"] == 10


async def test_bounds_are_refined_every_n_tokens_and_never_below_what_was_generated() -> None:
    sc, _ = scripted_sidecar(refine_every_tokens=50)
    est = sc.estimator
    assert isinstance(est, FallbackEstimator)
    for n in range(100):
        est.observe(20 + n % 10)  # this engine answers in 20-29 tokens
    job = queued_job(sc, "a", {"model": "m", "prompt": "x", "max_tokens": 400})
    job.live.bound = est.bound(None, 2, "deadline", 400)
    assert job.live.bound == 29
    sc.tracker.record_tokens(job.live, 49, "w " * 49, 1.0)
    sc.refine_later(job)
    await asyncio.sleep(0)
    assert job.live.bound == 49 + 1  # below the refinement period: only the floor moved it
    sc.tracker.record_tokens(job.live, 1, "w", 1.0)
    sc.refine_later(job)
    await asyncio.sleep(0.01)
    assert 50 < job.live.bound <= 400 and job.live.last_refined_tokens == 50  # outlived every sample: grows


def test_engine_mode_ranks_requests_by_the_policy_for_the_analyzer() -> None:
    sc, policy = scripted_sidecar(mode="engine")
    jobs = [queued_job(sc, rid) for rid in ("a", "b", "c")]
    for job in jobs:
        sc.scheduler.submit(job)
    assert all(j.released.is_set() for j in jobs)  # engine mode never holds a request
    sc.tracker.record_tokens(jobs[0].live, 1, "w", 1.0)
    policy.next = Decision(admit=("c", "b"), running_order=("a",))
    sc.scheduler.frame()
    assert policy.seen[-1] == (["b", "c"], ["a"])
    assert jobs[0].live.priority > jobs[2].live.priority > jobs[1].live.priority > 0


def test_the_routers_tenant_header_reaches_the_engine_tags() -> None:
    async def accept() -> Job:
        sc, _ = scripted_sidecar(mode="engine")
        sc.engine.healthy = True
        job = await sc.accept({"x-slofleet-tenant": "acme"}, {"model": "m", "prompt": "x"}, COMPLETION)
        assert sc.upstream_body(job)["vllm_xargs"]["slo_tenant"] == "acme"
        return job

    assert asyncio.run(accept()).live.tenant == "acme"


def test_the_routers_request_id_is_kept_when_safe_and_unused() -> None:
    async def ids() -> list[str]:
        sc, _ = scripted_sidecar()
        sc.engine.healthy = True
        body = {"model": "m", "prompt": "x"}
        out = []
        for rid in ("rtr-1", "rtr-1", "bad id\n", None):
            headers = {"x-request-id": rid} if rid else {}
            out.append((await sc.accept(headers, body, COMPLETION)).request_id)
        return out

    kept, duplicate, unsafe, absent = asyncio.run(ids())
    assert (
        kept == "rtr-1"
        and duplicate.startswith("sc-")
        and unsafe.startswith("sc-")
        and absent.startswith("sc-")
    )


@pytest.mark.parametrize("name", ["fcfs", "sarathi"])
@pytest.mark.parametrize("seed", range(5))
def test_a_fifo_policy_releases_the_same_requests_without_the_running_snapshots(name: str, seed: int) -> None:
    """FCFS and Sarathi decide from the queue order alone (core's ``fifo_fast_path``, which the
    simulator uses): the sidecar skips building a snapshot of every running request on each arrival,
    and releases exactly what the policy given every snapshot releases, keeping the same queue."""
    import random

    from slo_core.policies.registry import make_engine_policy

    full_policy = make_engine_policy(name, {})
    full_policy.fifo_fast_path = False  # type: ignore[attr-defined]  # the slow path: every snapshot
    fast, _ = scripted_sidecar(max_running=3)
    full, _ = scripted_sidecar(max_running=3)
    fast.scheduler.set_policy(make_engine_policy(name, {}))
    full.scheduler.set_policy(full_policy)
    assert fast.scheduler._guard.fifo_fast_path and not full.scheduler._guard.fifo_fast_path
    rng = random.Random(seed)
    for i in range(40):
        rid = f"r{i}"
        for sc in (fast, full):
            sc.scheduler.submit(queued_job(sc, rid))
        if rng.random() < 0.5 and full.scheduler.running:  # a running request streams or ends
            victim, ends = rng.choice(full.scheduler.running).request_id, rng.random() < 0.5
            for sc in (fast, full):
                job = sc.jobs[victim]
                if ends:
                    sc.scheduler.forget(job)
                else:
                    sc.tracker.record_tokens(job.live, 3, "", 1.0)
        for sc in (fast, full):
            sc.scheduler.frame()
        waiting = [j.request_id for j in fast.scheduler.waiting]
        assert waiting == [j.request_id for j in full.scheduler.waiting]
        # the same set released; their order among themselves is the engine's (Sarathi: decodes first)
        running = {j.request_id for j in fast.scheduler.running}
        assert running == {j.request_id for j in full.scheduler.running}
        assert [fast.jobs[r].released.is_set() for r in fast.jobs] == [
            full.jobs[r].released.is_set() for r in full.jobs
        ]


async def test_a_chunk_whose_write_is_cancelled_waiting_for_a_slow_client_is_not_lost() -> None:
    """A preemption can cancel the generation while it waits for a slow client to drain (the server
    writes only after that wait): the chunk, and what follows, go through the queue instead."""
    sc, _ = scripted_sidecar()
    job = queued_job(sc, "a")
    drained = asyncio.Event()
    written: list[bytes] = []

    async def slow_client(data: bytes) -> None:
        await drained.wait()  # the transport is paused: nothing written yet
        written.append(data)

    job.sink = slow_client
    writer = asyncio.create_task(job.write(b"one"))
    await asyncio.sleep(0)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    await job.write(b"two")  # the continuation's first chunk: queued behind, not written ahead
    assert written == [] and job.sink is None
    assert [job.events.get_nowait(), job.events.get_nowait()] == [("chunk", b"one"), ("chunk", b"two")]
