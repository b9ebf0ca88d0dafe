"""A plugin that degrades says so: at start when its analyzer client cannot load in the image, and on
its metrics port in the very form the operator reads (``slo_operator.pluginhealth``)."""

from __future__ import annotations

import socket
import sys

import pytest

from slo_operator.pluginhealth import degraded_in, scrape
from slo_vllm_plugin.analyzer_client import client_problem
from slo_vllm_plugin.metrics import PluginMetrics


def test_an_image_whose_grpc_stubs_cannot_load_is_named_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_problem() is None
    monkeypatch.setitem(sys.modules, "slo_proto.slofleet_pb2_grpc", None)  # as an import that fails
    problem = client_problem()
    assert problem is not None and "cannot load" in problem and "ModuleNotFoundError" in problem


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_operator_reads_the_degraded_gauge_the_plugin_serves() -> None:
    port = free_port()
    metrics = PluginMetrics(port)
    url = f"http://127.0.0.1:{port}/metrics"
    assert scrape(url) is False
    metrics.degraded(True)
    assert scrape(url) is True
    metrics.degraded(False)
    assert scrape(url) is False
    assert scrape(f"http://127.0.0.1:{free_port()}/metrics") is None, "no answer: not counted"
    assert degraded_in("other_metric 1\n") is None
