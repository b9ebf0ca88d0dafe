"""The request-side SLO vocabulary: headers, body, JITServe aliases, and errors that say what to fix."""

from __future__ import annotations

import pytest

from slo_core.slo import PriorityClass, RequestKind, SLOTargets, SLOTier
from slo_core.wire.request_slo import SLOParamError, parse_slo, strip_slo_fields


def test_headers_are_parsed_with_units_in_seconds() -> None:
    slo = parse_slo(
        {"X-SLO-Tier": "gold", "x-slo-ttft-s": "1.5", "x-slo-tbt-s": "0.05", "content-type": "json"}, {}
    )
    assert (slo.tier, slo.ttft_s, slo.tbt_s) == ("gold", 1.5, 0.05)


def test_body_slo_object_and_compound_identity() -> None:
    slo = parse_slo(
        {}, {"model": "m", "slo": {"deadline_s": 60, "program_id": "job-7", "stage": 2, "stages": 4}}
    )
    assert (slo.deadline_s, slo.program_id, slo.stage, slo.stages) == (60.0, "job-7", 2, 4)


def test_jitserve_aliases() -> None:
    slo = parse_slo({}, {"deadline": 20, "target_ttft": 5, "target_tbt": 0.2, "waiting_time": 5})
    assert (slo.deadline_s, slo.ttft_s, slo.tbt_s, slo.max_wait_s) == (20, 5, 0.2, 5)


def test_same_value_twice_is_fine_but_conflicts_are_errors() -> None:
    assert parse_slo({"x-slo-deadline-s": "20"}, {"deadline": 20}).deadline_s == 20
    with pytest.raises(SLOParamError, match="given twice with different values"):
        parse_slo({"x-slo-deadline-s": "20"}, {"slo": {"deadline_s": 30}})


@pytest.mark.parametrize(
    ("headers", "body", "match", "param"),
    [
        ({"x-slo-deadline-s": "-1"}, {}, "greater than 0", "header x-slo-deadline-s"),
        ({"x-slo-ttft-s": "soon"}, {}, "valid number", "header x-slo-ttft-s"),
        ({"x-slo-priority": "1"}, {}, "unknown SLO header 'x-slo-priority'", "x-slo-priority"),
        ({}, {"slo": {"deadline": 5}}, "unknown SLO field", "body field 'slo.deadline'"),
        ({}, {"slo": "gold"}, "must be a JSON object", "slo"),
        ({}, {"slo": {"stage": -1}}, "greater than or equal to 0", "body field 'slo.stage'"),
        ({}, {"target_tbt": float("inf")}, "finite", "body field 'target_tbt'"),
        ({}, {"slo": {"tier": ""}}, "at least 1 character", "body field 'slo.tier'"),
    ],
)
def test_bad_input_names_the_parameter_and_the_fix(
    headers: dict[str, str], body: dict[str, object], match: str, param: str
) -> None:
    with pytest.raises(SLOParamError, match=match) as exc:
        parse_slo(headers, body)
    assert exc.value.param == param


def test_strip_removes_only_slo_fields() -> None:
    body = {"model": "m", "prompt": "hi", "slo": {"tier": "gold"}, "deadline": 3, "max_tokens": 5}
    assert strip_slo_fields(body) == {"model": "m", "prompt": "hi", "max_tokens": 5}


def test_tier_defaults_and_priority_come_from_the_tier() -> None:
    gold = SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=2.0, tbt_s=0.1)
    t = gold.targets(tbt_s=0.5)
    assert (t.ttft_s, t.tbt_s, t.priority_class, t.priority_weight) == (2.0, 0.5, "gold", 3.0)


def test_a_client_may_loosen_its_targets_never_tighten_them() -> None:
    chat = SLOTier("chat", RequestKind.LATENCY, PriorityClass("gold", 3.0), ttft_s=2.0, tbt_s=0.1)
    t = chat.targets(ttft_s=1e-6, tbt_s=1e-6, deadline_s=1e-6)
    assert (t.ttft_s, t.tbt_s, t.deadline_s) == (2.0, 0.1, 2.0)
    assert chat.targets(ttft_s=5.0).ttft_s == 5.0
    batch = SLOTier("batch", RequestKind.DEADLINE, PriorityClass("low", 1.0), deadline_s=60.0)
    assert batch.targets(deadline_s=0.001).deadline_s == 60.0
    assert batch.targets(deadline_s=600.0).deadline_s == 600.0
    free = SLOTier("free", RequestKind.BEST_EFFORT, PriorityClass("free", 0.5))
    assert free.targets(deadline_s=0.001).deadline_s == free.targets().effective_deadline_s
    assert free.targets().deadline_s is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": RequestKind.LATENCY, "ttft_s": 1.0}, "needs both ttft_s and tbt_s"),
        ({"kind": RequestKind.DEADLINE}, "needs deadline_s"),
        ({"kind": RequestKind.DEADLINE, "deadline_s": -3.0}, "positive number of seconds"),
        ({"kind": RequestKind.BEST_EFFORT, "priority_weight": 0.0}, "positive number"),
    ],
)
def test_invalid_targets_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SLOTargets(**kwargs)  # type: ignore[arg-type]
