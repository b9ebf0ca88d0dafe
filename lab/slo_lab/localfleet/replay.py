"""Replay a workload's jobs through an OpenAI-compatible endpoint with the official ``openai`` client.

Each job is sent at its arrival time (relative to the start): a latency job as a streamed chat
completion, a deadline job as a completion, a compound job as its stages in order — each stage's
calls in parallel, stage s+1 once all of stage s returned — tied together by ``x-slo-program-id``
and ``x-slo-stage`` and carrying the whole program's deadline. Prompts are filler text of the job's
input length (engine-sim's counting rule), and ``max_tokens`` with ``ignore_eos`` imposes the job's
true output length, as trace replays do. Every token's arrival time is recorded on the client, so
the goodput computed here is what the client really got.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import openai

from slo_core.gain import GOODPUT_FUNCTIONS, Delivery, GainParams, ideal_gain
from slo_core.metrics.summary import JobOutcome
from slo_core.slo import RequestKind
from slo_core.wire.request_slo import SERVED_TIER_HEADER
from slo_core.workloads.jobs import Job

CHAT_FRAMING_TOKENS = 8  # BOS + one message (4) + assistant header (3), engine-sim's chat count
WORD = "word"  # one token to engine-sim (\w{1,8}) and to the router's estimate (\w{1,4}) alike


def filler_prompt(tokens: int, chat: bool) -> str:
    """Text that engine-sim counts as ``tokens`` tokens (BOS and chat framing included)."""
    words = max(1, tokens - (CHAT_FRAMING_TOKENS if chat else 1))
    return " ".join([WORD] * words)


@dataclass
class CallRecord:
    """What the client observed for one HTTP call."""

    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    status: str = "ok"  # ok | rejected | dropped | error
    error: str = ""
    finish_reason: str | None = None  # the engine's, as the last event or the response said
    tier: str | None = None  # the tier that served the call, as the router's answer said (x-slo-tier)
    stage: int | None = None  # a compound call's stage


@dataclass(frozen=True, slots=True)
class CallTrace:
    """One request, or one call of a compound job, as it was sent to the router: its stage (None for a
    single request), when (seconds from the run's start) and whether the router demoted it. The
    simulator's side is built the same way (:func:`slo_lab.localfleet.simulate.simulate`)."""

    stage: int | None
    sent_s: float
    demoted: bool


@dataclass
class JobRecord:
    job: Job
    calls: list[CallRecord] = field(default_factory=list)
    completed: bool = False
    send_lag_s: float = 0.0  # how late the client sent the job against its trace arrival (host load)

    def traces(self, start_s: float) -> list[CallTrace]:
        """The job's calls as sent (times from ``start_s``, the replay's start)."""
        return [
            CallTrace(c.stage, c.sent_s - start_s, c.tier is not None and c.tier != self.job.tier)
            for c in self.calls
        ]

    @property
    def status(self) -> str:
        if self.completed:
            return "ok"
        for status in ("rejected", "dropped"):
            if any(c.status == status for c in self.calls):
                return status
        return "error"


def _headers(job: Job, stage: int | None = None) -> dict[str, str]:
    h = {"x-slo-tier": job.tier}
    if job.slo.kind is RequestKind.LATENCY:
        if job.slo.ttft_s is not None:
            h["x-slo-ttft-s"] = f"{job.slo.ttft_s:g}"
        if job.slo.tbt_s is not None:
            h["x-slo-tbt-s"] = f"{job.slo.tbt_s:g}"
    elif job.slo.deadline_s is not None:
        h["x-slo-deadline-s"] = f"{job.slo.deadline_s:g}"
    if job.stages is not None and stage is not None:
        h["x-slo-program-id"] = job.job_id
        h["x-slo-stage"] = str(stage)
        h["x-slo-stages"] = str(len(job.stages))
    return h


def as_sent(job: Job) -> Job:
    """``job`` with the ``max_tokens`` its calls carry on the wire: the replay imposes each call's true
    output length with ``max_tokens`` (and ``ignore_eos``), so the fleet's schedulers see that length as
    the cap (the analyzer's bound never exceeds it). The simulator must get the same requests: a single
    request's cap is its output length, and a compound call's is its own (a program's ``max_tokens`` is a
    floor under each call's output, so 1 leaves each call its own length)."""
    from dataclasses import replace

    return replace(job, max_tokens=job.output_tokens if job.stages is None else 1)


class Replayer:
    """Sends jobs to ``base_url`` and records what came back (one instance per run)."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, clock: Callable[[], float]) -> None:
        self.client = client
        self.model = model
        self.clock = clock

    async def _stream_chat(self, job: Job, rec: CallRecord, prompt_tokens: int, out_tokens: int) -> None:
        raw = await self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=[{"role": "user", "content": filler_prompt(prompt_tokens, chat=True)}],
            max_tokens=out_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers=_headers(job),
        )
        rec.tier = raw.headers.get(SERVED_TIER_HEADER)
        stream = raw.parse()
        used = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                rec.token_times_s.append(self.clock())
            if chunk.choices and chunk.choices[0].finish_reason:
                rec.finish_reason = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        # a chunk may carry several tokens that piled up: the usage count is the truth
        if used > len(rec.token_times_s) and rec.token_times_s:
            rec.token_times_s.extend([rec.token_times_s[-1]] * (used - len(rec.token_times_s)))

    async def _complete(
        self, job: Job, rec: CallRecord, prompt_tokens: int, out_tokens: int, stage: int | None
    ) -> None:
        raw = await self.client.completions.with_raw_response.create(
            model=self.model,
            prompt=filler_prompt(prompt_tokens, chat=False),
            max_tokens=out_tokens,
            extra_body={"ignore_eos": True},
            extra_headers=_headers(job, stage),
        )
        rec.tier = raw.headers.get(SERVED_TIER_HEADER)
        out = raw.parse()
        now = self.clock()
        rec.finish_reason = out.choices[0].finish_reason if out.choices else None
        n = out.usage.completion_tokens if out.usage is not None else 0
        rec.token_times_s.extend([now] * n)

    async def _call(self, job: Job, prompt_tokens: int, out_tokens: int, stage: int | None) -> CallRecord:
        rec = CallRecord(sent_s=self.clock(), stage=stage)
        try:
            if job.slo.kind is RequestKind.LATENCY:
                await self._stream_chat(job, rec, prompt_tokens, out_tokens)
            else:
                await self._complete(job, rec, prompt_tokens, out_tokens, stage)
            if len(rec.token_times_s) < out_tokens and rec.finish_reason == "abort":
                # the engine's scheduler let the call go (a hard deadline it could no longer meet):
                # a miss the simulator counts the same way, not a fault of the fleet
                rec.status, rec.error = (
                    "dropped",
                    f"dropped by the engine after {len(rec.token_times_s)} tokens",
                )
            elif len(rec.token_times_s) < out_tokens:
                rec.status, rec.error = "error", f"stream ended after {len(rec.token_times_s)} tokens"
        except (openai.RateLimitError, openai.InternalServerError) as exc:
            rec.status = "rejected" if getattr(exc, "status_code", 0) in (429, 503) else "error"
            rec.error = f"{exc.status_code} {exc.code or type(exc).__name__}: {exc.message[:300]}"
        except (openai.APIError, httpx.HTTPError) as exc:
            # the transport's own error says which side hung up ("server disconnected ...", a refused
            # connect, a timeout); the openai wrapper's message alone ("Connection error.") does not
            cause = exc.__cause__ or exc.__context__
            why = f" ({type(cause).__name__}: {str(cause)[:160]})" if cause is not None else ""
            rec.status, rec.error = "error", type(exc).__name__ + why
        return rec

    async def run_job(self, job: Job, start_s: float) -> JobRecord:
        delay = start_s + job.arrival_s - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        record = JobRecord(job, send_lag_s=max(0.0, self.clock() - start_s - job.arrival_s))
        if job.stages is None:
            rec = await self._call(job, job.prompt_tokens, job.output_tokens, None)
            record.calls.append(rec)
            record.completed = rec.status == "ok"
            return record
        for s, stage in enumerate(job.stages):
            calls = await asyncio.gather(*(self._call(job, i, o, s) for i, o in stage))
            record.calls.extend(calls)
            if any(c.status != "ok" for c in calls):
                return record
        record.completed = True
        return record


def outcome(record: JobRecord, start_s: float, params: GainParams) -> JobOutcome:
    """The client-side record as the metrics module's JobOutcome (times relative to the run's start)."""
    job = record.job
    times = sorted(t - start_s for c in record.calls for t in c.token_times_s)
    delivery = Delivery(job.slo, job.arrival_s, job.total_input_tokens, times, record.completed)
    gaps = np.zeros(0)
    if job.stages is None and job.slo.kind is RequestKind.LATENCY:
        gaps = np.diff(np.asarray(times, dtype=float))
    o = JobOutcome(
        delivery,
        job.slo.kind.value,
        job.slo.priority_class,
        job.tier,
        job.total_output_tokens,
        record.status == "rejected",
        0,
        [],  # queueing happens inside the fleet; the client cannot see it
        gaps,
    )
    for name, fn in GOODPUT_FUNCTIONS.items():
        o.gains[name] = fn(delivery, params)
        o.ideals[name] = ideal_gain(delivery, name, params, output_tokens=o.output_tokens)
    return o


async def replay(
    base_url: str,
    jobs: Sequence[Job],
    *,
    model: str,
    api_key: str = "local",
    grace_s: float = 30.0,
    on_done: Callable[[JobRecord, float], None] | None = None,
    max_connections: int = 1000,
) -> tuple[list[JobRecord], float]:
    """Replay ``jobs``; returns the records and the start time (monotonic seconds).

    A job still running ``grace_s`` after its last useful moment is abandoned (the call is cancelled
    and the job counts as missed): a replay always ends.
    """
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=10.0))
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, http_client=http, max_retries=0)  # type: ignore[arg-type]
    replayer = Replayer(client, model, time.monotonic)
    start = time.monotonic()

    async def bounded(job: Job) -> JobRecord:
        budget = job.last_useful_s() + grace_s
        budget = budget if math.isfinite(budget) else job.arrival_s + 600.0
        timeout = max(1.0, start + budget - time.monotonic())
        try:
            rec = await asyncio.wait_for(replayer.run_job(job, start), timeout=timeout)
        except TimeoutError:
            rec = JobRecord(
                job, [CallRecord(sent_s=start + job.arrival_s, status="error", error="abandoned")]
            )
        if on_done is not None:
            on_done(rec, start)
        return rec

    try:
        records = await asyncio.gather(*(bounded(j) for j in jobs))
    finally:
        await client.close()
        await http.aclose()
    return list(records), start


def outcomes(
    records: Sequence[JobRecord], start_s: float, params: GainParams | None = None
) -> list[JobOutcome]:
    gp = params or GainParams()
    return [outcome(r, start_s, gp) for r in records]


def describe(records: Sequence[JobRecord]) -> dict[str, Any]:
    """Counts by status, for reconciling with the fleet's own metrics."""
    counts: dict[str, int] = {"ok": 0, "rejected": 0, "dropped": 0, "error": 0}
    for r in records:
        counts[r.status] += 1
    return counts


def failure_reasons(records: Sequence[JobRecord]) -> dict[str, int]:
    """Failed calls by status, error code and message: the code and message name the component that
    refused (the router's ``no_capacity`` says why no pod was taken; a pod's own 503 shows as
    ``pod ...: status 503``)."""
    reasons: dict[str, int] = {}
    for r in records:
        for c in r.calls:
            if c.status != "ok":
                reasons[c.error] = reasons.get(c.error, 0) + 1
    return dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
