"""The plugin's own Prometheus metrics, served from the EngineCore process when a port is configured.

vLLM's ``/metrics`` lives in the API-server process; the scheduler runs in EngineCore, so the plugin
exposes ``slofleet_plugin_*`` series on ``SLOFLEET_METRICS_PORT`` (and keeps counts in memory for
tests either way).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class PluginMetrics:
    def __init__(self, port: int | None) -> None:
        self.decisions = 0
        self.quiet_skipped = 0
        self.preemptions = 0
        self.rejections = 0
        self.is_degraded = False
        self.unsigned_tags = 0
        self._prom: dict[str, Any] = {}
        if port is not None:
            self._serve(port)

    def _serve(self, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
        except ImportError:
            log.warning("prometheus_client missing: plugin metrics not served")
            return
        reg = CollectorRegistry()
        self._prom = {
            "decisions": Histogram(
                "slofleet_plugin_decision_seconds", "Policy decision latency", registry=reg
            ),
            "quiet": Counter(
                "slofleet_plugin_quiet_decisions_skipped",
                "Decisions left out as quiet (nothing waits, every running request decodes)",
                registry=reg,
            ),
            "preemptions": Counter("slofleet_plugin_preemptions", "Preemptions applied", registry=reg),
            "rejections": Counter("slofleet_plugin_rejections", "Requests rejected by policy", registry=reg),
            "unsigned": Counter(
                "slofleet_plugin_unsigned_tags_total",
                "requests whose SLO tags were unsigned, forged or stale (scheduled best-effort)",
                ["reason"],
                registry=reg,
            ),
            "degraded": Gauge(
                "slofleet_plugin_degraded",
                "1 while scheduling falls back to vLLM's stock order",
                registry=reg,
            ),
        }
        start_http_server(port, addr="0.0.0.0", registry=reg)

    def decision(self, seconds: float) -> None:
        self.decisions += 1
        if self._prom:
            self._prom["decisions"].observe(seconds)

    def quiet(self) -> None:
        self.quiet_skipped += 1
        if self._prom:
            self._prom["quiet"].inc()

    def preemption(self) -> None:
        self.preemptions += 1
        if self._prom:
            self._prom["preemptions"].inc()

    def rejection(self) -> None:
        self.rejections += 1
        if self._prom:
            self._prom["rejections"].inc()

    def unsigned(self, reason: str) -> None:
        self.unsigned_tags += 1
        if self._prom:
            self._prom["unsigned"].labels(reason).inc()

    def degraded(self, value: bool) -> None:
        self.is_degraded = value
        if self._prom:
            self._prom["degraded"].set(1 if value else 0)
