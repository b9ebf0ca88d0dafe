"""Talking to the engine (vLLM's OpenAI API or engine-sim): streamed generation, health and load probes.

Every call has a timeout. Generation goes over :mod:`slo_net.upstream` (probes over httpx). A
streamed request streams upstream with continuous usage stats, and its chunks are relayed as bytes:
the token count and finish reason are read off the bytes (:func:`completion_tokens`,
:func:`finish_reason`), never by parsing the JSON. A non-streamed request is sent non-streamed and the
engine's body is passed through (:func:`complete`). Leaving :func:`stream_events` early
(cancellation, preemption) closes the connection, which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from slo_core.wire import openai
from slo_net.upstream import UpstreamError, UpstreamPool, UpstreamResponse

log = logging.getLogger(__name__)


class EngineUnavailable(Exception):
    """The engine failed (connection, 5xx, 429, a broken stream); the message says how."""


class EngineRejected(Exception):
    """The engine refused the request as invalid (4xx): the client has to change it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error_message(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace")
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))
    if isinstance(doc, dict) and "message" in doc:
        return str(doc["message"])
    return str(err or doc)[:200]


async def _sse_data(resp: UpstreamResponse) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of an SSE byte stream, one list per read of the socket (events end with a
    blank line; reads split anywhere): what arrived together is relayed together, as a byte relay
    writes one read at once."""
    buf = b""
    while data := await resp.readany():
        piece = data.replace(b"\r\n", b"\n") if b"\r" in data else data
        buf = buf + piece if buf else piece
        if b"\n\n" not in buf:
            continue
        *events, buf = buf.split(b"\n\n")
        payloads = []
        for event in events:
            if event.startswith(b"data:") and b"\n" not in event:  # the usual shape: one data line
                payloads.append(event[5:].strip())
                continue
            payloads.extend(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if payloads:
            yield payloads


def new_session() -> UpstreamPool:
    """The generation client (the router's too: less CPU per request and per chunk than aiohttp's or
    httpx's, measured in bench/path_overhead.py)."""
    # idle connections go before the engine's server closes them (uvicorn: 5 s), or a reused one fails
    # with a lost connection (seen live: one 503 per race)
    return UpstreamPool(keepalive_s=2.0, connect_timeout_s=5.0)


async def _post(
    session: UpstreamPool,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    read_timeout_s: float | None,
) -> UpstreamResponse:
    data = json.dumps(body, separators=(",", ":")).encode()
    try:
        resp = await session.post(
            url, data, {**headers, "content-type": "application/json"}, read_timeout_s=read_timeout_s
        )
    except (TimeoutError, UpstreamError, OSError) as exc:
        raise _failed(exc) from None
    return resp


async def _check_status(resp: UpstreamResponse) -> None:
    if resp.status != 200:
        message = _error_message(await resp.read())
        if 400 <= resp.status < 500 and resp.status not in (408, 429):
            raise EngineRejected(resp.status, message)
        raise EngineUnavailable(f"engine answered {resp.status}: {message}")


def _failed(exc: BaseException) -> EngineUnavailable:
    if isinstance(exc, TimeoutError):
        return EngineUnavailable("engine timed out (connect, or silent past the read timeout)")
    return EngineUnavailable(f"engine connection failed ({type(exc).__name__})")


async def stream_events(
    session: UpstreamPool,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    read_timeout_s: float,
) -> AsyncIterator[list[bytes]]:
    """Yield the engine's SSE payloads as sent (unparsed), those of one read together, until ``[DONE]``;
    failures raise, never hang.

    A payload carrying an ``error`` object raises :class:`EngineUnavailable` (after the payloads that
    came before it); everything else is the caller's to read (cheaply: :func:`completion_tokens`,
    :func:`finish_reason`).
    """
    resp = await _post(session, url, body, headers, read_timeout_s)
    try:
        await _check_status(resp)
        async for batch in _sse_data(resp):
            for i, payload in enumerate(batch):
                if payload == openai.DONE_PAYLOAD:
                    if i:
                        yield batch[:i]
                    await _finish(resp)
                    return
                failure = _error_of(payload) if b'"error"' in payload else None  # rare: parsed then
                if failure is not None:
                    if i:
                        yield batch[:i]  # what the engine sent before it failed reaches the client
                    raise failure
            yield batch
    except (TimeoutError, UpstreamError) as exc:
        raise _failed(exc) from None
    finally:
        resp.close()  # before the end of the answer this aborts the request in the engine
    raise EngineUnavailable("engine closed the stream before it finished")


# after [DONE], how long and how much the rest of the answer (the chunked body's terminator, which
# the engine's server writes on its own a moment later) may take before the connection is dropped
FINISH_WAIT_S = 0.05
FINISH_MAX_BYTES = 4096


async def _finish(resp: UpstreamResponse) -> None:
    """Read the end of an answer whose ``[DONE]`` came, so that its connection goes back to the pool
    (closed before the end, it would be aborted); a pod that sends more, or is slow to end, loses the
    connection instead (the caller's ``close``)."""
    left = FINISH_MAX_BYTES
    try:
        async with asyncio.timeout(FINISH_WAIT_S):
            while not resp.complete and left > 0:
                left -= len(await resp.readany())
    except (TimeoutError, UpstreamError):
        pass


def _error_of(payload: bytes) -> EngineUnavailable | None:
    """The failure a payload reports (an ``error`` object, or a malformed event); None: a normal one."""
    try:
        chunk = json.loads(payload)
    except ValueError:
        return EngineUnavailable("engine sent a malformed stream event")
    if not isinstance(chunk, dict):
        return EngineUnavailable("engine sent a malformed stream event")
    if "error" in chunk:
        return EngineUnavailable(f"engine failed: {_error_message(payload)}")
    return None


async def complete(session: UpstreamPool, url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    """One non-streamed generation: the engine's response body as sent (the caller passes it through).

    The engine is silent until the whole answer is ready, so no read timeout applies here: the
    request's own time limit (``request_timeout_s``, the caller's) bounds it.
    """
    resp = await _post(session, url, body, headers, None)
    try:
        await _check_status(resp)
        return await resp.read()
    except (TimeoutError, UpstreamError) as exc:
        raise _failed(exc) from None
    finally:
        resp.close()


# ---- reading a chunk without parsing it ----------------------------------------------------------
_TOKENS_KEY = b'"completion_tokens":'
_FINISH_KEY = b'"finish_reason":'


def completion_tokens(payload: bytes) -> int | None:
    """``usage.completion_tokens`` of a chunk (continuous usage stats), read off the bytes; None: absent."""
    i = payload.rfind(_TOKENS_KEY)
    if i < 0:
        return None
    i += len(_TOKENS_KEY)
    j = i
    n = len(payload)
    while j < n and payload[j] in b" \t":
        j += 1
    k = j
    while k < n and 48 <= payload[k] <= 57:
        k += 1
    return int(payload[j:k]) if k > j else None


def finish_reason(payload: bytes) -> str | None:
    """The first choice's ``finish_reason`` read off the bytes (None: null or absent)."""
    i = payload.find(_FINISH_KEY)
    if i < 0:
        return None
    i += len(_FINISH_KEY)
    while i < len(payload) and payload[i] in b" \t":
        i += 1
    if payload[i : i + 1] != b'"':
        return None
    j = payload.find(b'"', i + 1)
    return payload[i + 1 : j].decode("ascii", "replace") if j > i else None


def strip_usage(payload: bytes) -> bytes | None:
    """The chunk without its trailing ``"usage"`` object (vLLM and engine-sim write it last), or None
    when the bytes do not have that shape (the caller re-encodes then)."""
    i = payload.rfind(b',"usage":{')
    if i < 0 or not payload.endswith(b"}}") or b"{" in payload[i + 10 :]:
        return None
    return payload[:i] + b"}"


# a probe that times out means a busy engine (or a starved host), not a dead one: the engine counts as
# down only when nothing (probe or streamed token) has been heard from it for this long
SLOW_DOWN_AFTER_S = 10.0


@dataclass
class EngineStatus:
    """The last probe of the engine (health, load, served models).

    ``last_heard_s``: when the engine last answered a probe or streamed a token (monotonic seconds).
    A refused connection or a failing ``/health`` marks the engine down at once; probes that time out
    do so only after ``SLOW_DOWN_AFTER_S`` of silence, so a loaded engine that is still serving is not
    taken out of routing (the simulator has no such outage, and live admission must match it).
    """

    healthy: bool = False
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    models: list[str] = field(default_factory=list)
    max_model_len: int = 0
    error: str = "not probed yet"
    last_heard_s: float | None = None
    slow_probes: int = 0  # probes that timed out while the engine still counted as up


_GAUGES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
}


async def probe(
    client: httpx.AsyncClient,
    base_url: str,
    status: EngineStatus,
    timeout_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Refresh ``status`` from ``/health``, ``/metrics`` and (once) ``/v1/models``."""
    try:
        resp = await client.get(base_url + "/health", timeout=timeout_s)
        status.last_heard_s = clock()
        status.healthy = resp.status_code == 200
        status.error = "" if status.healthy else f"engine /health answered {resp.status_code}"
        if not status.healthy:
            return
        if not status.models:
            models = (await client.get(base_url + "/v1/models", timeout=timeout_s)).json()
            data = models.get("data", []) if isinstance(models, dict) else []
            status.models = [str(m.get("id")) for m in data if isinstance(m, dict)]
            lens = [int(m.get("max_model_len") or 0) for m in data if isinstance(m, dict)]
            status.max_model_len = max(lens, default=0)
        metrics = await client.get(base_url + "/metrics", timeout=timeout_s)
        if metrics.status_code == 200:
            _read_load(metrics.text, status)
    except httpx.TimeoutException as exc:
        heard = status.last_heard_s
        if status.healthy and heard is not None and clock() - heard < SLOW_DOWN_AFTER_S:
            status.slow_probes += 1  # busy, not gone: keep routing to it
            return
        status.healthy = False
        status.error = f"engine silent ({type(exc).__name__}) for over {SLOW_DOWN_AFTER_S:g} s"
    except (httpx.HTTPError, ValueError) as exc:
        status.healthy = False
        status.error = f"engine unreachable ({type(exc).__name__})"


def _read_load(text: str, status: EngineStatus) -> None:
    """Sum the few load gauges over their label sets; every other line is skipped unparsed (cheap)."""
    seen: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        attr = _GAUGES.get(name)
        if attr is None:
            continue
        try:
            seen[attr] = seen.get(attr, 0.0) + float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    status.waiting = int(seen.get("waiting", 0))
    status.running = int(seen.get("running", 0))
    status.kv_usage = float(seen.get("kv_usage", 0.0))
