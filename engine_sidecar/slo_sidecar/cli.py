"""``slofleet sidecar``: in-pod SLO scheduler in front of an OpenAI-compatible engine (vLLM or engine-sim)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from slo_sidecar.config import ConfigError, PolicyConfig, SidecarKnobs, parse_policy_file

log = logging.getLogger(__name__)


def register(parser: argparse.ArgumentParser) -> None:
    """Run the SLO-aware sidecar (HTTP front, analyzer, scheduler, gRPC) in front of an engine."""
    parser.add_argument("--port", type=int, required=True, help="HTTP port of the OpenAI-compatible front")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--engine-url", required=True, help="engine base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--policy-file", type=Path, help="SLOPolicy YAML (hot-reloaded); absent: one default tier"
    )
    parser.add_argument("--grpc-port", type=int, help="gRPC port (Analyzer, State); absent: no gRPC")
    parser.add_argument(
        "--metrics-port", type=int, help="serve /metrics on this port only (absent: on the HTTP port)"
    )
    parser.add_argument(
        "--calibration-port",
        type=int,
        help="serve the peers' calibration state (GET /slofleet/calibration) on this port only "
        "(absent: on the HTTP port)",
    )
    parser.add_argument(
        "--mode",
        choices=["proxy", "engine"],
        default="proxy",
        help="proxy: hold/release/preempt here; engine: SLO tags in vllm_xargs",
    )
    parser.add_argument("--state-dir", type=Path, help="directory for checkpoints (history, predictor)")
    parser.add_argument(
        "--predictor",
        default="shipped",
        help="'shipped' (QRF artefact), 'fallback' (quantile of shipped lengths) or a path",
    )
    parser.add_argument(
        "--predictor-sha256",
        help="SHA-256 (hex) the --predictor artefact must have (pinned by the operator)",
    )
    for name, field in SidecarKnobs.model_fields.items():
        if name == "mode":
            continue
        flag = "--" + name.replace("_", "-")
        kind = type(field.default) if field.default is not None else int
        if kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default, help=field.description
            )
        else:
            parser.add_argument(flag, type=kind, default=field.default, help=field.description)
    parser.add_argument(
        "--tag-key-file",
        type=Path,
        help="the tag-key Secret's file (followed live): engine mode signs SLO tags for the vLLM plugin, "
        "and every gRPC call must carry a token made with it",
    )
    parser.set_defaults(func=run)


def _knobs(args: argparse.Namespace) -> SidecarKnobs:
    values = {name: getattr(args, name) for name in SidecarKnobs.model_fields if name != "mode"}
    return SidecarKnobs(mode=args.mode, **values)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the service extra pins it): measured in bench/path_overhead.py, it
    takes a large share off the relay's CPU per streamed chunk; None: asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    from slo_sidecar.estimators import load_length_estimator
    from slo_sidecar.runtime import serve_forever
    from slo_sidecar.service import Sidecar

    try:
        knobs = _knobs(args)
        config = parse_policy_file(args.policy_file) if args.policy_file else PolicyConfig.default()
    except (ConfigError, ValueError) as exc:
        print(f"slofleet sidecar: {exc}", file=sys.stderr)
        return 2
    try:
        estimator, source = load_length_estimator(args.predictor, args.state_dir, args.predictor_sha256)
    except ValueError as exc:  # ArtefactError: a swapped or corrupt artefact is never served
        print(f"slofleet sidecar: {exc}", file=sys.stderr)
        return 2
    sc = Sidecar(
        knobs=knobs, config=config, engine_url=args.engine_url, estimator=estimator, estimator_source=source
    )
    if args.tag_key_file:
        from slo_core.wire.keyring import KeyFile

        try:
            sc.keys = KeyFile(args.tag_key_file)  # followed live: the operator rotates the Secret
        except (OSError, ValueError) as exc:
            print(f"slofleet sidecar: --tag-key-file: {exc}", file=sys.stderr)
            return 2
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(
            serve_forever(
                sc,
                host=args.host,
                port=args.port,
                grpc_port=args.grpc_port,
                metrics_port=args.metrics_port,
                calibration_port=args.calibration_port,
                state_dir=args.state_dir,
                policy_file=args.policy_file,
            )
        )
    return 0
