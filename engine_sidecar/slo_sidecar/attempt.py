"""One upstream attempt of a request: the engine's chunks, timestamped and relayed to the client.

Each engine chunk's tokens are timestamped in the tracker and the chunk goes to the HTTP handler as the
engine sent it; after a preemption, continuation chunks are re-stamped with the first attempt's id so
the client sees one stream. Usage is the sidecar's own sum over attempts: the prompt as the client sent
it, every completion token of every attempt (framing in :mod:`slo_sidecar.streaming`).

What an attempt needs of the sidecar is :class:`AttemptHost` (the service implements it), so this
module depends on no service type and the service imports it, never the reverse.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from slo_core.wire import openai
from slo_sidecar.config import SidecarKnobs
from slo_sidecar.engine_client import EngineStatus, stream_chunks
from slo_sidecar.front import CHAT
from slo_sidecar.job import Job
from slo_sidecar.streaming import sse
from slo_sidecar.tracker import Tracker


class AttemptHost(Protocol):
    """The sidecar as an attempt sees it."""

    client: httpx.AsyncClient | None
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


async def run_attempt(sc: AttemptHost, job: Job, body: dict[str, Any]) -> str:
    """Stream one attempt to its end; raises EngineUnavailable/EngineRejected; cancellation aborts it."""
    live, chat = job.live, job.parsed.endpoint == CHAT
    path = "/v1/chat/completions" if chat else "/v1/completions"
    headers = {"x-request-id": f"{live.request_id}-{job.attempts}"}
    counted = 0
    usage: dict[str, Any] | None = None
    client = sc.client
    assert client is not None
    async for chunk, raw in stream_chunks(
        client, sc.engine_url + path, body, headers, sc.knobs.upstream_read_timeout_s
    ):
        now = sc.engine.last_heard_s = sc.now()  # a streaming engine is alive, whatever probes see
        choices = chunk.get("choices") or []
        running_usage = chunk.get("usage")
        if isinstance(running_usage, dict):
            usage = running_usage
        if not choices:
            continue
        choice = choices[0] if isinstance(choices[0], dict) else {}
        text = _choice_text(choice, chat)
        if choice.get("finish_reason"):
            job.finish_reason = str(choice["finish_reason"])
        # continuous usage stats count the tokens of a chunk exactly (an engine merges tokens that piled up)
        n_tokens = (
            int(running_usage.get("completion_tokens") or 0) - counted
            if isinstance(running_usage, dict)
            else int(bool(text))
        )
        if n_tokens > 0:
            counted += n_tokens
            sc.tracker.record_tokens(live, n_tokens, text, now)
            sc.refine_later(job)
        elif job.attempts > 1 and not text and not choice.get("finish_reason"):
            continue  # a continuation's opening role chunk: the client already has one
        if job.stream_id is None:
            job.stream_id = str(chunk.get("id") or job.request_id)
        if job.attempts == 1 and (running_usage is None or job.parsed.include_usage):
            job.emit("chunk", openai.sse_event(raw))  # as the engine sent it: no re-encoding
            continue
        if chat and isinstance(choice.get("delta"), dict):
            choice["delta"].pop("role", None)
        chunk["id"] = job.stream_id  # one id for the client across preemptions
        chunk.pop("usage", None)
        job.emit("chunk", sse(chunk))
    if usage is not None:
        _settle_usage(sc, job, usage, counted)
    return "done"


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
