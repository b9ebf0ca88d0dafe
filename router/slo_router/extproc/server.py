"""The ext_proc v3 ``ExternalProcessor`` service the gateway calls for every inference request.

Per request (one gRPC stream): Envoy sends the request headers, then the body (whole, in ``buffered``
mode; in chunks without waiting for answers, in ``full-duplex`` mode, as the endpoint-picker protocol
asks); once the body is complete the picker runs :func:`~slo_router.extproc.pick.pick` and answers with
the chosen pod (``x-gateway-destination-endpoint`` header and ``envoy.lb`` dynamic metadata), the
router's upstream headers and the body with slofleet's SLO fields stripped — or with an immediate
OpenAI-shaped 400/401/404/413/429/503. Response headers and body pass through unchanged; the end of the
response (or of the stream) releases the request from the pod's load estimate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from slo_core.wire.request_slo import SERVED_TIER_HEADER
from slo_router.app import RouterState
from slo_router.errors import APIError
from slo_router.extproc import messages as m
from slo_router.extproc.pick import Picked, client_internal_headers, pick

log = logging.getLogger(__name__)

BodyMode = Literal["full-duplex", "buffered"]
MAX_BODY_BYTES = 8 << 20
REMOVED_HEADERS = ("authorization",)  # the tenant's key stays at the gateway; the pod gets the tenant


@dataclass
class _Exchange:
    """What one stream has seen so far."""

    headers: dict[str, str] = field(default_factory=dict)
    subset: frozenset[str] | None = None
    body: bytearray = field(default_factory=bytearray)
    picked: Picked | None = None
    done: bool = False


class EndpointPicker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, state: RouterState, *, body_mode: BodyMode = "full-duplex") -> None:
        self.state = state
        self.body_mode = body_mode

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        ex = _Exchange()
        try:
            async for req in request_iterator:
                if ex.done:  # answered immediately: read on until Envoy closes its side, answer nothing
                    continue
                for resp in await self._on(ex, req):
                    yield resp
        finally:
            self._release(ex)

    async def _on(self, ex: _Exchange, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        which = req.WhichOneof("request")
        if which == "request_headers":
            ex.headers = m.header_map(req.request_headers)
            ex.subset = m.subset_hint(req)
            if req.request_headers.end_of_stream:  # no body follows: decide on the headers alone
                return await self._decide(ex)
            return [m.headers_continue()] if self.body_mode == "buffered" else []
        if which == "request_body":
            ex.body += req.request_body.body
            if len(ex.body) > MAX_BODY_BYTES:
                ex.done = True
                err = APIError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
                return [m.immediate(err)]
            return await self._decide(ex) if req.request_body.end_of_stream else []
        if which == "request_trailers":
            out = [] if ex.picked is not None else await self._decide(ex)
            return [*out, pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
        if which == "response_headers":
            self._observe_status(ex, m.header_map(req.response_headers).get(":status", ""))
            served = {SERVED_TIER_HEADER: ex.picked.tier} if ex.picked is not None else None
            if req.response_headers.end_of_stream:
                self._release(ex)
            return [m.response_headers_continue(served)]
        if which == "response_body":
            end = req.response_body.end_of_stream
            if end:
                self._release(ex)
            chunk = req.response_body.body if self.body_mode == "full-duplex" else None
            return [m.response_body_continue(chunk, end)]
        if which == "response_trailers":
            self._release(ex)
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []

    async def _decide(self, ex: _Exchange) -> list[pb.ProcessingResponse]:
        headers = ex.headers
        try:
            picked = await pick(
                self.state,
                headers.get(":method", ""),
                headers.get(":path", ""),
                {k: v for k, v in headers.items() if not k.startswith(":")},
                bytes(ex.body),
                subset=ex.subset,
            )
        except APIError as err:
            ex.done = True
            return [m.immediate(err)]
        ex.picked = picked
        remove = [*REMOVED_HEADERS, *client_internal_headers(headers)]
        remove = [h for h in remove if h not in picked.set_headers]
        metadata = m.destination_metadata(picked.address)
        if self.body_mode == "buffered" or not ex.body:
            common = m.routed_headers(picked.address, picked.set_headers, remove, body_len=len(picked.body))
            if ex.body:
                common.body_mutation.body = picked.body
                return [
                    pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
                    )
                ]
            return [
                pb.ProcessingResponse(
                    request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
                )
            ]
        common = m.routed_headers(picked.address, picked.set_headers, remove, body_len=len(picked.body))
        body = pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(body=picked.body, end_of_stream=True)
            )
        )
        return [
            pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
            ),
            pb.ProcessingResponse(request_body=pb.BodyResponse(response=body)),
        ]

    def _observe_status(self, ex: _Exchange, status: str) -> None:
        """The pod's answer feeds its circuit breaker as the router's own proxy does."""
        if ex.picked is None or not status.isdigit():
            return
        code = int(status)
        if code >= 500 and code != 503:
            ex.picked.endpoint.breaker.failure()
        elif code < 500:
            ex.picked.endpoint.breaker.success()

    def _release(self, ex: _Exchange) -> None:
        if ex.picked is not None:
            ex.picked.endpoint.forget_sent(ex.picked.view.request_id)
            ex.picked = None


HEALTH_PERIOD_S = 1.0
LIVENESS, READINESS = "liveness", "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


def serving(state: RouterState) -> bool:
    """Ready to pick: started up (SLOPolicy and key Secrets read, pods listed) and a pod is usable."""
    return state.settled() and bool(state.usable_endpoints())


async def follow_health(state: RouterState, health: Any, period_s: float = HEALTH_PERIOD_S) -> None:
    """The protocol's gRPC health services: liveness always, readiness and ext_proc while serving."""
    await health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    while True:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving(state)
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in (READINESS, EXT_PROC_SERVICE, ""):
            await health.set(name, status)
        await asyncio.sleep(period_s)


def server_options() -> list[tuple[str, int]]:
    """A buffered body arrives as one message: let one of MAX_BODY_BYTES through (then answer 413)."""
    return [("grpc.max_receive_message_length", MAX_BODY_BYTES + (64 << 10))]


def add_to_server(
    server: grpc.aio.Server, state: RouterState, *, body_mode: BodyMode = "full-duplex"
) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(EndpointPicker(state, body_mode=body_mode), server)


async def serve(state: RouterState, *, host: str, port: int, body_mode: BodyMode = "full-duplex") -> None:
    """Run the picker's gRPC server on the router's event loop until cancelled."""
    server = grpc.aio.server(options=server_options())
    add_to_server(server, state, body_mode=body_mode)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    log.info("endpoint picker (ext_proc v3, %s bodies) on %s:%d", body_mode, host, bound)
    follower = asyncio.create_task(follow_health(state, health))
    try:
        await server.wait_for_termination()
    finally:
        follower.cancel()
        await server.stop(grace=5)
