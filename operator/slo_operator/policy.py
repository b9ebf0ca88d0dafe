"""An SLOPolicy as the pods need it, or the reason it cannot be used: schema and semantic checks.

The API server has already checked the CRD schema; this repeats it with the pydantic model (so the
operator also works against a server that does not validate) and adds the semantic checks (policy names
in the registry, parameters, cross references) that a schema cannot express, with messages naming the
field to change.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from slo_core.crd.errors import validation_problems
from slo_core.crd.loads import render_policy_config
from slo_core.crd.policy import SLOPolicy
from slo_core.crd.semantics import policy_spec_problems
from slo_operator.render import PolicyConfig


class PolicyInvalid(ValueError):
    """The SLOPolicy cannot be used; the message lists every problem."""


def policy_config(body: dict[str, Any]) -> PolicyConfig:
    """Validate an SLOPolicy body and render it for the pods; raises :class:`PolicyInvalid`."""
    try:
        policy = SLOPolicy.model_validate({k: v for k, v in body.items() if k != "status"})
    except ValidationError as exc:
        raise PolicyInvalid("; ".join(validation_problems(exc))) from None
    problems = policy_spec_problems(policy.spec)
    if problems:
        raise PolicyInvalid("; ".join(problems))
    runtime = policy.spec.runtime()  # the one runtime form every process uses
    return PolicyConfig(
        name=policy.metadata.name,
        text=render_policy_config(policy),
        engine_policy=runtime.scheduling.name,
        engine_params=runtime.scheduling.kwargs(),
        engine_objective=runtime.objective.model_dump(mode="json"),
    )
