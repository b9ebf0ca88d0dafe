"""Loading policies and deployments: messages that name the field and the fix; render → load round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import ROOT

from slo_core.crd.loads import (
    load_deployment,
    load_policy,
    parse_deployment,
    parse_policy,
    render_policy_config,
)
from slo_core.crd.models import ObjectMeta, PriorityClassSpec, SLOPolicy, SLOPolicySpec, TierSpec
from slo_core.crd.semantics import policy_spec_problems
from slo_core.slo import RequestKind

POLICY_FILE = ROOT / "examples/slopolicy-chat-agent.yaml"
MD_FILE = ROOT / "examples/modeldeployment-llama-8b-h100.yaml"


def policy_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8"))
    return doc


def _error(doc: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        parse_policy(yaml.safe_dump(doc), "policy.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (
            lambda d: d["spec"]["tiers"][0].pop("tbtS"),
            "spec.tiers[0].tbtS: a latency tier needs tbtS (seconds between tokens)",
        ),
        (
            lambda d: d["spec"]["tiers"][3].pop("deadlineS"),
            "spec.tiers[3].deadlineS: a deadline tier needs deadlineS (seconds from arrival to completion)",
        ),
        (
            lambda d: d["spec"]["tiers"][1].update(stageDeadlineShare=[0.6, 0.6]),
            "spec.tiers[1].stageDeadlineShare: each share must be in (0, 1] and they must sum to at most 1",
        ),
        (
            lambda d: d["spec"]["tiers"][0].update(ttft=1),
            "spec.tiers[0].ttft: unknown field; remove it or fix its spelling",
        ),
        (
            lambda d: d["spec"]["tiers"][2].pop("kind"),
            "spec.tiers[2].kind: required field is missing; add it",
        ),
        (
            lambda d: d["spec"]["tiers"][2].update(kind="interactive"),
            "spec.tiers[2].kind: input should be 'latency', 'deadline', 'compound' or 'best-effort' "
            "(got 'interactive')",
        ),
        (
            lambda d: d["spec"]["tiers"][0].update(ttftS="fast"),
            "spec.tiers[0].ttftS: input should be a valid number, unable to parse string as a number "
            "(got 'fast')",
        ),
        (
            lambda d: d["spec"]["priorityClasses"][0].update(weight=0),
            "spec.priorityClasses[0].weight: input should be greater than 0 (got 0)",
        ),
        (
            lambda d: d["spec"]["tiers"][2].update(priorityClass="platinum"),
            "spec.tiers[2].priorityClass: 'platinum' is not a priority class; "
            "use one of spec.priorityClasses (gold, silver, bronze)",
        ),
        (
            lambda d: d["spec"].update(defaultTier="premium"),
            "spec.defaultTier: 'premium' is not a tier; "
            "use one of (chat, agent, deep-research, batch, best-effort)",
        ),
        (
            lambda d: d["spec"]["tenants"][1]["allowedTiers"].append("gold-chat"),
            "spec.tenants[1].allowedTiers[3]: 'gold-chat' is not a tier",
        ),
        (
            lambda d: d["spec"]["tenants"][1].update(defaultTier="chat"),
            "spec.tenants[1].defaultTier: the tenant's default tier 'chat' is not among its allowedTiers",
        ),
        (
            lambda d: d["spec"]["scheduling"].update(name="gmaxx"),
            "spec.scheduling.name: unknown engine policy 'gmaxx'; choose one of: ",
        ),
        (
            lambda d: d["spec"]["scheduling"]["params"].update(frame_steps=0),
            "spec.scheduling.params.frame_steps: input should be greater than or equal to 1 (got 0)",
        ),
        (
            lambda d: d["spec"]["scheduling"]["params"].update(frame_stepz=5),
            "spec.scheduling.params.frame_stepz: unknown field",
        ),
        (
            lambda d: d["spec"]["routing"].update(name="random"),
            "spec.routing.name: unknown routing policy 'random'; choose one of: ",
        ),
        (
            lambda d: d["spec"]["routing"]["params"].update(k=0),
            "spec.routing.params.k: input should be greater than or equal to 1 (got 0)",
        ),
        (
            lambda d: d["spec"]["tiers"].pop(4),
            "spec.admission.onOverload: 'best-effort' needs a tier of kind best-effort",
        ),
    ],
)
def test_load_policy_errors_name_the_field_and_the_fix(edit: Any, line: str) -> None:
    doc = policy_doc()
    edit(doc)
    message = _error(doc)
    assert message.startswith("policy.yaml: invalid SLOPolicy:"), message
    assert line in message, message


def test_every_problem_is_reported_at_once() -> None:
    doc = policy_doc()
    doc["spec"]["tiers"][2]["priorityClass"] = "platinum"
    doc["spec"]["routing"]["name"] = "random"
    assert len(_error(doc).splitlines()) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: [unclosed", "policy.yaml: not valid YAML"),
        ("", "policy.yaml: expected one YAML document (a SLOPolicy), found 0"),
        ("- a\n- b\n", "policy.yaml: expected a SLOPolicy object (a mapping), found list"),
        ("kind: ModelDeployment\n", "policy.yaml: kind: expected 'SLOPolicy', found 'ModelDeployment'"),
        ("kind: SLOPolicy\n", "metadata: required field is missing"),
        (
            "apiVersion: slofleet.io/v1\nkind: SLOPolicy\nmetadata: {name: x}\nspec: {}\n",
            "apiVersion: input should be 'slofleet.io/v1alpha1'",
        ),
    ],
)
def test_malformed_files_are_explained(text: str, expected: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_policy(text, "policy.yaml")
    assert expected in str(info.value)


def test_missing_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


def test_deployment_errors_name_the_field() -> None:
    doc = yaml.safe_load(MD_FILE.read_text(encoding="utf-8"))
    doc["spec"]["model"]["source"]["uri"] = "s3://models/llama/"
    doc["spec"]["engine"]["tensorParallelSize"] = 2
    doc["spec"]["engine"]["gpuMemoryUtilization"] = 1.5
    with pytest.raises(ValueError) as info:
        parse_deployment(yaml.safe_dump(doc), "md.yaml")
    message = str(info.value)
    assert "spec.model.source: set exactly one of hfId, pvc or uri (got hfId, uri)" in message
    assert "spec.engine.gpuMemoryUtilization: input should be less than or equal to 1 (got 1.5)" in message


def test_semantic_checks_can_be_skipped_for_shape_only_loading() -> None:
    doc = policy_doc()
    doc["spec"]["routing"]["name"] = "random"
    policy = parse_policy(yaml.safe_dump(doc), check_semantics=False)
    assert policy.spec.routing.name == "random"
    assert policy_spec_problems(policy.spec) == [
        "spec.routing.name: unknown routing policy 'random'; choose one of: "
        "go-routing, min-load, p2c, power-of-k, round-robin, slos-serve-reroute"
    ]


def test_render_then_load_gives_the_same_policy(tmp_path: Path) -> None:
    policy = load_policy(POLICY_FILE)
    text = render_policy_config(policy)
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    again = load_policy(path)
    assert again == policy
    assert again.spec.tiers_runtime() == policy.spec.tiers_runtime()
    assert render_policy_config(again) == text
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "slofleet.io/v1alpha1" and "status" not in doc
    assert "ttftS" in text and "ttft_s" not in text
    assert "product-api-keys" in text  # a reference to the Secret, never its content


def test_python_attributes_are_snake_case_and_accepted_on_input() -> None:
    spec = SLOPolicySpec(
        priority_classes=[PriorityClassSpec(name="gold", weight=2)],
        tiers=[TierSpec(name="chat", kind="latency", ttft_s=1, tbt_s=0.05, priority_class="gold")],
        default_tier="chat",
    )
    policy = SLOPolicy(metadata=ObjectMeta(name="p"), spec=spec)
    assert load_policy_text(render_policy_config(policy)).spec == spec
    assert spec.scheduling.name == "gmax" and spec.routing.name == "power-of-k"
    assert spec.goodput.gain_params().output_weight == 2.0
    assert spec.tiers_runtime()["chat"].targets().token_deadline_s(10) == pytest.approx(1.5)


def load_policy_text(text: str) -> SLOPolicy:
    return parse_policy(text)


_seconds = st.floats(min_value=0.001, max_value=1000, allow_nan=False, allow_infinity=False)


@settings(max_examples=30, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0.01, max_value=100), min_size=1, max_size=4),
    kinds=st.lists(st.sampled_from([k.value for k in RequestKind]), min_size=1, max_size=5),
    ttft_s=_seconds,
    tbt_s=_seconds,
    deadline_s=_seconds,
)
def test_round_trip_holds_for_any_valid_policy(
    weights: list[float], kinds: list[str], ttft_s: float, tbt_s: float, deadline_s: float
) -> None:
    classes = [PriorityClassSpec(name=f"c{i}", weight=w) for i, w in enumerate(weights)]
    tiers = [
        TierSpec(
            name=f"t{i}",
            kind=kind,  # type: ignore[arg-type]
            ttft_s=ttft_s if kind == "latency" else None,
            tbt_s=tbt_s if kind == "latency" else None,
            deadline_s=deadline_s if kind in ("deadline", "compound") else None,
            priority_class=classes[i % len(classes)].name,
        )
        for i, kind in enumerate(kinds)
    ]
    policy = SLOPolicy(
        metadata=ObjectMeta(name="p", namespace="ns"),
        spec=SLOPolicySpec(priority_classes=classes, tiers=tiers, default_tier="t0"),
    )
    assert parse_policy(render_policy_config(policy)) == policy


def test_deployment_round_trips_through_its_document(tmp_path: Path) -> None:
    md = load_deployment(MD_FILE)
    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(md.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert load_deployment(path) == md


def test_every_registered_policy_can_be_named_in_a_policy_with_default_params() -> None:
    from slo_core.crd.models import PolicyRef
    from slo_core.policies.registry import ENGINE_POLICIES, ROUTER_POLICIES

    spec = load_policy(POLICY_FILE).spec
    for name in ENGINE_POLICIES:
        assert policy_spec_problems(spec.model_copy(update={"scheduling": PolicyRef(name=name)})) == [], name
    for name in ROUTER_POLICIES:
        assert policy_spec_problems(spec.model_copy(update={"routing": PolicyRef(name=name)})) == [], name
