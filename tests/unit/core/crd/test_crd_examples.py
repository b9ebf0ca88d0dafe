"""The examples are what users write: they validate against the CRD schemas and load as the models."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from repo_paths import ROOT

from slo_core.crd.generate import modeldeployment_crd, slopolicy_crd
from slo_core.crd.loads import load_deployment, load_policy
from slo_core.crd.semantics import policy_spec_problems
from slo_core.slo import RequestKind

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def strict(node: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields forbidden, as kubectl's strict field validation enforces them."""
    node = copy.deepcopy(node)
    stack = [node]
    while stack:
        n = stack.pop()
        if "properties" in n and not n.get("x-kubernetes-preserve-unknown-fields"):
            n["additionalProperties"] = False
        stack += list(n.get("properties", {}).values())
        for key in ("items", "additionalProperties"):
            if isinstance(n.get(key), dict):
                stack.append(n[key])
    return node


def validator(kind: str) -> jsonschema.Draft4Validator:
    # OpenAPI v3.0 (what CRDs use) has draft-4 semantics: boolean exclusiveMinimum next to minimum.
    crd = slopolicy_crd() if kind == "SLOPolicy" else modeldeployment_crd()
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _errors(doc: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(doc["kind"]).iter_errors(doc)
    ]


def test_there_are_the_promised_examples() -> None:
    kinds = [yaml.safe_load(p.read_text(encoding="utf-8"))["kind"] for p in EXAMPLES]
    assert kinds.count("SLOPolicy") >= 1 and kinds.count("ModelDeployment") >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_its_crd_schema(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert _errors(doc) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_never_holds_a_literal_credential(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "hf_" not in body and "sk-" not in body and "apiKeys:" not in body


def test_policy_example_loads_with_the_promised_tiers_and_classes() -> None:
    policy = load_policy(ROOT / "examples/slopolicy-chat-agent.yaml")
    tiers = policy.spec.tiers_runtime()
    assert {n: t.kind for n, t in tiers.items()} == {
        "chat": RequestKind.LATENCY,
        "agent": RequestKind.COMPOUND,
        "deep-research": RequestKind.COMPOUND,
        "batch": RequestKind.DEADLINE,
        "best-effort": RequestKind.BEST_EFFORT,
    }
    assert [(p.name, p.weight) for p in policy.spec.priority_classes] == [
        ("gold", 3.0),
        ("silver", 2.0),
        ("bronze", 1.0),
    ]
    assert tiers["chat"].targets().priority_weight == 3.0
    assert len(policy.spec.tenants) == 2
    assert all(t.api_keys_secret is not None for t in policy.spec.tenants)
    assert policy_spec_problems(policy.spec) == []


def test_deployment_examples_load_as_one_and_four_h100s() -> None:
    small = load_deployment(ROOT / "examples/modeldeployment-llama-8b-h100.yaml").spec
    large = load_deployment(ROOT / "examples/modeldeployment-llama-70b-h100x4.yaml").spec
    assert small.model.source.hf_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert (small.gpu.count, small.engine.tensor_parallel_size) == (1, 1)
    assert (large.gpu.count, large.engine.tensor_parallel_size) == (4, 4)
    assert "70B" in (large.model.source.pvc.path if large.model.source.pvc else "")
    assert small.policy_ref == large.policy_ref == "chat-agent"
    assert large.context_tokens() == 65536 and large.gpu_class() == "h100"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["spec"]["tiers"][0].update(ttft=1.0), "'ttft' was unexpected"),
        (lambda d: d["spec"]["tiers"][0].update(kind="interactive"), "'interactive' is not one of"),
        (lambda d: d["spec"]["tiers"][0].update(tbtS=0), "less than or equal to the minimum of 0"),
        (lambda d: d["spec"]["tiers"][0].update(name="Chat Tier"), "does not match"),
        (lambda d: d["spec"].update(fairness=1.5), "greater than the maximum of 1"),
        (lambda d: d["spec"].pop("defaultTier"), "'defaultTier' is a required property"),
        (lambda d: d["spec"]["tenants"][0].update(allowedTiers=[]), "should be non-empty"),
    ],
)
def test_schema_rejects_what_users_get_wrong(edit: Any, expected: str) -> None:
    doc = yaml.safe_load((ROOT / "examples/slopolicy-chat-agent.yaml").read_text(encoding="utf-8"))
    edit(doc)
    errors = _errors(doc)
    assert any(expected in e for e in errors), errors


def test_schema_accepts_quantities_as_numbers_or_strings() -> None:
    doc = yaml.safe_load((ROOT / "examples/modeldeployment-llama-8b-h100.yaml").read_text(encoding="utf-8"))
    doc["spec"]["sidecar"]["resources"]["requests"] = {"cpu": 1, "memory": "512Mi"}
    assert _errors(doc) == []
    doc["spec"]["sidecar"]["resources"]["requests"] = {"cpu": [1]}
    assert _errors(doc)
