"""The router's cached metric children count into the same series prometheus-client's labels() gives."""

from __future__ import annotations

from prometheus_client import generate_latest

from slo_router.metrics import RouterMetrics


def test_a_cached_child_is_the_labelled_series_and_separate_label_sets_stay_separate() -> None:
    m = RouterMetrics()
    m.of(m.requests, "chat", "acme", "llama", "ok").inc()
    m.of(m.requests, "chat", "acme", "llama", "ok").inc()
    m.of(m.requests, "batch", "acme", "llama", "ok").inc(3)
    m.of(m.ttft, "chat").observe(0.2)
    assert m.of(m.requests, "chat", "acme", "llama", "ok") is m.requests.labels("chat", "acme", "llama", "ok")
    text = generate_latest(m.registry).decode()
    assert 'slofleet_router_requests_total{model="llama",outcome="ok",tenant="acme",tier="chat"} 2.0' in text
    assert 'slofleet_router_requests_total{model="llama",outcome="ok",tenant="acme",tier="batch"} 3.0' in text
    assert 'slofleet_router_ttft_seconds_count{tier="chat"} 1.0' in text
