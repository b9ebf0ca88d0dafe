"""gRPC keepalive of the state streams (router client, sidecar server): a half-open stream is noticed.

The router pings every ``KEEPALIVE_TIME_MS`` even while no message flows and drops the connection when a
ping goes unanswered for ``KEEPALIVE_TIMEOUT_MS``; the sidecar's server must accept pings that often or
it would answer them with GOAWAY (too_many_pings).
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000

CLIENT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
)
