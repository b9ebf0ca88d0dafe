"""SLO tags carried to an engine-side scheduler in a request's ``vllm_xargs``.

vLLM hands ``vllm_xargs`` to the engine as ``sampling_params.extra_args`` (a flat JSON object of
primitives). The sidecar encodes each request's resolved SLO there; engine-sim's policy hook and the
vLLM scheduler plugin decode it back into the policy's :class:`~slo_core.policies.base.RequestView`.
Keys are prefixed ``slo_`` so they never collide with other extra args. Absolute times are Unix
seconds (vLLM stamps ``arrival_time`` with ``time.time()``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.signing import verify

PREFIX = "slo_"


@dataclass(frozen=True, slots=True)
class EngineTags:
    """What the engine-side scheduler needs to know about a request beyond what vLLM tracks."""

    targets: SLOTargets
    request_key: str = ""
    tenant: str = "default"
    deadline_at_s: float | None = None
    output_bound: int | None = None
    program_id: str | None = None
    stage: int | None = None
    tier: str | None = None  # the SLOPolicy tier name (reported back to routers with the request's state)
    stages: int | None = None  # the program's stage count, when its client stated it (x-slo-stages)
    # when the program's first call reached the router (unix s): a pod that sees a later stage first
    # dates the program from it, as the simulator does, not from the first call it saw itself
    program_start_at_s: float | None = None

    def to_xargs(self) -> dict[str, str | int | float]:
        t = self.targets
        out: dict[str, str | int | float] = {
            "slo_kind": t.kind.value,
            "slo_priority_class": t.priority_class,
            "slo_priority_weight": t.priority_weight,
            "slo_tenant": self.tenant,
        }
        optional: dict[str, str | int | float | None] = {
            "slo_ttft_s": t.ttft_s,
            "slo_tbt_s": t.tbt_s,
            "slo_deadline_s": t.deadline_s,
            "slo_deadline_at_s": self.deadline_at_s,
            "slo_output_bound": self.output_bound,
            "slo_program_id": self.program_id,
            "slo_stage": self.stage,
            "slo_request_key": self.request_key or None,
            "slo_tier": self.tier,
            "slo_stages": self.stages,
            "slo_program_start_at_s": self.program_start_at_s,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


def _num(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"vllm_xargs.{key} must be finite, got {value!r}")
    return number


def program_start_s(now_s: float, stated_s: float | None) -> float:
    """When a pod reckons a compound program began, on first seeing one of its calls at ``now_s``: the
    router's stated start (its first call anywhere in the fleet, the simulator's program arrival) when
    the signed tags or headers carry one, never later than now; else now (a pod without a router)."""
    if stated_s is None or not math.isfinite(stated_s):
        return now_s
    return min(now_s, stated_s)


def decode_tags(raw: Mapping[str, Any] | None) -> EngineTags | None:
    """Decode tags; None when the request carries none (it is then scheduled as best-effort)."""
    if not raw or "slo_kind" not in raw:
        return None
    targets = SLOTargets(
        kind=RequestKind(str(raw["slo_kind"])),
        ttft_s=_num(raw, "slo_ttft_s"),
        tbt_s=_num(raw, "slo_tbt_s"),
        deadline_s=_num(raw, "slo_deadline_s"),
        priority_class=str(raw.get("slo_priority_class", "default")),
        priority_weight=_num(raw, "slo_priority_weight") or 1.0,
    )
    bound = raw.get("slo_output_bound")
    stage = raw.get("slo_stage")
    stages = int(raw["slo_stages"]) if raw.get("slo_stages") is not None else None
    if stages is not None and stages < 1:
        raise ValueError(f"vllm_xargs.slo_stages must be >= 1, got {stages}")
    program = raw.get("slo_program_id")
    return EngineTags(
        targets=targets,
        request_key=str(raw.get("slo_request_key", "")),
        tenant=str(raw.get("slo_tenant", "default")),
        deadline_at_s=_num(raw, "slo_deadline_at_s"),
        output_bound=int(bound) if bound is not None else None,
        program_id=str(program) if program is not None else None,
        stage=int(stage) if stage is not None else None,
        tier=str(raw["slo_tier"]) if raw.get("slo_tier") is not None else None,
        stages=stages,
        program_start_at_s=_num(raw, "slo_program_start_at_s"),
    )


# what only slofleet may set on an engine request: a client's copy is dropped at the front door
CLIENT_FORBIDDEN_FIELDS = frozenset({"priority", "vllm_xargs"})


def strip_engine_tags(body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The body without engine tags a client may not set (``priority``, ``vllm_xargs``, ``slo_*``),
    and the names of what was dropped."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in body.items():
        if key in CLIENT_FORBIDDEN_FIELDS or key.startswith(PREFIX):
            dropped.append(key)
        else:
            kept[key] = value
    return kept, dropped


def client_xargs(value: Any) -> dict[str, Any]:
    """A client's own ``vllm_xargs`` as the sidecar may forward them: an object, without ``slo_*`` keys.

    Raises ``ValueError`` when it is not a JSON object (vLLM would fail on it mid-request).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("'vllm_xargs' must be a JSON object")
    return {str(k): v for k, v in value.items() if not str(k).startswith(PREFIX)}


def distrust(
    tags: EngineTags | None, raw: Mapping[str, Any] | None, keys: Sequence[bytes] | None, now_s: float
) -> str | None:
    """Why already decoded ``tags`` may not be scheduled by (None: they may, or there are none).

    ``keys`` None: no key configured, tags are trusted as they come; otherwise unsigned, forged or stale
    tags are refused. One rule for the vLLM plugin and engine-sim: a caller that skipped the router gets
    no priority."""
    if tags is None or keys is None:
        return None
    return verify(raw, keys, now_s)


def trusted_tags(
    raw: Mapping[str, Any] | None, keys: Sequence[bytes] | None, now_s: float
) -> tuple[EngineTags | None, str | None]:
    """The tags an engine may schedule by, and why a request's tags were not trusted (None: they were,
    or it carried none); see :func:`distrust`. Malformed tags raise ValueError."""
    tags = decode_tags(raw)
    why = distrust(tags, raw, keys, now_s)
    return (tags, None) if why is None else (None, why)
