"""Background exchange with the sidecar's gRPC analyzer: bounds in, the engine view out (engine mode).

An engine step never waits on the network: a daemon thread talks to the analyzer and swaps in a new
``{request_key: bound}`` map; the scheduler reads whatever is there. Once the scheduler publishes
snapshots (:meth:`AnalyzerClient.publish`), each round trip is one ``Analyzer.Report`` (the newest
snapshot and the requests that finished since, answered with the bounds of the live requests);
before that it polls ``Analyzer.GetBounds``. When no exchange has succeeded for ``stale_after_s`` the
data counts as unreachable and the scheduler degrades to stock order; in between, a slow analyzer
means the last bounds it sent.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from slo_core.wire.keyring import KeyRing
from slo_vllm_plugin.report import EngineSnapshot, Finished, to_report

log = logging.getLogger(__name__)

Fetch = Callable[[], dict[str, int]]
# a report out; the live requests' bounds and (compound calls) stage sub-deadlines, unix seconds, back
Send = Callable[[Any], tuple[dict[str, int], dict[str, float]]]
MAX_FINISHED = 100_000  # finished rows kept while the analyzer is away (oldest dropped first)


@functools.lru_cache(maxsize=8)
def _channel(target: str) -> Any:
    """One stub (one HTTP/2 channel) per analyzer address, shared by GetBounds and Report."""
    import grpc

    from slo_proto import slofleet_pb2_grpc

    return slofleet_pb2_grpc.AnalyzerStub(grpc.insecure_channel(target))


def client_problem() -> str | None:
    """Why the analyzer client cannot work in this image (None: it can), checked once at start.

    The generated stubs refuse an older grpcio or protobuf than they were made with; inside a vLLM image
    that would otherwise only show as an analyzer that never answers."""
    try:
        importlib.import_module("grpc")
        importlib.import_module("slo_proto.slofleet_pb2_grpc")
    except Exception as exc:  # ImportError, or the stubs' RuntimeError on an older grpcio/protobuf
        return f"the analyzer client cannot load ({type(exc).__name__}: {exc})"
    return None


def _metadata(keys: Callable[[], KeyRing] | None, method: str) -> Any:
    """With a key ring, a fresh call token for ``method`` (the sidecar refuses calls without one)."""
    if keys is None:
        return None
    from slo_core.wire.callauth import METADATA_KEY, call_token

    now_s = time.time()
    return ((METADATA_KEY, call_token(keys().signing_key(now_s), method, now_s)),)


def grpc_fetch(target: str, timeout_s: float = 2.0, keys: Callable[[], KeyRing] | None = None) -> Fetch:
    """A fetch function over the sidecar's ``Analyzer.GetBounds`` RPC (all live requests)."""
    from slo_core.wire.callauth import ANALYZER_GET_BOUNDS
    from slo_proto import slofleet_pb2

    stub = _channel(target)

    def fetch() -> dict[str, int]:
        metadata = _metadata(keys, ANALYZER_GET_BOUNDS)
        reply = stub.GetBounds(slofleet_pb2.BoundsRequest(), timeout=timeout_s, metadata=metadata)
        return {b.request_key: int(b.output_bound) for b in reply.bounds}

    return fetch


def grpc_send(target: str, timeout_s: float = 2.0, keys: Callable[[], KeyRing] | None = None) -> Send:
    """A send function over ``Analyzer.Report``: the report out, the live requests' bounds back."""
    from slo_core.wire.callauth import ANALYZER_REPORT

    stub = _channel(target)

    def send(report: Any) -> tuple[dict[str, int], dict[str, float]]:
        reply = stub.Report(report, timeout=timeout_s, metadata=_metadata(keys, ANALYZER_REPORT))
        bounds = {b.request_key: int(b.output_bound) for b in reply.bounds}
        return bounds, {b.request_key: b.deadline_unix_s for b in reply.bounds if b.deadline_unix_s > 0}

    return send


class AnalyzerClient:
    def __init__(
        self,
        target: str,
        *,
        interval_s: float = 0.2,
        fetch: Fetch | None = None,
        keys: Callable[[], KeyRing] | None = None,
        send: Send | None = None,
    ) -> None:
        self.target = target
        self._keys = keys
        self._interval_s = interval_s
        self._bounds: dict[str, int] = {}
        self._deadlines: dict[str, float] = {}
        self._last_ok = float("-inf")
        self._stop = threading.Event()
        self._fetch = fetch
        self._send = send
        self._snapshot: EngineSnapshot | None = None
        self._finished: deque[Finished] = deque(maxlen=MAX_FINISHED)
        self.failures = 0
        self.reports = 0
        self._thread = threading.Thread(target=self._run, name="slofleet-analyzer", daemon=True)
        self._thread.start()

    # ---- called from the engine step (cheap: a reference swap, a deque append) ---------------------
    def publish(self, snapshot: EngineSnapshot) -> None:
        """The newest engine view; the thread sends it with its next exchange."""
        self._snapshot = snapshot

    def finished(self, rows: list[Finished]) -> None:
        self._finished.extend(rows)

    @property
    def publishing(self) -> bool:
        return self._snapshot is not None

    # ---- the thread --------------------------------------------------------------------------------
    def _exchange(self) -> dict[str, int]:
        snapshot = self._snapshot
        if snapshot is None:
            if self._fetch is None:
                self._fetch = grpc_fetch(self.target, keys=self._keys)
            return self._fetch()
        if self._send is None:
            self._send = grpc_send(self.target, keys=self._keys)
        done = [self._finished.popleft() for _ in range(len(self._finished))]
        try:
            bounds, self._deadlines = self._send(to_report(snapshot, done))
        except Exception:
            self._finished.extendleft(reversed(done))  # sent again with the next report
            raise
        self.reports += 1
        return bounds

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._bounds = self._exchange()
                self._last_ok = time.monotonic()
            except Exception as exc:  # any failure is "unreachable"; the scheduler degrades
                self.failures += 1
                if self.failures == 1 or self.failures % 100 == 0:
                    log.warning("analyzer %s unreachable (%d failures): %s", self.target, self.failures, exc)
            self._stop.wait(self._interval_s)

    def bounds_if_fresh(self, stale_after_s: float) -> dict[str, int] | None:
        if time.monotonic() - self._last_ok > stale_after_s:
            return None
        return self._bounds

    def deadlines(self) -> dict[str, float]:
        """Stage sub-deadlines of compound calls from the last report's answer (unix seconds)."""
        return self._deadlines

    def close(self) -> None:
        self._stop.set()
