"""One upstream attempt of a request: the engine's answer, counted and relayed to the client.

Streamed: the first attempt's chunks go to the client as the engine sent them, never parsed: the
token count comes from the chunk's continuous usage stats and the finish reason from its bytes
(``slo_sidecar.engine_client``), so a chunk carrying several tokens counts as several. The text is
kept as the raw chunks and decoded only when something needs it (bound refinement, a continuation
after a preemption: :func:`generated_text`). After a preemption, continuation chunks are parsed and
re-stamped with the first attempt's id so the client sees one stream. Non-streamed: the engine's
own body is passed through (tool calls, logprobs, reasoning intact); its usage is the accounting.

What an attempt needs of the sidecar is :class:`AttemptHost` (the service implements it), so this
module depends on no service type and the service imports it, never the reverse.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from slo_core.wire import openai
from slo_net.upstream import UpstreamPool
from slo_sidecar.config import SidecarKnobs
from slo_sidecar.engine_client import (
    EngineStatus,
    EngineUnavailable,
    complete,
    completion_tokens,
    finish_reason,
    stream_events,
    strip_usage,
)
from slo_sidecar.front import CHAT
from slo_sidecar.job import Job
from slo_sidecar.streaming import sse
from slo_sidecar.tracker import Tracker

_NO_CHOICES = b'"choices":[]'


class AttemptHost(Protocol):
    """The sidecar as an attempt sees it."""

    session: UpstreamPool | None
    engine: EngineStatus
    engine_url: str
    knobs: SidecarKnobs
    tracker: Tracker

    def now(self) -> float: ...

    def refine_later(self, job: Job) -> None: ...


def _choice_text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "") if isinstance(delta, dict) else ""
    return str(choice.get("text") or "")


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any]:
    choices = chunk.get("choices") or []
    return choices[0] if choices and isinstance(choices[0], dict) else {}


def generated_text(job: Job) -> str:
    """The text generated so far: chunks not decoded yet are parsed now (once each)."""
    live, chat = job.live, job.parsed.endpoint == CHAT
    if job.raw_chunks:
        for payload in job.raw_chunks:
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                text = _choice_text(_first_choice(chunk), chat)
                if text:
                    live.generated_text.append(text)
        job.raw_chunks.clear()
    return "".join(live.generated_text)


async def run_attempt(sc: AttemptHost, job: Job, body: dict[str, Any]) -> str:
    """Run one attempt to its end; raises EngineUnavailable/EngineRejected; cancellation aborts it."""
    path = "/v1/chat/completions" if job.parsed.endpoint == CHAT else "/v1/completions"
    headers = {"x-request-id": f"{job.live.request_id}-{job.attempts}"}
    session = sc.session
    assert session is not None
    if not job.parsed.stream:
        await _whole(sc, job, sc.engine_url + path, body, headers)
        return "done"
    events = stream_events(session, sc.engine_url + path, body, headers, sc.knobs.upstream_read_timeout_s)
    counted, usage = 0, None
    async for batch in events:  # the payloads of one read: relayed in one write, as a byte relay does
        now = sc.engine.last_heard_s = sc.now()  # a streaming engine is alive, whatever probes see
        out: list[bytes] = []
        for payload in batch:
            if _NO_CHOICES in payload:  # the final usage chunk: the sidecar sends its own sum over attempts
                usage = payload
                continue
            total = completion_tokens(payload)
            if job.attempts > 1 or total is None:
                counted, event = _relay_parsed(sc, job, payload, counted, now)
                if event is not None:
                    out.append(event)
                continue
            reason = finish_reason(payload)
            if reason is not None:
                job.finish_reason = reason
            if total > counted:
                sc.tracker.record_tokens(job.live, total - counted, "", now)
                counted = total
                job.raw_chunks.append(payload)
                sc.refine_later(job)
            if job.stream_id is None:
                job.stream_id = _chunk_id(payload) or job.request_id
            if job.parsed.include_usage:
                out.append(openai.sse_event(payload))  # as the engine sent it: no re-encoding
                continue
            bare = strip_usage(payload)
            out.append(openai.sse_event(bare) if bare is not None else _reencoded(payload))
        if out:
            await job.write(out[0] if len(out) == 1 else b"".join(out))
    if usage is not None:
        _settle_usage(sc, job, _usage_of(usage), counted)
    return "done"


def _chunk_id(payload: bytes) -> str | None:
    try:
        chunk = json.loads(payload)
    except ValueError:
        return None
    return str(chunk.get("id")) if isinstance(chunk, dict) and chunk.get("id") else None


def _reencoded(payload: bytes) -> bytes:
    chunk = json.loads(payload)
    chunk.pop("usage", None)
    return sse(chunk)


def _usage_of(payload: bytes) -> dict[str, Any]:
    try:
        usage = json.loads(payload).get("usage")
    except (ValueError, AttributeError):
        raise EngineUnavailable("engine sent a malformed usage chunk") from None
    return usage if isinstance(usage, dict) else {}


def _relay_parsed(
    sc: AttemptHost, job: Job, payload: bytes, counted: int, now: float
) -> tuple[int, bytes | None]:
    """A continuation's chunk (or one without usage stats): parsed, counted, re-stamped; the new count
    and the event for the client (None: nothing to send)."""
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise EngineUnavailable("engine sent a malformed stream event") from None
    if not isinstance(chunk, dict):
        raise EngineUnavailable("engine sent a malformed stream event")
    chat = job.parsed.endpoint == CHAT
    choice = _first_choice(chunk)
    running_usage = chunk.get("usage")
    text = _choice_text(choice, chat)
    if choice.get("finish_reason"):
        job.finish_reason = str(choice["finish_reason"])
    n_tokens = (
        int(running_usage.get("completion_tokens") or 0) - counted
        if isinstance(running_usage, dict)
        else int(bool(text))
    )
    if n_tokens > 0:
        counted += n_tokens
        generated_text(job)  # keep the text in order: earlier raw chunks first
        sc.tracker.record_tokens(job.live, n_tokens, text, now)
        sc.refine_later(job)
    elif job.attempts > 1 and not text and not choice.get("finish_reason"):
        return counted, None  # a continuation's opening role chunk: the client already has one
    if job.stream_id is None:
        job.stream_id = str(chunk.get("id") or job.request_id)
    if chat and isinstance(choice.get("delta"), dict) and job.attempts > 1:
        choice["delta"].pop("role", None)
    chunk["id"] = job.stream_id  # one id for the client across preemptions
    if not job.parsed.include_usage:
        chunk.pop("usage", None)
    return counted, sse(chunk)


async def _whole(sc: AttemptHost, job: Job, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    """A non-streamed request: the engine's body goes to the client as sent; its usage is accounted."""
    session = sc.session
    assert session is not None
    job.emit("chunk", b"")  # released into the engine: the wait for a seat is over
    raw = await complete(session, url, body, headers)  # the request's own time limit bounds it
    now = sc.engine.last_heard_s = sc.now()
    try:
        doc = json.loads(raw)
    except ValueError:
        raise EngineUnavailable("engine sent a malformed response body") from None
    if not isinstance(doc, dict):
        raise EngineUnavailable("engine sent a malformed response body")
    choice = _first_choice(doc)
    if choice.get("finish_reason"):
        job.finish_reason = str(choice["finish_reason"])
    found = doc.get("usage")
    usage: dict[str, Any] = found if isinstance(found, dict) else {}
    n = int(usage.get("completion_tokens") or 0)
    text = choice.get("text") if job.parsed.endpoint != CHAT else (choice.get("message") or {}).get("content")
    sc.tracker.record_tokens(job.live, n, text if isinstance(text, str) else "", now)
    if usage.get("prompt_tokens"):
        job.engine_prompt_tokens = int(usage["prompt_tokens"])
        job.live.prompt_tokens = job.engine_prompt_tokens
    job.response_body = raw


def _settle_usage(sc: AttemptHost, job: Job, usage: dict[str, Any], counted: int) -> None:
    """Chunks may carry several tokens (or none): the engine's count of this attempt is the truth."""
    live = job.live
    engine_tokens = int(usage.get("completion_tokens") or 0)
    if engine_tokens > counted:
        sc.tracker.record_tokens(
            live, engine_tokens - counted, "", live.token_times_s[-1] if live.started else sc.now()
        )
    elif engine_tokens < counted:
        del live.token_times_s[len(live.token_times_s) - (counted - engine_tokens) :]
    if job.attempts == 1 and usage.get("prompt_tokens"):
        job.engine_prompt_tokens = int(usage["prompt_tokens"])
        live.prompt_tokens = job.engine_prompt_tokens
