"""``slofleet router``: run the fleet's OpenAI-compatible front door."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from slo_core.wire.keyring import KeyFile
from slo_core.wire.limits import RequestLimits
from slo_router.app import build_state, create_app, serve_metrics
from slo_router.config import AFFINITIES, RouterConfig, from_policy
from slo_router.discovery import apply_specs, load_endpoints_file, watch_static_file
from slo_router.tenants import KeyStore, load_keys_file

log = logging.getLogger(__name__)
# uvicorn closes an idle keep-alive connection after 5 s by default, exactly when httpx (the openai
# SDK's client) expires its own idle ones: a request sent on such a connection as the router closes it
# fails with "server disconnected" (likely the demo replay's one connection error in ~1,850 calls; its
# cause was not recorded then). Outlast the clients.
KEEP_ALIVE_S = 75.0


def register(parser: argparse.ArgumentParser) -> None:
    """Run the router: tiers, tenants and gain-based dispatch over the fleet's sidecars."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve /metrics on this port only (it names tenants: keep it off the public Service)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--endpoints", help="YAML file of endpoints (re-read when it changes)")
    source.add_argument("--kubernetes", action="store_true", help="discover pods of ModelDeployments")
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument("--policy-file", help="SLOPolicy YAML (tiers, tenants, routing policy)")
    policy.add_argument(
        "--policy-name",
        help="with --kubernetes: follow this SLOPolicy object in --namespace (re-read as it changes)",
    )
    parser.add_argument("--keys-file", help="local API keys: 'tenants: {NAME: [KEY, ...]}'")
    parser.add_argument("--routing-policy", help="override the SLOPolicy's routing policy name")
    parser.add_argument(
        "--affinity",
        default="",
        help=f"comma-separated affinity scorers to apply after the policy: {', '.join(sorted(AFFINITIES))}",
    )
    parser.add_argument(
        "--namespace", default=None, help="with --kubernetes: namespace to watch (default: all)"
    )
    parser.add_argument(
        "--peers-selector",
        help="with --kubernetes: label selector of this router's replicas; each enforces 1/N of every "
        "tenant's rate, N the ready replicas (fleet-wide tenant limits)",
    )
    parser.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=10.0,
        help="on SIGTERM, how long requests in flight may take to finish before they are cut",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=float,
        default=KEEP_ALIVE_S,
        help="how long an idle client connection stays open; longer than clients' own idle expiry "
        "(httpx and the openai SDK: 5 s) and load balancers' (60 s), so the router never closes a "
        "connection a client is reusing at that moment",
    )
    parser.add_argument(
        "--ext-proc-port",
        type=int,
        default=None,
        help="also serve as a Gateway API Inference Extension endpoint picker (Envoy ext_proc v3) here",
    )
    parser.add_argument(
        "--ext-proc-body-mode",
        choices=("full-duplex", "buffered"),
        default="full-duplex",
        help="the gateway's ext_proc request_body_mode: FULL_DUPLEX_STREAMED (the protocol's) or BUFFERED",
    )
    parser.add_argument(
        "--tag-key-file",
        help="the tag-key Secret's file (followed live, rotated by the operator): signs the SLO tags sent to "
        "engine-mode pods and authenticates the router's gRPC calls to sidecars",
    )
    defaults = RequestLimits()
    parser.add_argument(
        "--max-body-bytes", type=int, default=defaults.max_body_bytes, help="largest request body (bytes)"
    )
    parser.add_argument(
        "--max-header-bytes", type=int, default=defaults.max_header_bytes, help="largest header block (bytes)"
    )
    parser.add_argument(
        "--max-json-depth", type=int, default=defaults.max_json_depth, help="deepest JSON nesting (levels)"
    )
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        default=defaults.max_tokens_limit,
        help="largest max_tokens when no pod reports the model's context (tokens)",
    )
    parser.set_defaults(func=run)


