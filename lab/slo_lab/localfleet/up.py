"""``slofleet up``: a local SLO-aware fleet (engines, a sidecar per engine, one router) until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from slo_lab.localfleet.launcher import FleetError, LocalFleet
from slo_lab.localfleet.spec import DEFAULT_PROFILE, EngineGroup, FleetSpec, load_fleet_spec


def register(parser: argparse.ArgumentParser) -> None:
    """Start a local SLO-aware fleet: simulated engines, a sidecar each, one router; Ctrl-C stops it."""
    parser.add_argument(
        "--config", help="fleet YAML (engines, router port, policy file, mode); flags override"
    )
    parser.add_argument("--engines", type=int, help="number of simulated engines (default 2)")
    parser.add_argument(
        "--profile", help=f"GPU/model performance profile of the engines (default {DEFAULT_PROFILE})"
    )
    parser.add_argument(
        "--speedup", type=float, help="simulated GPU speed relative to the profile (default 1)"
    )
    parser.add_argument("--port", type=int, help="router port (default 8000; 0 picks a free one)")
    parser.add_argument("--policy-file", help="SLOPolicy YAML (default: examples/slopolicy-chat-agent.yaml)")
    parser.add_argument(
        "--mode", choices=["engine", "proxy"], help="where the engine policy runs (default engine)"
    )
    parser.add_argument(
        "--workdir", help="folder for logs, endpoints and sidecar state (default: a temp dir)"
    )
    parser.set_defaults(func=run)


def spec_from_args(args: argparse.Namespace) -> FleetSpec:
    spec = load_fleet_spec(args.config) if args.config else FleetSpec()
    update: dict[str, Any] = {}
    if args.engines is not None or args.profile or args.speedup:
        base = spec.engines[0]
        group = EngineGroup(
            count=args.engines if args.engines is not None else spec.engine_count,
            profile=args.profile or base.profile,
            speedup=args.speedup or base.speedup,
            model=base.model,
            max_num_seqs=base.max_num_seqs,
        )
        update["engines"] = [group]
    for name in ("port", "mode"):
        if getattr(args, name) is not None:
            update[name] = getattr(args, name)
    if args.policy_file:
        update["policy_file"] = Path(args.policy_file)
    if args.workdir:
        update["workdir"] = Path(args.workdir)
    return FleetSpec.model_validate({**spec.model_dump(), **update})


def client_snippet(fleet: LocalFleet) -> str:
    tier = fleet.policy.spec.default_tier
    return f'''from openai import OpenAI

client = OpenAI(base_url="{fleet.router_url}/v1", api_key="local")
stream = client.chat.completions.create(
    model="{fleet.served_model()}",
    messages=[{{"role": "user", "content": "Say hello to slofleet."}}],
    max_tokens=64,
    stream=True,
    extra_headers={{"x-slo-tier": "{tier}"}},
)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()'''


def banner(fleet: LocalFleet) -> str:
    spec = fleet.policy.spec
    lines = [
        f"slofleet is up: {len(fleet.pods)} engine(s) behind the router at {fleet.router_url}/v1",
        f"  policy: {fleet.policy_file} (engine policy {spec.scheduling.name}, routing {spec.routing.name})",
        f"  tiers: {', '.join(t.name for t in spec.tiers)} (default {spec.default_tier}; "
        "choose one with the x-slo-tier header)",
    ]
    for pod in fleet.pods:
        if pod.direct:
            lines.append(
                f"  {pod.pod_id}: router -> engine {pod.engine_url} ({pod.profile}); "
                f"sidecar {pod.sidecar_url} (analyzer, state)"
            )
        else:
            lines.append(f"  {pod.pod_id}: sidecar {pod.sidecar_url} -> engine {pod.engine_url}")
    lines += [f"  logs: {fleet.workdir / 'logs'}", "", "Paste into Python:", "", client_snippet(fleet), ""]
    lines.append("Ctrl-C drains and stops everything.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
        fleet = LocalFleet(spec)
    except (ValueError, FleetError) as exc:
        print(f"slofleet up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        fleet.start()
    except FleetError as exc:
        print(f"slofleet up: {exc}", file=sys.stderr)
        fleet.cleanup()
        return 1
    print(banner(fleet), flush=True)
    code = 0
    try:
        while not stop.wait(1.0):
            dead = fleet.dead()
            if dead:
                names = ", ".join(c.name for c in dead)
                print(f"slofleet up: {names} exited; stopping the fleet\n{dead[0].tail()}", file=sys.stderr)
                code = 1
                break
    finally:
        print("draining and stopping ...", file=sys.stderr, flush=True)
        fleet.stop()
        fleet.cleanup()
    return code
