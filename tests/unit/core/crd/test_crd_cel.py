"""The CRDs' CEL rules, evaluated with cel-python the way the API server does (defaults first, then rules).

Valid examples pass every rule; each broken object is rejected by its rule with the rule's message, and
the pydantic models (or the semantic checks) reject the same object, so the API server and
``load_policy`` agree on what a valid object is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from pydantic import ValidationError
from repo_paths import ROOT

from slo_core.crd.generate import modeldeployment_crd, slopolicy_crd
from slo_core.crd.models import ModelDeployment, SLOPolicy
from slo_core.crd.semantics import policy_spec_problems

EXAMPLES = ROOT / "examples"
ENV = celpy.Environment()


def _schema(kind: str) -> dict[str, Any]:
    crd = slopolicy_crd() if kind == "SLOPolicy" else modeldeployment_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting as the API server does it: absent properties of present objects get defaults."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


def cel_violations(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    """Every ``x-kubernetes-validations`` rule that fails (or errors) on ``obj``, as ``path: message``."""
    out: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = ENV.program(ENV.compile(rule["rule"]))
        try:
            ok, message = bool(program.evaluate({"self": celpy.json_to_cel(obj)})), rule["message"]
        except celpy.CELEvalError as exc:  # the API server rejects an object whose rule errors
            ok, message = False, f"rule error: {exc}"
        if not ok:
            out.append(f"{path or '.'}: {message}")
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                out += cel_violations(sub, obj[name], f"{path}.{name}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            out += cel_violations(schema["items"], item, f"{path}[{i}]")
    return out


def api_server_violations(doc: dict[str, Any]) -> list[str]:
    schema = _schema(doc["kind"])
    return cel_violations(schema, apply_defaults(schema, copy.deepcopy(doc)))


def model_problems(doc: dict[str, Any]) -> list[str]:
    """What slofleet's own loading says: pydantic errors, then the policy's semantic problems."""
    try:
        if doc["kind"] == "SLOPolicy":
            return policy_spec_problems(SLOPolicy.model_validate(doc).spec)
        ModelDeployment.model_validate(doc)
    except ValidationError as exc:
        return [str(e["msg"]) for e in exc.errors()]
    return []


def _example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_every_cel_rule(path: Path) -> None:
    assert api_server_violations(yaml.safe_load(path.read_text(encoding="utf-8"))) == []


POLICY = "slopolicy-chat-agent.yaml"
MD_8B = "modeldeployment-llama-8b-h100.yaml"
MD_70B = "modeldeployment-llama-70b-h100x4.yaml"


def _drop_tbt(d: dict[str, Any]) -> None:
    del d["spec"]["tiers"][0]["tbtS"]


def _drop_ttft(d: dict[str, Any]) -> None:
    del d["spec"]["tiers"][0]["ttftS"]


def _drop_deadline(d: dict[str, Any]) -> None:
    del d["spec"]["tiers"][3]["deadlineS"]


def _drop_compound_deadline(d: dict[str, Any]) -> None:
    del d["spec"]["tiers"][1]["deadlineS"]


def _share_on_latency(d: dict[str, Any]) -> None:
    d["spec"]["tiers"][0]["stageDeadlineShare"] = [0.5, 0.5]


def _duplicate_tier(d: dict[str, Any]) -> None:
    d["spec"]["tiers"][4]["name"] = "chat"


def _duplicate_class(d: dict[str, Any]) -> None:
    d["spec"]["priorityClasses"][2]["name"] = "gold"
    d["spec"]["tiers"] = [t for t in d["spec"]["tiers"] if t["priorityClass"] != "bronze"]
    d["spec"]["tenants"] = []
    d["spec"]["admission"]["onOverload"] = "reject"


def _unknown_class(d: dict[str, Any]) -> None:
    d["spec"]["tiers"][2]["priorityClass"] = "platinum"


def _missing_default_tier(d: dict[str, Any]) -> None:
    d["spec"]["defaultTier"] = "premium"


def _two_sources(d: dict[str, Any]) -> None:
    d["spec"]["model"]["source"]["uri"] = "s3://models/llama-8b/"


def _no_source(d: dict[str, Any]) -> None:
    d["spec"]["model"]["source"] = {}


def _replicas_inverted(d: dict[str, Any]) -> None:
    d["spec"]["replicas"] = {"min": 3, "max": 2}


def _replicas_default_max(d: dict[str, Any]) -> None:
    d["spec"]["replicas"] = {"min": 2}  # max defaults to 1


def _tp_exceeds_gpus(d: dict[str, Any]) -> None:
    d["spec"]["gpu"]["count"] = 2


def _reserved_env(d: dict[str, Any]) -> None:
    d["spec"]["engine"]["env"] = [{"name": "HF_TOKEN", "value": "hf_x"}]


def _slofleet_env(d: dict[str, Any]) -> None:
    d["spec"]["engine"]["env"] = [{"name": "SLOFLEET_POLICY", "value": "fcfs"}]


def _two_caches(d: dict[str, Any]) -> None:
    d["spec"]["engine"]["modelCache"] = {"pvc": "hf-cache", "hostPath": "/var/cache/hf"}


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (POLICY, _drop_tbt, "a latency tier needs ttftS (seconds to first token) and tbtS"),
    (POLICY, _drop_ttft, "a latency tier needs ttftS"),
    (POLICY, _drop_deadline, "a deadline or compound tier needs deadlineS"),
    (POLICY, _drop_compound_deadline, "a deadline or compound tier needs deadlineS"),
    (POLICY, _share_on_latency, "stageDeadlineShare applies only to compound tiers"),
    (POLICY, _duplicate_tier, "tier names must be unique"),
    (POLICY, _duplicate_class, "priority class names must be unique"),
    (POLICY, _unknown_class, "every tier's priorityClass must name one of spec.priorityClasses"),
    (POLICY, _missing_default_tier, "defaultTier must name one of spec.tiers"),
    (MD_8B, _two_sources, "set exactly one of hfId, pvc or uri"),
    (MD_8B, _no_source, "set exactly one of hfId, pvc or uri"),
    (MD_8B, _replicas_inverted, "replicas.min must not exceed replicas.max"),
    (MD_8B, _replicas_default_max, "replicas.min must not exceed replicas.max"),
    (MD_70B, _tp_exceeds_gpus, "engine.tensorParallelSize must not exceed gpu.count"),
    (MD_8B, _reserved_env, "the operator sets this variable"),
    (MD_8B, _slofleet_env, "the operator sets this variable"),
    (MD_8B, _two_caches, "set exactly one of pvc or hostPath"),
]


@pytest.mark.parametrize(("example", "breaks", "message"), BROKEN, ids=[b[1].__name__ for b in BROKEN])
def test_cel_rejects_broken_objects_and_the_models_agree(
    example: str, breaks: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = _example(example)
    breaks(doc)
    violations = api_server_violations(doc)
    assert violations, "the API server would accept this object"
    assert any(message in v for v in violations), violations
    assert model_problems(doc), "load_policy/load_deployment would accept what the API server rejects"


def test_latency_tier_without_tbt_is_rejected_at_the_tier() -> None:
    doc = _example(POLICY)
    _drop_tbt(doc)
    assert api_server_violations(doc) == [
        ".spec.tiers[0]: a latency tier needs ttftS (seconds to first token) "
        "and tbtS (seconds between tokens)"
    ]


def test_defaults_make_optional_sections_valid() -> None:
    doc = _example(MD_8B)
    for section in ("engine", "sidecar", "replicas", "capabilities"):
        doc["spec"].pop(section)
    assert api_server_violations(doc) == []
    assert model_problems(doc) == []
