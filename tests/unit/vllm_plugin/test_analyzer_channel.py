"""The plugin's analyzer client keeps one gRPC channel per sidecar address.

It polls ``GetBounds`` until the scheduler publishes and then switches to ``Report``; both calls must
ride the same HTTP/2 connection rather than open a second one to the same sidecar.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from slo_vllm_plugin import analyzer_client
from slo_vllm_plugin.analyzer_client import grpc_fetch, grpc_send


def test_fetch_and_report_share_one_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = grpc.insecure_channel

    def counting(target: str, *args: Any, **kwargs: Any) -> grpc.Channel:
        opened.append(target)
        return real(target, *args, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", counting)
    analyzer_client._channel.cache_clear()
    grpc_fetch("127.0.0.1:1")
    grpc_send("127.0.0.1:1")
    grpc_send("127.0.0.1:2")
    assert opened == ["127.0.0.1:1", "127.0.0.1:2"]
    analyzer_client._channel.cache_clear()
