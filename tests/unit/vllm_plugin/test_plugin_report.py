"""Engine mode's report path in the plugin: a step only hands over a snapshot; the analyzer client's thread
sends it with the finished requests (again after a failure) and swaps in the bounds the answer brings."""

from __future__ import annotations

import threading
import time
from typing import Any

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags
from slo_proto import slofleet_pb2 as pb
from slo_vllm_plugin.analyzer_client import AnalyzerClient
from slo_vllm_plugin.report import (
    MET,
    MISSED,
    REJECTED,
    EngineSnapshot,
    Finished,
    RequestRow,
    Throttle,
    judge,
    to_report,
    watch,
)

TAGS = EngineTags(
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0), request_key="k1", tenant="t", tier="batch"
)


def _snapshot(step: int) -> EngineSnapshot:
    rows = (
        RequestRow("k1", "decode", 100, step, 512, 1.0, TAGS, 2.0),
        RequestRow("v-2", "waiting", 9, 0, 64, 1.5, None),
    )
    return EngineSnapshot(10.0 + step, step, 1, 1, 0.25, 4096, rows, policy="edf")


class FakeSidecar:
    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.fail = False
        self.got = threading.Event()

    def send(self, report: Any) -> tuple[dict[str, int], dict[str, float]]:
        if self.fail:
            raise ConnectionError("down")
        self.reports.append(report)
        self.got.set()
        bounds = {r.request_key: 100 + r.generated_tokens for r in report.requests}
        return bounds, {"k1": 123.5}


def _wait(cond: Any, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end
        time.sleep(0.005)


def test_reports_carry_the_snapshot_and_finishes_once_and_bring_bounds_back() -> None:
    side = FakeSidecar()
    client = AnalyzerClient("x", interval_s=0.01, send=side.send, fetch=lambda: {})
    try:
        client.finished([Finished("k0", 17, "stop", "batch")])
        client.publish(_snapshot(3))
        _wait(lambda: any(len(r.finished) for r in side.reports))
        first = next(r for r in side.reports if r.finished)
        assert [(f.request_key, f.generated_tokens, f.finish_reason, f.tier) for f in first.finished] == [
            ("k0", 17, "stop", "batch")
        ]
        row = first.requests[0]
        assert (row.request_key, row.phase, row.kind, row.tier, row.deadline_s) == (
            "k1",
            "decode",
            "deadline",
            "batch",
            30.0,
        )
        assert first.requests[1].kind == "" and first.kv_usage == 0.25 and first.policy == "edf"
        _wait(lambda: client.bounds_if_fresh(5.0) == {"k1": 103, "v-2": 100})
        assert client.deadlines() == {"k1": 123.5}
        n = len(side.reports)
        _wait(lambda: len(side.reports) > n + 2)
        assert sum(len(r.finished) for r in side.reports) == 1, "a finish is reported once"
    finally:
        client.close()


def test_finishes_survive_a_failed_report_and_stale_bounds_read_as_unreachable() -> None:
    side = FakeSidecar()
    side.fail = True

    def fetch() -> dict[str, int]:
        raise ConnectionError("down")

    client = AnalyzerClient("x", interval_s=0.01, send=side.send, fetch=fetch)
    try:
        client.publish(_snapshot(1))
        client.finished([Finished("k9", 5, "length")])
        _wait(lambda: client.failures >= 3)
        assert client.bounds_if_fresh(0.5) is None  # never answered: the scheduler runs stock order
        side.fail = False
        _wait(lambda: bool(side.reports))
        assert [f.request_key for r in side.reports for f in r.finished] == ["k9"]
        assert client.bounds_if_fresh(5.0) is not None
    finally:
        client.close()


def test_the_throttle_lets_one_snapshot_through_per_interval() -> None:
    t = Throttle(0.05)
    assert [t.due(x) for x in (0.0, 0.01, 0.049, 0.05, 0.06, 0.2)] == [True, False, False, True, False, True]


def test_a_finished_row_carries_its_outcome_by_the_tags_and_its_prompt() -> None:
    """The watch takes the tags' targets and absolute deadline; an abort has no outcome, a policy
    rejection is one; the report carries outcome and prompt tokens."""
    chat = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), request_key="c", tier="chat")
    on_time, late = watch(chat, 100.0), watch(chat, 100.0)
    on_time.tokens(5, 100.9)  # first token by TTFT, the next four due by 1.4 s
    late.tokens(1, 100.5)
    late.tokens(3, 101.3)  # token 1 was due at 1.1 s
    assert (judge(on_time, "stop"), judge(late, "length")) == (MET, MISSED)
    assert judge(on_time, "abort") == "" and judge(None, "stop") == ""
    assert judge(watch(None, 0.0), "abort", rejected=True) == REJECTED
    tagged = watch(EngineTags(SLOTargets(RequestKind.DEADLINE, deadline_s=30.0), deadline_at_s=110.0), 100.0)
    tagged.tokens(2, 111.0)  # within arrival + 30 s but after the tags' absolute deadline
    assert judge(tagged, "stop") == MISSED
    untagged = watch(None, 100.0)  # best effort: the default deadline
    untagged.tokens(1, 101.0)
    assert judge(untagged, "stop") == MET
    rows = [Finished("a", 5, "stop", "chat", MET, 40), Finished("b", 0, "abort", "", REJECTED, 9)]
    msg = to_report(_snapshot(1), rows)
    assert [(f.outcome, f.prompt_tokens) for f in msg.finished] == [
        (pb.SLO_OUTCOME_MET, 40),
        (pb.SLO_OUTCOME_REJECTED, 9),
    ]
    assert (
        to_report(_snapshot(1), [Finished("c", 1, "abort")]).finished[0].outcome == pb.SLO_OUTCOME_UNSPECIFIED
    )
