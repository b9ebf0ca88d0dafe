"""The analyzer, tracker, history and config pieces of the sidecar, on hand-made inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo_core.gain import GainParams
from slo_core.predict.compound import LLM_STAGE, fallback_stage_deadline_at_s
from slo_core.predict.patterns import PatternGraph, Stage
from slo_core.slo import PriorityClass, RequestKind, SLOTier
from slo_sidecar.analyzer import patterns_from_json
from slo_sidecar.config import ConfigError, parse_policy_file
from slo_sidecar.engine_client import EngineStatus, _read_load
from slo_sidecar.estimators import FallbackEstimator, load_length_estimator
from slo_sidecar.front import parse_body
from slo_sidecar.history import History, read_state, write_state
from slo_sidecar.tracker import Tracker

FLOW = SLOTier("flow", RequestKind.COMPOUND, PriorityClass("p", 1.0), deadline_s=100.0)
CHAT = SLOTier("chat", RequestKind.LATENCY, PriorityClass("hi", 2.0), ttft_s=1.0, tbt_s=0.1)


def test_fallback_sub_deadline_is_the_tier_share_then_an_equal_split_then_the_deadline() -> None:
    # program arrived at 0 with a 100 s deadline; stage 1 starts at 28 s
    assert fallback_stage_deadline_at_s(100.0, 0.0, 28.0, 1, stages=4) == pytest.approx(28 + 72 / 3)
    assert fallback_stage_deadline_at_s(100.0, 0.0, 28.0, 1, stages=None) == 100.0
    assert fallback_stage_deadline_at_s(
        100.0, 0.0, 28.0, 1, stages=4, tier_share=(0.2, 0.3, 0.5)
    ) == pytest.approx(50.0)
    assert (
        fallback_stage_deadline_at_s(100.0, 0.0, 60.0, 1, stages=4, tier_share=(0.2, 0.3, 0.5)) == 60.0
    )  # never in the past
    assert fallback_stage_deadline_at_s(100.0, 0.0, 28.0, 3, stages=None, tier_share=(0.2, 0.3, 0.5)) == 100.0


def test_compound_calls_get_sub_deadlines_within_the_program_deadline() -> None:
    now = [1000.0]
    tracker = Tracker(History(), clock=lambda: now[0])
    kw = dict(prompt_text="x", prompt_tokens=5, max_tokens=50, max_wait_s=5, bound=20, stated_stages=2)
    first = tracker.new_request(tier=FLOW, targets=FLOW.targets(), program_id="p", stage=0, **kw)  # type: ignore[arg-type]
    assert first.deadline_at_s == pytest.approx(1000 + 50)  # (0+1)/2 of 100 s
    now[0] = 1030.0
    tracker.record_tokens(first, 10, "out", now[0])
    tracker.finish(first, tracker.outcome(first, True, "token", GainParams()), "ok")
    second = tracker.new_request(tier=FLOW, targets=FLOW.targets(), program_id="p", stage=1, **kw)  # type: ignore[arg-type]
    assert second.program_arrival_s == 1000.0 and second.deadline_at_s == pytest.approx(1100.0)
    now[0] = 1040.0
    tracker.record_tokens(second, 5, "more", now[0])
    tracker.finish(second, tracker.outcome(second, True, "token", GainParams()), "ok")
    assert len(tracker.history.patterns) == 1  # the finished program joins the pattern history
    graph = tracker.history.patterns.graph(0)
    assert [st.output_tokens for st in graph.stages] == pytest.approx([10, 5], rel=0.01)
    assert [st.duration_s for st in graph.stages] == pytest.approx([30.0, 10.0], rel=0.01)


def test_latency_goodput_counts_tokens_on_time_and_weights_the_class() -> None:
    now = [0.0]
    tracker = Tracker(History(), clock=lambda: now[0])
    live = tracker.new_request(
        tier=CHAT,
        targets=CHAT.targets(),
        prompt_text="x",
        prompt_tokens=3,
        max_tokens=10,
        max_wait_s=5,
        bound=4,
        program_id=None,
        stage=None,
        stated_stages=None,
    )
    for t in (0.5, 1.05, 1.3, 1.35):  # token i is due at 1.0 + 0.1·i: tokens 0 and 3 are on time
        tracker.record_tokens(live, 1, "w", t)
    out = tracker.outcome(live, True, "token", GainParams())
    assert out.earned == pytest.approx(2 * 2.0) and out.ideal == pytest.approx(4 * 2.0) and not out.met_slo


def test_history_checkpoint_round_trip_and_corrupt_files_are_moved_aside(tmp_path: Path) -> None:
    history = History()
    history.add({"tier": "chat", "output_tokens": 7})
    history.patterns.add(PatternGraph((Stage(LLM_STAGE, 3, 10, 1.0), Stage(LLM_STAGE, 4, 10, 1.0))))
    write_state(tmp_path, history, ["r1"], {"note": 1})
    restored = History()
    extra = read_state(tmp_path, restored)
    assert extra is not None and extra["in_flight"] == ["r1"] and extra["note"] == 1
    assert list(restored.rows) == list(history.rows)
    assert restored.patterns.graphs == history.patterns.graphs
    legacy = History()  # a checkpoint from before the core tracker: per-call stage rows
    patterns_from_json(
        [{"program_id": "p", "stages": [[0, 0, 2, 5, 7], [0, 0, 3, 5, 1], [1, 3, 4, 5, 2]]}], legacy.patterns
    )
    stages = legacy.patterns.graph(0).stages
    assert [st.calls for st in stages] == [2, 1]
    assert [st.output_tokens for st in stages] == pytest.approx([8, 2], rel=0.01)
    (tmp_path / "state.json").write_text('{"format": "slofleet-sidecar-state/1", "history": {"rows": 5}}')
    assert read_state(tmp_path, History()) is None
    assert (tmp_path / "state.json.corrupt").exists() and not (tmp_path / "state.json").exists()


def test_fallback_estimator_learns_this_engine_and_survives_a_restart(tmp_path: Path) -> None:
    est = FallbackEstimator(quantile=0.9)
    shipped = est.bound(None, 5, "latency", 4000)
    for n in range(100):
        est.observe(20 + n % 10)
    assert est.bound(None, 5, "latency", 4000) == 29 < shipped
    assert est.refine(29, None, 5, 35, None, "latency", 4000) > 35  # outlived every sample: grows
    assert est.bound(None, 5, "latency", 8) == 8
    est.save(tmp_path / "predictor.json")
    again, source = load_length_estimator("fallback", tmp_path)
    assert "checkpoint" in source and again.bound(None, 5, "latency", 4000) == 29


def test_policy_file_errors_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    spec = {
        "priorityClasses": [{"name": "hi", "weight": 2}],
        "tiers": [{"name": "chat", "kind": "latency", "ttftS": 1, "tbtS": 0.1, "priorityClass": "hi"}],
        "defaultTier": "chat",
        "scheduling": {"name": "gmax"},
    }
    path.write_text(
        json.dumps(
            {
                "apiVersion": "slofleet.io/v1alpha1",
                "kind": "SLOPolicy",
                "metadata": {"name": "x"},
                "spec": spec,
            }
        )
    )
    cfg = parse_policy_file(path)
    assert (
        cfg.policy_name == "gmax"
        and set(cfg.tiers) == {"chat"}
        and cfg.tiers["chat"].priority_class.weight == 2
    )
    for broken, says in (
        ({**spec, "scheduling": {"name": "fifo"}}, "unknown engine policy 'fifo'"),
        ({**spec, "defaultTier": "gold"}, "defaultTier"),
    ):
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "slofleet.io/v1alpha1",
                    "kind": "SLOPolicy",
                    "metadata": {"name": "x"},
                    "spec": broken,
                }
            )
        )
        with pytest.raises(ConfigError, match=says):
            parse_policy_file(path)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_policy_file(tmp_path / "missing.yaml")


def test_body_parsing_accepts_text_parts_and_token_ids() -> None:
    chat = parse_body(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}],
            "max_completion_tokens": 7,
        },
        "chat",
        16,
    )
    assert (
        chat.prompt_text == "hello world"
        and chat.max_tokens == 7
        and "max_completion_tokens" not in chat.forward
    )
    ids = parse_body({"model": "m", "prompt": [1, 2, 3]}, "completion", 16)
    assert ids.prompt_tokens == 3 and not ids.resumable and ids.max_tokens == 16


def test_engine_load_is_read_from_vllm_metric_lines() -> None:
    status = EngineStatus()
    _read_load(
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0"} 2.0\n'
        'vllm:kv_cache_usage_perc{model_name="a b"} 0.5\nvllm:num_requests_running_total 9\n',
        status,
    )
    assert (status.running, status.waiting, status.kv_usage) == (4, 2, 0.5)
