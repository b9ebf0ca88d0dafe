"""Engine mode: the body a pod's engine gets straight from the router, with the request's signed SLO tags.

In engine mode (an endpoint with ``mode: engine``) the router sends the OpenAI request to the engine's
own port (vLLM with the slofleet plugin, or engine-sim) and no sidecar relays it. What the engine's
scheduler needs (tier, SLO targets, absolute deadline, priority weight, tenant, program and stage, the
router's request id as the key its sidecar knows it by) travels in ``vllm_xargs`` as slofleet's tags,
HMAC-signed with the signing key of ``--tag-key-file`` (the rotating key ring): the engine schedules
unsigned or forged tags best-effort, so a caller that skips the router gets no priority. The client's
own ``vllm_xargs`` and ``priority`` were stripped at the front door (:func:`slo_router.app.body_to_forward`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from slo_core.policies.base import RequestView
from slo_core.wire.keyring import KeyRing
from slo_core.wire.signing import signed_json
from slo_core.wire.tags import EngineTags


def engine_tags(
    view: RequestView, tier: str, *, now_s: float, wall_now_s: float, stages: int | None = None
) -> EngineTags:
    """The tags of a routed request; its deadline moves from the router's clock to unix seconds.
    ``stages``: the program's stated stage count (the pod's analyzer splits the deadline by it)."""
    shift = wall_now_s - now_s
    deadline = view.deadline_at_s + shift if view.deadline_at_s is not None else None
    start = view.program_arrival_s + shift if view.program_arrival_s is not None else None
    return EngineTags(
        targets=view.slo,
        request_key=view.request_id,
        tenant=view.tenant,
        deadline_at_s=deadline,
        program_id=view.program_id,
        stage=view.stage,
        tier=tier,
        stages=stages,
        program_start_at_s=start,
    )


def program_start_unix_s(
    view: RequestView, *, clock: Callable[[], float], wall_clock: Callable[[], float] = time.time
) -> float | None:
    """A compound call's program start (its first call at this router) in unix seconds, for the
    proxy-mode header; None for any other request."""
    if view.program_arrival_s is None:
        return None
    return view.program_arrival_s + (wall_clock() - clock())


def tagged_body(
    forward: dict[str, Any],
    view: RequestView,
    tier: str,
    keys: Callable[[], KeyRing] | None,
    *,
    clock: Callable[[], float],
    wall_clock: Callable[[], float] = time.time,
    stages: int | None = None,
) -> bytes:
    """The JSON body for an engine-mode pod: ``forward`` plus the (signed, when a key is set) tags."""
    encoded = json.dumps(forward, separators=(",", ":")).encode()
    return with_tags(encoded, view, tier, keys, clock=clock, wall_clock=wall_clock, stages=stages)


def with_tags(
    encoded: bytes,
    view: RequestView,
    tier: str,
    keys: Callable[[], KeyRing] | None,
    *,
    clock: Callable[[], float],
    wall_clock: Callable[[], float] = time.time,
    stages: int | None = None,
) -> bytes:
    """``encoded`` (a JSON object without ``vllm_xargs``: the forwarded body, as bytes) with the tags
    appended as its last member, so the body is not decoded and encoded again."""
    wall = wall_clock()
    xargs = engine_tags(view, tier, now_s=clock(), wall_now_s=wall, stages=stages).to_xargs()
    if keys is not None:  # the ring's signing key: the previous one until the current has settled
        tags = signed_json(xargs, keys().signing_key(wall), wall)
    else:
        tags = json.dumps(xargs, separators=(",", ":")).encode()
    head = encoded.rstrip()
    if not head.endswith(b"}"):
        raise ValueError("the forwarded body is not a JSON object")
    head = head[:-1].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + b'"vllm_xargs":' + tags + b"}"
