"""Background refresh of output-length bounds from the sidecar's gRPC analyzer.

An engine step never waits on the network: a daemon thread polls the analyzer and swaps in a new
``{request_key: bound}`` map; the scheduler reads whatever is there. When no refresh has succeeded
for ``stale_after_s`` the data counts as unreachable and the scheduler degrades to stock order.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable

from slo_core.wire.keyring import KeyRing

log = logging.getLogger(__name__)

Fetch = Callable[[], dict[str, int]]


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


def grpc_fetch(target: str, timeout_s: float = 2.0, keys: Callable[[], KeyRing] | None = None) -> Fetch:
    """A fetch function over the sidecar's ``Analyzer.GetBounds`` RPC (all live requests); with a key
    ring each call carries a fresh token (the sidecar refuses calls without one)."""
    import grpc

    from slo_core.wire.callauth import ANALYZER_GET_BOUNDS, METADATA_KEY, call_token
    from slo_proto import slofleet_pb2, slofleet_pb2_grpc

    channel = grpc.insecure_channel(target)
    stub = slofleet_pb2_grpc.AnalyzerStub(channel)

    def fetch() -> dict[str, int]:
        metadata = None
        if keys is not None:
            now_s = time.time()
            metadata = ((METADATA_KEY, call_token(keys().signing_key(now_s), ANALYZER_GET_BOUNDS, now_s)),)
        reply = stub.GetBounds(slofleet_pb2.BoundsRequest(), timeout=timeout_s, metadata=metadata)
        return {b.request_key: int(b.output_bound) for b in reply.bounds}

    return fetch


class AnalyzerClient:
    def __init__(
        self,
        target: str,
        *,
        interval_s: float = 0.2,
        fetch: Fetch | None = None,
        keys: Callable[[], KeyRing] | None = None,
    ) -> None:
        self.target = target
        self._keys = keys
        self._interval_s = interval_s
        self._bounds: dict[str, int] = {}
        self._last_ok = float("-inf")
        self._stop = threading.Event()
        self._fetch = fetch
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="slofleet-analyzer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._fetch is None:
                    self._fetch = grpc_fetch(self.target, keys=self._keys)
                bounds = self._fetch()
                self._bounds = bounds
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

    def close(self) -> None:
        self._stop.set()