def load_config(args: argparse.Namespace) -> tuple[RouterConfig, str]:
    """The router config and the namespace of the policy's Secrets."""
    require_keys = bool(args.keys_file) or bool(args.kubernetes)
    namespace = args.namespace or "default"
    if args.policy_file:
        from slo_core.crd.loads import load_policy

        policy = load_policy(args.policy_file)
        config = from_policy(policy.spec, require_keys=require_keys)
        namespace = args.namespace or policy.metadata.namespace or "default"
    else:  # one open tier; with --kubernetes keys stay required (a named policy brings tenants)
        config = dataclasses.replace(RouterConfig.single_tier(), require_keys=require_keys)
    return overrides(config, args), namespace


def overrides(config: RouterConfig, args: argparse.Namespace) -> RouterConfig:
    """What the command line sets over any policy the router reads (at start or when it changes)."""
    if args.routing_policy:
        config = dataclasses.replace(config, routing_policy=args.routing_policy, routing_params={})
    affinity = tuple(a.strip() for a in args.affinity.split(",") if a.strip())
    if affinity:
        config = dataclasses.replace(config, affinity=affinity)
    return config


def run(args: argparse.Namespace) -> int:
    import uvicorn

    if args.policy_name and not args.kubernetes:
        log.error("--policy-name needs --kubernetes (it names an SLOPolicy object); use --policy-file")
        return 2
    if args.kubernetes and not (args.policy_file or args.policy_name):
        log.warning(
            "no --policy-file or --policy-name: one open tier, but every request needs a known API key"
        )
    try:
        config, secrets_namespace = load_config(args)
        file_keys = load_keys_file(args.keys_file) if args.keys_file else {}
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    endpoints: dict[str, Any] = {}
    background = []
    if args.endpoints:
        try:
            apply_specs(endpoints, load_endpoints_file(args.endpoints))
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        path = args.endpoints
        background.append(lambda state: watch_static_file(path, state.endpoints))
    else:
        from slo_router.kube import watch_kubernetes

        namespace = args.namespace

        def kube(state: Any) -> Any:
            return watch_kubernetes(
                state,
                namespace=namespace,
                secrets_namespace=secrets_namespace,
                file_keys=file_keys,
                policy_name=args.policy_name,
                adjust=lambda config: overrides(config, args),
                peers_selector=args.peers_selector,
            )

        background.append(kube)
    if args.policy_file:  # followed live: an edit (a ConfigMap update) applies without a restart
        from slo_router.policyfile import follow_policy_file

        policy_path = args.policy_file
        background.append(
            lambda state: follow_policy_file(state, policy_path, adjust=lambda c: overrides(c, args))
        )
    from slo_router.statefeed import follow_states

    keys: KeyFile | None = None
    if args.tag_key_file:
        try:
            keys = KeyFile(args.tag_key_file)  # followed live: the operator rotates the Secret
        except (OSError, ValueError) as exc:
            log.error("--tag-key-file: %s", exc)
            return 2
    background.append(lambda state: follow_states(state, keys=keys))
    if args.ext_proc_port:
        from slo_router.extproc.server import serve as serve_picker

        port, mode = args.ext_proc_port, args.ext_proc_body_mode
        background.append(lambda state: serve_picker(state, host=args.host, port=port, body_mode=mode))
    try:
        state = build_state(config, KeyStore(file_keys), endpoints)
        state.limits = RequestLimits(
            args.max_body_bytes, args.max_header_bytes, args.max_json_depth, args.max_tokens_limit
        )
        state.tag_keys = keys
    except ValueError as exc:  # e.g. an unknown routing policy or parameter or limit
        log.error("%s", exc)
        return 2
    if args.metrics_port:
        metrics_host, metrics_port = args.host, args.metrics_port
        background.append(lambda state: serve_metrics(state, metrics_host, metrics_port))
    app = create_app(state, background=background, metrics_route=not args.metrics_port)
    log.info(
        "router on http://%s:%d (policy %s, %d endpoints)",
        args.host,
        args.port,
        config.routing_policy,
        len(endpoints),
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_keep_alive=max(1, round(args.keep_alive_s)),
        timeout_graceful_shutdown=max(1, round(args.shutdown_timeout_s)),
    )
    return 0
