# syntax=docker/dockerfile:1
# The one slofleet image: `slofleet operator`, `slofleet router` and `slofleet sidecar`, and the source of
# the vLLM scheduler plugin, which each engine pod's init container copies from /opt/slofleet/plugin into
# a volume that vLLM imports through PYTHONPATH.
#
#   docker build -t ghcr.io/slofleet/slofleet:0.1.0 .
#   docker run --rm ghcr.io/slofleet/slofleet:0.1.0 --help

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/image.lock ./requirements/image.lock
COPY examples/slopolicy-chat-agent.yaml ./examples/slopolicy-chat-agent.yaml
COPY core ./core
COPY operator ./operator
COPY router ./router
COPY engine_sidecar ./engine_sidecar
COPY vllm_plugin ./vllm_plugin
COPY proto ./proto
COPY net ./net
COPY lab ./lab
# Everything the three services need (the bench extra, plotting, stays out), pinned by the lock.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install -c requirements/image.lock ".[service,operator,predictor]" \
 && /opt/venv/bin/slofleet --help > /dev/null
# The plugin is pure Python: only slo_vllm_plugin, slo_core and the generated slo_proto go into vLLM pods;
# vLLM's own image brings what they import (vllm, grpc, protobuf, prometheus_client, numpy, pydantic, yaml).
RUN mkdir -p /opt/slofleet/plugin \
 && cp -R core/slo_core vllm_plugin/slo_vllm_plugin proto/slo_proto /opt/slofleet/plugin/ \
 && find /opt/slofleet/plugin -name __pycache__ -prune -exec rm -rf {} +

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="slofleet" \
      org.opencontainers.image.description="SLO-aware LLM serving: operator, router, sidecar and vLLM scheduler plugin" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/slofleet/plugin /opt/slofleet/plugin
# A fixed numeric non-root user, so Kubernetes can verify runAsNonRoot; nothing is written outside the
# pods' emptyDir volumes (the root filesystem can be read-only).
RUN groupadd --gid 10001 slofleet \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin slofleet
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["slofleet"]
CMD ["--help"]
