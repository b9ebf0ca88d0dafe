"""ext_proc v3 messages the picker sends: continue with header/body mutations and the chosen endpoint, or
an immediate (OpenAI-shaped) error response. Built from the xds-protos package's generated classes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from slo_core.wire.openai import APIError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"  # dynamic-metadata namespace of the chosen endpoint
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Envoy's header list as a lower-cased dict (Envoy sends values in ``raw_value`` since 1.27)."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        key = h.key.lower()
        out[key] = f"{out[key]},{value}" if key in out and not key.startswith(":") else value
    return out


def subset_hint(request: pb.ProcessingRequest) -> frozenset[str] | None:
    """The ``ip:port`` endpoints the gateway allows for this request, or None when it sets no hint."""
    md = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in md:
        return None
    fields = md[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    values = fields[SUBSET_KEY].list_value.values
    return frozenset(v.string_value for v in values if v.string_value)


def served_endpoint(request: pb.ProcessingRequest) -> str | None:
    md = request.metadata_context.filter_metadata
    if DESTINATION_NAMESPACE not in md:
        return None
    value = md[DESTINATION_NAMESPACE].fields.get(SERVED_KEY)
    return value.string_value or None if value is not None else None


def _mutation(set_headers: Mapping[str, str], remove: Sequence[str]) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode("utf-8")),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def destination_metadata(address: str) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    md.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: address}})
    return md


def routed_headers(
    address: str, set_headers: Mapping[str, str], remove: Sequence[str], *, body_len: int | None
) -> pb.CommonResponse:
    """Continue with the destination header, slofleet's upstream headers, and the client's internal and
    credential headers removed; the route cache is cleared so a route on the header sees it."""
    headers = {**set_headers, DESTINATION_HEADER: address}
    if body_len is not None:
        headers["content-length"] = str(body_len)
    return pb.CommonResponse(
        status=pb.CommonResponse.CONTINUE,
        header_mutation=_mutation(headers, remove),
        clear_route_cache=True,
    )


def headers_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=pb.CommonResponse()))


def response_headers_continue(set_headers: Mapping[str, str] | None = None) -> pb.ProcessingResponse:
    """The pod's response headers passed on, with ``set_headers`` set on them (e.g. the served tier)."""
    common = (
        pb.CommonResponse(header_mutation=_mutation(set_headers, ())) if set_headers else pb.CommonResponse()
    )
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))


def response_body_continue(chunk: bytes | None, end: bool) -> pb.ProcessingResponse:
    """A response body chunk passed on: unchanged (buffered/streamed) or echoed (full-duplex)."""
    if chunk is None:
        return pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse()))
    return pb.ProcessingResponse(
        response_body=pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=end)
                )
            )
        )
    )


def immediate(err: APIError) -> pb.ProcessingResponse:
    """The router's error, answered by the gateway itself: status, OpenAI-shaped JSON, Retry-After."""
    headers = {"content-type": "application/json", **{k.lower(): v for k, v in err.headers().items()}}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=_mutation(headers, ()),
            body=json.dumps(err.body()).encode("utf-8"),
            details=err.code if isinstance(err.code, str) else "",
        )
    )
