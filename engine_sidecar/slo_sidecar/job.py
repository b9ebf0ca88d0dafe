"""A request's journey through the sidecar: queue, release, upstream attempts, events to the HTTP handler.

The generation runs in its own task and talks to the handler through ``events`` (``chunk``,
``done``, ``error``), so the handler decides the HTTP status at the first event and a client
disconnect cancels exactly one task (which closes the upstream connection: the engine aborts).
Once a stream's response has started, it installs a ``sink``: the generation task then writes each
chunk straight to the client (:meth:`Job.write`, no queue hop per chunk); the end still comes as an
event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from slo_sidecar.errors import APIError
from slo_sidecar.front import ParsedBody
from slo_sidecar.tracker import LiveRequest

Event = tuple[str, Any]


@dataclass(eq=False)  # identity: queues find and remove this very job
class Job:
    """One accepted request with its scheduling state."""

    live: LiveRequest
    parsed: ParsedBody
    created_unix_s: int = field(default_factory=lambda: int(time.time()))
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    rejection: APIError | None = None
    engine_priority: int | None = None
    attempt_task: asyncio.Task[str] | None = None
    preempting: bool = False
    attempts: int = 0
    finish_reason: str | None = None
    engine_prompt_tokens: int | None = None
    terminal: bool = False
    stream_id: str | None = None
    raw_chunks: list[bytes] = field(default_factory=list)  # streamed chunks whose text is not decoded yet
    response_body: bytes | None = None  # non-streamed: the engine's answer, passed through as sent
    sink: Callable[[bytes], Awaitable[None]] | None = None  # the started stream's writer (see write)

    @property
    def request_id(self) -> str:
        return self.live.request_id

    def reject(self, err: APIError) -> None:
        """Admission control refused it while it waited: the generation task raises ``err``."""
        self.rejection = err
        self.released.set()

    def release(self, priority: int | None) -> None:
        self.engine_priority = priority
        self.live.phase = "prefill"
        self.released.set()

    def preempt(self) -> bool:
        """Abort the upstream attempt; the request waits again and resumes as a continuation."""
        if not self.parsed.resumable or self.terminal:
            return False
        self.released.clear()
        self.live.phase = "waiting"
        self.live.preemptions += 1
        task = self.attempt_task
        if task is not None and not task.done():
            self.preempting = True
            task.cancel()
        return True

    async def write(self, data: bytes) -> None:
        """A streamed chunk for the client: written through the sink once the response has started
        (a slow client holds the generation back), queued as an event before."""
        sink = self.sink
        if sink is None:
            self.events.put_nowait(("chunk", data))
            return
        try:
            await sink(data)
        except asyncio.CancelledError:
            # cancelled (a preemption, the time limit) while waiting for a slow client to drain: the
            # server writes only after that wait, so the chunk goes through the queue, and so does
            # everything after it until the response has caught up (it installs the sink again)
            self.sink = None
            self.events.put_nowait(("chunk", data))
            raise

    def emit(self, kind: str, payload: Any = None) -> None:
        if kind in ("done", "error"):
            if self.terminal:
                return
            self.terminal = True
        self.events.put_nowait((kind, payload))
