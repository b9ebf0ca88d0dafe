"""Load SLOPolicy and ModelDeployment objects from YAML, and render a policy as the file services read.

``render_policy_config`` writes the YAML the operator puts in a ConfigMap; the sidecar and the router
read it back with ``load_policy``. Every error is a ``ValueError`` naming the source, the field path
(as written in YAML) and what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from slo_core.crd.deployment import ModelDeployment
from slo_core.crd.errors import validation_problems
from slo_core.crd.policy import SLOPolicy
from slo_core.crd.semantics import policy_spec_problems

M = TypeVar("M", bound=BaseModel)


def _document(text: str, source: str, kind: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from None
    if len(docs) != 1:
        raise ValueError(f"{source}: expected one YAML document (a {kind}), found {len(docs)}")
    doc = docs[0]
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: expected a {kind} object (a mapping), found {type(doc).__name__}")
    found = doc.get("kind")
    if found != kind:
        raise ValueError(f"{source}: kind: expected {kind!r}, found {found!r}")
    return doc


def _parse(model: type[M], text: str, source: str, kind: str) -> M:
    return _validate(model, _document(text, source, kind), source, kind)


def _validate(model: type[M], doc: dict[str, Any], source: str, kind: str) -> M:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise ValueError(f"{source}: invalid {kind}:\n  " + "\n  ".join(problems)) from None


def parse_policy(text: str, source: str = "<policy>", *, check_semantics: bool = True) -> SLOPolicy:
    """An SLOPolicy from YAML text; with ``check_semantics`` also cross-references and policy params."""
    return _checked(_parse(SLOPolicy, text, source, "SLOPolicy"), source, check_semantics)


def policy_from_object(obj: dict[str, Any], source: str = "<policy>") -> SLOPolicy:
    """An SLOPolicy from the object the API server returns (its status is ignored), fully checked."""
    doc = {k: v for k, v in obj.items() if k != "status"}
    return _checked(_validate(SLOPolicy, doc, source, "SLOPolicy"), source, True)


def _checked(policy: SLOPolicy, source: str, check_semantics: bool) -> SLOPolicy:
    if check_semantics:
        problems = policy_spec_problems(policy.spec)
        if problems:
            raise ValueError(f"{source}: invalid SLOPolicy:\n  " + "\n  ".join(problems))
    return policy


def parse_deployment(text: str, source: str = "<deployment>") -> ModelDeployment:
    """A ModelDeployment from YAML text."""
    return _parse(ModelDeployment, text, source, "ModelDeployment")


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_policy(path: str | Path, *, check_semantics: bool = True) -> SLOPolicy:
    """Read an SLOPolicy YAML file (the full object: apiVersion, kind, metadata, spec)."""
    return parse_policy(_read(path), str(path), check_semantics=check_semantics)


def load_deployment(path: str | Path) -> ModelDeployment:
    """Read a ModelDeployment YAML file (the full object)."""
    return parse_deployment(_read(path), str(path))


def to_document(obj: BaseModel) -> dict[str, Any]:
    """The object as Kubernetes sees it: camelCase keys, unset optional fields left out."""
    out: dict[str, Any] = obj.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def render_policy_config(policy: SLOPolicy) -> str:
    """The policy as the YAML file the sidecar and router read back with ``load_policy`` (no status)."""
    doc = to_document(policy)
    doc.pop("status", None)
    meta = doc.get("metadata", {})
    meta.pop("generation", None)
    for empty in [k for k in ("labels", "annotations") if not meta.get(k)]:
        meta.pop(empty)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
