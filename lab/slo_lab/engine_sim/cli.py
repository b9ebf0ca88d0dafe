"""Run a simulated vLLM engine server (OpenAI API) timed by a GPU performance profile."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from pydantic import ValidationError


def register(parser: argparse.ArgumentParser) -> None:
    """Run a simulated vLLM engine server (OpenAI API) timed by a GPU performance profile."""
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--profile", default="h100-llama3-8b-tp1", help="performance profile: shipped name or JSON path"
    )
    parser.add_argument("--model", default=None, help="served model name (default: the profile's model)")
    parser.add_argument("--speedup", type=float, default=1.0, help="simulate a GPU X times faster")
    parser.add_argument("--policy", default="fcfs", help="engine policy from slo_core.policies.registry")
    parser.add_argument("--policy-params", default="{}", help="the policy's parameters as a JSON object")
    parser.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"], help="as vLLM's")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    parser.add_argument("--kv-cache-tokens", type=int, default=None, help="KV capacity (default: profile's)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: profile's)")
    parser.add_argument("--analyzer", default=None, help="HOST:PORT of a sidecar's gRPC analyzer (bounds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the policy's random generator")
    parser.add_argument(
        "--tag-key-file", default=None, help="keys SLO tags must be signed with (else: best effort)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .app import create_app
    from .server import serve_forever
    from .settings import EngineSimSettings

    try:
        params = json.loads(args.policy_params)
        if not isinstance(params, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        print(f"engine-sim: --policy-params must be a JSON object, e.g. '{{\"frame_steps\": 5}}' ({exc})",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        settings = EngineSimSettings(
            profile=args.profile,
            model=args.model,
            speedup=args.speedup,
            policy=args.policy,
            policy_params=params,
            scheduling_policy=args.scheduling_policy,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            kv_cache_tokens=args.kv_cache_tokens,
            max_model_len=args.max_model_len,
            analyzer=args.analyzer,
            seed=args.seed,
            tag_key_file=args.tag_key_file,
        )
        app = create_app(settings)
    except ValidationError as exc:
        print(f"engine-sim: invalid settings: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"engine-sim: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve_forever(app, args.host, args.port, log_level=args.log_level.lower()))
    return 0
