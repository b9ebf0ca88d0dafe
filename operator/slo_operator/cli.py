"""``slofleet operator``: run the kopf operator (settings from ``SLOFLEET_OPERATOR_*``, flags override)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from typing import Any

import kopf
from prometheus_client import start_http_server

from slo_operator.autoscaler import Autoscaler
from slo_operator.handlers import build_registry, post_event
from slo_operator.keyrotation import KeyRotator, rotate_forever
from slo_operator.kubeapi import ApiError, KubeApi, load_configuration
from slo_operator.pluginhealth import PluginHealth, watch_plugins_forever
from slo_operator.reconcile import Reconciler
from slo_operator.settings import ENV_PREFIX, OperatorSettings

log = logging.getLogger(__name__)

__all__ = ["ENV_PREFIX", "OperatorSettings", "operate", "register", "run"]


def ensure_peering(api: KubeApi, settings: OperatorSettings) -> None:
    """Create the kopf peering object(s) replicas elect a leader through, unless they exist already."""
    if settings.peering is None:
        return
    body = {"metadata": {"name": settings.peering}}
    if settings.namespaces:
        targets = [
            (f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings", "KopfPeering") for ns in settings.namespaces
        ]
    else:
        targets = [("/apis/kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering")]
    for where, kind in targets:
        try:
            api.request("POST", where, {"apiVersion": "kopf.dev/v1", "kind": kind, **body})
        except ApiError as err:
            if err.code != 409:  # 409: another replica created it first
                raise


async def operate(
    settings: OperatorSettings,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    kubeconfig: str | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever); credentials as :func:`load_configuration`."""
    api = KubeApi(load_configuration(kubeconfig), settings.field_manager, settings.request_timeout_s)
    reconciler = Reconciler(api, settings, events=post_event)
    autoscaler = Autoscaler(reconciler)
    registry = build_registry(reconciler, kubeconfig)
    log.info("slofleet operator: %s", settings.describe())
    await asyncio.to_thread(ensure_peering, api, settings)
    server = None
    if settings.metrics_port is not None:
        server, _ = start_http_server(settings.metrics_port, registry=autoscaler.metrics.registry)
    stop_scaling = asyncio.Event()
    scaling = asyncio.create_task(autoscaler.run(stop_scaling))
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    jobs = []
    if settings.tag_key_secret and settings.tag_key_namespace and settings.tag_key_rotation_s:
        rotator = KeyRotator(api, settings)
        jobs.append(asyncio.create_task(rotate_forever(rotator, settings.tag_key_check_s), name="tag-key"))
    if settings.plugin_check_s:
        health = PluginHealth()
        reconciler.extra_condition = health.condition
        job = watch_plugins_forever(health, reconciler, settings.plugin_check_s)
        jobs.append(asyncio.create_task(job, name="plugin-health"))
    try:
        await kopf.operator(
            registry=registry,
            standalone=settings.peering is None,
            peering_name=settings.peering,
            priority=settings.priority,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        stop_scaling.set()  # kopf may have cancelled it on exit already: that is not an error
        await asyncio.gather(scaling, return_exceptions=True)
        if server is not None:
            server.shutdown()
            server.server_close()
        autoscaler.close()
        for task in jobs:
            task.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        api.close()


def register(parser: argparse.ArgumentParser) -> None:
    """Run the operator: ModelDeployments and SLOPolicies become SLO-aware vLLM fleets."""
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="namespace to watch (repeatable; default: SLOFLEET_OPERATOR_NAMESPACES, else all)",
    )
    parser.add_argument("--image", help="slofleet image for sidecars and the plugin init container")
    parser.add_argument("--engine-image", help="default vLLM image of engine pods")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", help="kopf peering object for leader election between replicas")
    peering.add_argument("--standalone", action="store_true", help="no leader election (one replica)")
    parser.add_argument("--priority", type=int, help="peering priority of this replica")
    parser.add_argument("--liveness-port", type=int, help="port of /healthz (0 disables it)")
    parser.add_argument("--drain-s", type=int, help="seconds a terminating engine pod gets to drain")
    parser.add_argument("--metrics-port", type=int, help="port of the operator's /metrics (absent: none)")
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> OperatorSettings:
    overrides: dict[str, Any] = {
        "namespaces": tuple(args.namespaces) if args.namespaces else None,
        "image": args.image,
        "engine_image": args.engine_image,
        "peering": args.peering,
        "priority": args.priority,
        "drain_s": args.drain_s,
        "metrics_port": args.metrics_port,
    }
    settings = OperatorSettings.from_env(**overrides)
    changes: dict[str, Any] = {}
    if args.standalone:
        changes["peering"] = None
    if args.liveness_port is not None:
        changes["liveness_port"] = args.liveness_port or None
    return settings.model_copy(update=changes) if changes else settings


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        log.error("invalid operator settings: %s", exc)
        return 2
    asyncio.run(operate(settings))
    return 0
