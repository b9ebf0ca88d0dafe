"""The request-side SLO vocabulary shared by the router and the sidecar.

A client states its SLO per request either as HTTP headers or in the JSON body; all durations are
seconds, measured from the moment the request arrives:

=========================  ===========================  ======================================
header                     body (``slo`` object)        meaning
=========================  ===========================  ======================================
``x-slo-tier``             ``tier``                     SLO tier name from the SLOPolicy
``x-slo-deadline-s``       ``deadline_s``               end-to-end deadline (compound: the DAG's)
``x-slo-ttft-s``           ``ttft_s``                   time-to-first-token target (streaming)
``x-slo-tbt-s``            ``tbt_s``                    time-between-tokens target (streaming)
``x-slo-max-wait-s``       ``max_wait_s``               drop (408) if not started by then
``x-slo-program-id``       ``program_id``               compound request (DAG) this call belongs to
``x-slo-stage``            ``stage``                    0-based stage of this call in its DAG
``x-slo-stages``           ``stages``                   total stages, when the client knows it
=========================  ===========================  ======================================

JITServe's top-level body fields ``deadline``, ``target_ttft``, ``target_tbt`` and ``waiting_time``
(seconds, JITServe §5) are accepted as aliases of ``deadline_s``, ``ttft_s``, ``tbt_s`` and
``max_wait_s``. Stating the same field twice with different values is an error. Priority is never
client-stated: it comes from the tier the tenant is bound to.

Every answer the router relays from a pod carries ``x-slo-tier`` (:data:`SERVED_TIER_HEADER`): the tier
the request was served in. It is the tier asked for, the tenant's default when it asked for one it may
not use or none, or the best-effort tier when the router demoted it (``onOverload: best-effort``), so a
client sees a demotion on the answer itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

HEADER_PREFIX = "x-slo-"

# header suffix -> field name
_HEADER_FIELDS = {
    "tier": "tier",
    "deadline-s": "deadline_s",
    "ttft-s": "ttft_s",
    "tbt-s": "tbt_s",
    "max-wait-s": "max_wait_s",
    "program-id": "program_id",
    "stage": "stage",
    "stages": "stages",
}
# JITServe §5 body aliases -> field name
_JITSERVE_FIELDS = {
    "deadline": "deadline_s",
    "target_ttft": "ttft_s",
    "target_tbt": "tbt_s",
    "waiting_time": "max_wait_s",
}
BODY_FIELDS = frozenset({"slo", *_JITSERVE_FIELDS})
# the full header name -> field name
SLO_HEADERS = {HEADER_PREFIX + suffix: field for suffix, field in _HEADER_FIELDS.items()}
# on the router's answers: the tier the request was served in (after binding and any demotion)
SERVED_TIER_HEADER = HEADER_PREFIX + "tier"


class SLOParamError(ValueError):
    """A client-stated SLO parameter is malformed; ``param`` names it as the client wrote it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class SLORequest(BaseModel):
    """What a client may state about one request's SLO (durations in seconds from arrival)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # names travel on as headers: printable ASCII only
    tier: str | None = Field(
        None, min_length=1, max_length=63, pattern=r"^[!-~]+$", description="SLO tier name"
    )
    deadline_s: float | None = Field(None, gt=0, le=86400, description="end-to-end deadline, seconds")
    ttft_s: float | None = Field(None, gt=0, le=3600, description="time-to-first-token target, seconds")
    tbt_s: float | None = Field(None, gt=0, le=60, description="time-between-tokens target, seconds")
    max_wait_s: float | None = Field(None, gt=0, le=3600, description="maximum queueing time, seconds")
    program_id: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[!-~]+$", description="compound request id"
    )
    stage: int | None = Field(None, ge=0, le=1000, description="0-based stage index in the program")
    stages: int | None = Field(None, ge=1, le=1000, description="total number of stages, if known")

    def is_empty(self) -> bool:
        return not self.model_dump(exclude_none=True)


def _validated(field: str, value: Any, where: str) -> Any:
    """Validate one field on its own so the error names exactly where the client wrote it."""
    if field not in SLORequest.model_fields:
        known = ", ".join(SLORequest.model_fields)
        raise SLOParamError(f"unknown SLO field {where}; known fields: {known}", where)
    if isinstance(value, float) and not math.isfinite(value):
        raise SLOParamError(f"{where} must be a finite number of seconds", where)
    try:
        return getattr(SLORequest.model_validate({field: value}), field)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SLOParamError(f"{where}: {err['msg']} (got {value!r})", where) from None


def parse_slo(headers: Mapping[str, str], body: Mapping[str, Any]) -> SLORequest:
    """Read the SLO a client stated in headers and body; raises :class:`SLOParamError` saying what to fix."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def put(field: str, value: Any, where: str) -> None:
        parsed = _validated(field, value, where)
        if field in values and values[field] != parsed:
            raise SLOParamError(
                f"{field} is given twice with different values ({origin[field]}: {values[field]!r}, "
                f"{where}: {parsed!r}); state it once",
                where,
            )
        values[field] = parsed
        origin[field] = where

    for raw_key, value in headers.items():
        key = raw_key.lower()
        if not key.startswith(HEADER_PREFIX):
            continue
        field = _HEADER_FIELDS.get(key[len(HEADER_PREFIX) :])
        if field is None:
            known = ", ".join(HEADER_PREFIX + k for k in _HEADER_FIELDS)
            raise SLOParamError(f"unknown SLO header {key!r}; known headers: {known}", key)
        put(field, value.strip(), f"header {key}")
    slo_obj = body.get("slo")
    if slo_obj is not None:
        if not isinstance(slo_obj, Mapping):
            raise SLOParamError('body field \'slo\' must be a JSON object, e.g. {"tier": "gold"}', "slo")
        for key, value in slo_obj.items():
            put(str(key), value, f"body field 'slo.{key}'")
    for alias, field in _JITSERVE_FIELDS.items():
        if body.get(alias) is not None:
            put(field, body[alias], f"body field {alias!r}")
    return SLORequest.model_validate(values)


def to_headers(slo: SLORequest) -> dict[str, str]:
    """The same SLO as ``x-slo-*`` headers (how the router forwards it to a pod)."""
    by_field = {field: HEADER_PREFIX + suffix for suffix, field in _HEADER_FIELDS.items()}
    return {by_field[k]: str(v) for k, v in slo.model_dump(exclude_none=True).items()}


def strip_slo_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body without the SLO fields, ready to forward to an engine that does not know them."""
    return {k: v for k, v in body.items() if k not in BODY_FIELDS}
