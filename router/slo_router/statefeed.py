"""Follow every endpoint's sidecar state stream (gRPC ``State.Watch``) into the endpoint table.

One task per endpoint that has a gRPC target; tasks start and stop as endpoints come and go. Each
snapshot becomes the endpoint's :class:`ReplicaView` (placed on the router's clock with its age, so
GoRouting compensates for staleness). When a stream ends, fails, or goes silent for ``stale_after_s``
the endpoint is marked unusable until a new snapshot arrives, and a silent stream is cancelled (gRPC
keepalive pings notice a dead connection; a live one that stops sending is cut after ``stale_after_s``)
and reconnected; reconnects back off exponentially. Snapshots are read against the tiers of the policy
in force at that moment (``tiers`` may be a callable: the router passes its current config's).
The router's load view therefore comes only from the sidecars: replicas of the router never talk.
With a key ring (``keys``, the tag-key Secret followed live) each Watch carries a fresh call token
(``slo_core.wire.callauth``); sidecars refuse calls without one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import grpc

from slo_core.slo import SLOTier
from slo_core.wire.callauth import METADATA_KEY, STATE_WATCH, call_token
from slo_core.wire.keepalive import CLIENT_OPTIONS
from slo_core.wire.keyring import KeyRing
from slo_proto import slofleet_pb2, slofleet_pb2_grpc
from slo_router.endpoints import EndpointState
from slo_router.podstate import capabilities_of, replica_view, snapshot_age_s

log = logging.getLogger(__name__)

Tiers: TypeAlias = Mapping[str, SLOTier]


class StaleStream(Exception):
    """The stream is open but sent nothing for ``stale_after_s``."""


class StateFeed:
    """Keeps one watcher per endpoint; ``run`` reconciles the watchers with the table forever."""

    def __init__(
        self,
        endpoints: dict[str, EndpointState],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        interval_ms: int = 100,
        stale_after_s: float = 10.0,
        backoff_s: tuple[float, float] = (0.1, 5.0),
        on_snapshot: Callable[[str], None] | None = None,
        tiers: Tiers | Callable[[], Tiers] | None = None,
        keys: Callable[[], KeyRing] | None = None,
    ) -> None:
        self.keys = keys
        self.endpoints = endpoints
        self.clock, self.wall_clock = clock, wall_clock
        self.interval_ms = interval_ms
        self.stale_after_s = stale_after_s
        self.backoff_s = backoff_s
        self.on_snapshot = on_snapshot
        if callable(tiers):
            self._tiers: Callable[[], Tiers] = tiers
        else:
            fixed: Tiers = dict(tiers or {})
            self._tiers = lambda: fixed
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}

    async def run(self, poll_s: float = 0.1) -> None:
        try:
            last_tick = self.clock()
            while True:
                self.reconcile()
                now = self.clock()
                if now - last_tick < poll_s + 1.0:  # after a stall of our own loop, blame no pod yet
                    self._expire_stale()
                last_tick = now
                await asyncio.sleep(poll_s)
        finally:
            await self.close()

    def reconcile(self) -> None:
        """Start watchers for new endpoints (or changed targets); stop those of endpoints that left."""
        for ep_id, (target, task) in list(self._tasks.items()):
            ep = self.endpoints.get(ep_id)
            if ep is None or ep.spec.grpc_target != target or task.done():
                task.cancel()
                del self._tasks[ep_id]
        for ep_id, ep in self.endpoints.items():
            wanted = ep.spec.grpc_target
            if wanted and ep_id not in self._tasks:
                task = asyncio.create_task(self._follow(ep_id, wanted), name=f"statefeed-{ep_id}")
                self._tasks[ep_id] = (wanted, task)

    def _expire_stale(self) -> None:
        now = self.clock()
        for ep in self.endpoints.values():
            if ep.feed_ok and ep.last_state_s is not None and now - ep.last_state_s > self.stale_after_s:
                log.warning(
                    "no state from %s for %.1f s: marking it unusable",
                    ep.spec.endpoint_id,
                    now - ep.last_state_s,
                )
                ep.feed_lost()

    async def close(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _follow(self, ep_id: str, target: str) -> None:
        delay_s = self.backoff_s[0]
        while True:
            got_one = False
            try:
                got_one = await self._watch_once(ep_id, target)
            except grpc.aio.AioRpcError as exc:
                log.info("state stream of %s ended: %s", ep_id, exc.code().name)
            except StaleStream:
                log.warning("state stream of %s silent for %.1f s: reconnecting", ep_id, self.stale_after_s)
                got_one = False  # back off: a pod that hangs its stream is not hammered
            ep = self.endpoints.get(ep_id)
            if ep is None:
                return
            if ep.feed_ok is not False:
                log.warning("state stream of %s lost: marking it unusable", ep_id)
            ep.feed_lost()
            delay_s = self.backoff_s[0] if got_one else min(self.backoff_s[1], delay_s * 2)
            await asyncio.sleep(delay_s)

    async def _watch_once(self, ep_id: str, target: str) -> bool:
        """Read one Watch stream until it ends; True when at least one snapshot arrived."""
        got_one = False
        async with grpc.aio.insecure_channel(target, options=list(CLIENT_OPTIONS)) as channel:
            stub: Any = slofleet_pb2_grpc.StateStub(channel)
            metadata = None
            if self.keys is not None:
                now_s = self.wall_clock()
                token = call_token(self.keys().signing_key(now_s), STATE_WATCH, now_s)
                metadata = ((METADATA_KEY, token),)
            call = stub.Watch(slofleet_pb2.WatchRequest(interval_ms=self.interval_ms), metadata=metadata)
            messages = call.__aiter__()
            while True:
                try:
                    async with asyncio.timeout(self.stale_after_s):
                        msg = await messages.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    call.cancel()
                    raise StaleStream from None
                ep = self.endpoints.get(ep_id)
                if ep is None:
                    call.cancel()
                    return got_one
                now, wall = self.clock(), self.wall_clock()
                ep.update_lazy(
                    functools.partial(
                        replica_view, msg, replica_id=ep_id, now_s=now, wall_now_s=wall, tiers=self._tiers()
                    ),
                    snapshot_s=now - snapshot_age_s(msg, wall),
                    healthy=bool(msg.healthy) and not msg.draining,
                    capabilities=capabilities_of(msg),
                    now_s=now,
                )
                got_one = True
                if self.on_snapshot is not None:
                    self.on_snapshot(ep_id)
        return got_one


async def follow_states(state: Any, keys: Callable[[], KeyRing] | None = None) -> None:
    """Background job for the app factory: follow the sidecars of ``state.endpoints``."""
    await StateFeed(state.endpoints, clock=state.clock, tiers=lambda: state.config.tiers, keys=keys).run()
