"""``slofleet validate``: check SLOPolicy and ModelDeployment files offline, as the operator would.

Each document is checked against its CRD model and slofleet's semantic rules (the same functions the
operator and the router use). Then the files are checked together: every ModelDeployment's
``policyRef`` names a policy in the files (or is reported as unchecked), and with ``--router-policy``
every tier the router forwards exists in each ModelDeployment's policy (:mod:`slo_core.crd.compat`).
Exit status 0 when nothing is wrong, 1 otherwise; every problem is printed with what to change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from slo_core.crd.compat import mismatch_message, missing_tiers
from slo_core.crd.deployment import ModelDeployment
from slo_core.crd.errors import validation_problems
from slo_core.crd.policy import SLOPolicy
from slo_core.crd.semantics import policy_spec_problems


def register(parser: argparse.ArgumentParser) -> None:
    """Check SLOPolicy / ModelDeployment YAML files offline (schema, semantics, tiers vs the router)."""
    parser.add_argument("files", nargs="+", help="YAML files (several documents each allowed)")
    parser.add_argument(
        "--router-policy",
        help="the SLOPolicy the router follows: a name among the files' policies, or a file",
    )
    parser.set_defaults(func=run)


def _documents(path: Path) -> list[tuple[str, dict[str, Any]]]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    return [(f"{path}#{i}" if len(docs) > 1 else str(path), d) for i, d in enumerate(docs)]


def check(paths: list[Path], router_policy: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) for the files; ``router_policy`` is a policy name or a file path."""
    problems: list[str] = []
    notes: list[str] = []
    policies: dict[tuple[str, str], SLOPolicy] = {}
    deployments: list[tuple[str, ModelDeployment]] = []
    for path in [*paths, *([Path(router_policy)] if router_policy and Path(router_policy).is_file() else [])]:
        try:
            docs = _documents(path)
        except (OSError, yaml.YAMLError) as exc:
            problems.append(f"{path}: cannot read: {exc}")
            continue
        for source, doc in docs:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            try:
                if kind == "SLOPolicy":
                    policy = SLOPolicy.model_validate(doc)
                    problems += [f"{source}: {p}" for p in policy_spec_problems(policy.spec)]
                    policies[(policy.metadata.namespace or "", policy.metadata.name)] = policy
                elif kind == "ModelDeployment":
                    deployments.append((source, ModelDeployment.model_validate(doc)))
                else:
                    notes.append(f"{source}: kind {kind!r} skipped")
            except ValidationError as exc:
                problems += [f"{source}: invalid {kind}: {p}" for p in validation_problems(exc)]
    router = _router_policy(router_policy, policies, problems)
    for source, md in deployments:
        ns, ref = md.metadata.namespace or "", md.spec.policy_ref
        md_policy = policies.get((ns, ref)) or next((p for (_, n), p in policies.items() if n == ref), None)
        if md_policy is None:
            notes.append(f"{source}: policyRef {ref!r} is not among the files; its tiers were not checked")
            continue
        if router is not None:
            missing = missing_tiers(router.spec, md_policy.spec)
            if missing:
                problems.append(f"{source}: " + mismatch_message(router.metadata.name, ref, missing))
    return problems, notes


def _router_policy(
    ref: str | None, policies: dict[tuple[str, str], SLOPolicy], problems: list[str]
) -> SLOPolicy | None:
    if not ref:
        return None
    if Path(ref).is_file():
        doc = yaml.safe_load(Path(ref).read_text(encoding="utf-8"))
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None
        found = [p for p in policies.values() if p.metadata.name == name]
    else:
        found = [p for (_, n), p in policies.items() if n == ref]
    if not found:
        problems.append(f"--router-policy {ref!r}: no such SLOPolicy among the files")
        return None
    return found[0]


def run(args: argparse.Namespace) -> int:
    problems, notes = check([Path(f) for f in args.files], args.router_policy)
    for line in notes:
        print(f"note: {line}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if not problems:
        print(f"ok: {len(args.files)} file(s) valid")
    return 1 if problems else 0
