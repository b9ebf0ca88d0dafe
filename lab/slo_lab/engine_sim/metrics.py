"""Prometheus metrics with vLLM's names (``vllm:*``), one registry per server.

Gauges are read from the engine at scrape time; counters and histograms move as the engine task
delivers tokens and finishes requests. Labels follow vLLM v1: ``model_name`` and ``engine``.
Aborted requests (client gone, or rejected by the policy) count in ``vllm:request_success_total``
with ``finished_reason="abort"``; the slofleet-specific series are prefixed ``slofleet_engine_sim_``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .runner import EngineRunner, Handle

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


class _EngineGauges(Collector):
    """Scrape-time gauges read from the runner (no bookkeeping on the hot path)."""

    def __init__(self, runner: EngineRunner, labels: tuple[str, str]) -> None:
        self.runner = runner
        self.labels = list(labels)

    def collect(self) -> Iterator[Metric]:
        r = self.runner
        values = {
            "vllm:num_requests_running": ("Number of requests in model execution batches.", r.num_running),
            "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", r.num_waiting),
            "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", r.kv_usage),
            "vllm:gpu_cache_usage_perc": ("GPU KV-cache usage (older name).", r.kv_usage),
            "slofleet_engine_sim_behind_seconds": (
                "Total time the simulated GPU fell behind its modelled schedule (host too slow)",
                r.behind_s,
            ),
            "slofleet_engine_sim_policy_degraded": (
                "1 while the policy hook falls back to stock order",
                1.0 if r.policy.degraded_reason else 0.0,
            ),
        }
        for name, (doc, value) in values.items():
            g = GaugeMetricFamily(name, doc, labels=list(LABELS))
            g.add_metric(self.labels, float(value))
            yield g
        e = r.engine
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            labels=["block_size", "num_gpu_blocks", "engine"],
        )
        info.add_metric([str(e.block_size), str(e.kv_blocks_total), "0"], 1.0)
        yield info
        counts = {
            "slofleet_engine_sim_policy_rejections": ("Requests the engine policy rejected.", r.rejected),
            "slofleet_engine_sim_client_aborts": (
                "Requests aborted because the client went away.",
                r.aborted,
            ),
            "slofleet_engine_sim_unsigned_tags": (
                "Requests whose SLO tags were unsigned, forged or stale (scheduled best-effort).",
                r.unsigned_tags,
            ),
        }
        for name, (doc, value) in counts.items():
            c = CounterMetricFamily(name, doc, labels=list(LABELS))
            c.add_metric(self.labels, float(value))
            yield c

    def describe(self) -> Iterator[Metric]:
        return iter(())


class EngineMetrics:
    """The ``/metrics`` registry of one engine-sim server; a listener of its EngineRunner."""

    def __init__(self, runner: EngineRunner) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        lv = (runner.model_name, "0")
        self._preemptions_seen = 0
        self.runner = runner

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=reg)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*lv)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*lv)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.").labels(*lv)
        self.success = Counter(
            "vllm:request_success", "Count of finished requests.", (*LABELS, "finished_reason"), registry=reg
        )
        for reason in FINISHED_REASONS:  # present from the start, as in vLLM
            self.success.labels(*lv, reason)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S).labels(
            *lv
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS_S).labels(*lv)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS_S
        ).labels(*lv)
        self.queue = hist(
            "vllm:request_queue_time_seconds", "Time spent waiting before first scheduled.", E2E_BUCKETS_S
        ).labels(*lv)
        self.req_prompt = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens of finished requests.", TOKEN_BUCKETS
        ).labels(*lv)
        self.req_generation = hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens of finished requests.",
            TOKEN_BUCKETS,
        ).labels(*lv)
        self.tpot_request = hist(
            "vllm:request_time_per_output_token_seconds", "Mean time per output token.", ITL_BUCKETS_S
        ).labels(*lv)
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "The max_tokens request parameter.", TOKEN_BUCKETS
        ).labels(*lv)
        self.request_preemptions = hist(
            "vllm:request_num_preemptions", "Preemptions of finished requests.", (0, 1, 2, 5, 10, 20, 50)
        ).labels(*lv)
        self.prefill = hist(
            "vllm:request_prefill_time_seconds", "Time from first scheduled to first token.", E2E_BUCKETS_S
        ).labels(*lv)
        self.decode = hist(
            "vllm:request_decode_time_seconds", "Time from first token to last token.", E2E_BUCKETS_S
        ).labels(*lv)
        self.inference = hist(
            "vllm:request_inference_time_seconds", "Time from first scheduled to last token.", E2E_BUCKETS_S
        ).labels(*lv)
        self._lv = lv
        reg.register(_EngineGauges(runner, lv))
        runner.listeners.append(self)

    def on_tokens(self, h: Handle, n: int, t: float) -> None:
        """``n`` new tokens at ``t`` (called before the handle records them)."""
        if h.first_token_s is None:  # prefill done
            self.prompt_tokens.inc(h.sub.prompt_tokens)
            self.ttft.observe(max(0.0, t - h.sim.arrival_s))
            if h.sim.first_scheduled_s is not None:
                self.queue.observe(max(0.0, h.sim.first_scheduled_s - h.sim.arrival_s))
        elif h.last_token_s is not None:
            gap_s = max(0.0, t - h.last_token_s)
            self.itl.observe(gap_s)
        self.generation_tokens.inc(n)
        self._sync_preemptions()

    def on_finish(self, h: Handle, reason: str, t: float) -> None:
        self.success.labels(*self._lv, reason).inc()
        self.e2e.observe(max(0.0, t - h.sim.arrival_s))
        self.req_prompt.observe(h.sub.prompt_tokens)
        self.req_generation.observe(h.seen_tokens)
        self.params_max_tokens.observe(h.sub.max_tokens)
        self.request_preemptions.observe(h.sim.preemptions)
        if h.first_token_s is not None and h.last_token_s is not None and h.seen_tokens > 1:
            self.tpot_request.observe((h.last_token_s - h.first_token_s) / (h.seen_tokens - 1))
        scheduled = h.sim.first_scheduled_s
        if scheduled is not None and h.first_token_s is not None and h.last_token_s is not None:
            self.prefill.observe(max(0.0, h.first_token_s - scheduled))
            self.decode.observe(max(0.0, h.last_token_s - h.first_token_s))
            self.inference.observe(max(0.0, h.last_token_s - scheduled))
        self._sync_preemptions()

    def _sync_preemptions(self) -> None:
        total = self.runner.engine.preemptions
        if total > self._preemptions_seen:
            self.preemptions.inc(total - self._preemptions_seen)
            self._preemptions_seen = total
