"""The router's cost: TTFT p50 and token throughput through the router vs straight to the sidecars.

Starts a local fleet (``slofleet up``'s processes: engine-sim, a sidecar each, the router) and drives it
with the same closed-loop streaming load in alternating rounds: *direct* (each client sends to the
sidecars round-robin itself) and *router* (every request through the router, which dispatches with the
fleet's routing policy). ``ignore_eos`` makes every request produce exactly ``max_tokens``; TTFT is
measured by the client (request sent → first content chunk). Reported as ratios from this one run:

    .venv/bin/python bench/router_overhead.py [--engines 4] [--clients 32] [--requests 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from slo_lab.localfleet.launcher import LocalFleet
from slo_lab.localfleet.spec import EngineGroup, FleetSpec

ROOT = Path(__file__).resolve().parents[1]
POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: overhead, namespace: default}
spec:
  priorityClasses: [{name: std, weight: 1}]
  tiers: [{name: batch, kind: deadline, deadlineS: 900, priorityClass: std}]
  defaultTier: batch
  admission: {maxWaitS: 600}
  scheduling: {name: fcfs}
  routing: {name: %s}
"""


async def _one(h: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float | None, int]:
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with h.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return None, 0
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"error"' not in line:
                tokens += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    return ttft, tokens


async def _round(urls: list[str], model: str, args: argparse.Namespace) -> dict[str, Any]:
    """C clients send ``requests`` streams back to back, cycling over ``urls``."""
    body = {"model": model, "prompt": "Summarise the benefits of SLO-aware routing. " * 8,
            "max_tokens": args.max_tokens, "stream": True, "ignore_eos": True}  # fmt: skip
    todo = iter(range(args.requests))
    targets = itertools.cycle(urls)
    ttfts: list[float] = []
    tokens = failed = 0

    async def client(h: httpx.AsyncClient) -> None:
        nonlocal tokens, failed
        for _ in todo:
            ttft, n = await _one(h, next(targets), body)
            if ttft is None:
                failed += 1
            else:
                ttfts.append(ttft)
                tokens += n

    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(limits=limits, timeout=600) as h:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(h) for _ in range(args.clients)))
        wall = time.perf_counter() - t0
    return {"ttft_p50_s": statistics.median(ttfts) if ttfts else None, "tok_per_s": tokens / wall,
            "failed": failed, "wall_s": wall}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir) if args.workdir else None
    spec_kw: dict[str, Any] = {"workdir": work} if work else {}
    policy_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"router-overhead-{os.getpid()}.yaml"
    policy_path.write_text(POLICY % args.routing_policy)
    spec = FleetSpec(
        engines=[EngineGroup(count=args.engines, profile=args.profile, speedup=args.speedup)],
        port=0,
        policy_file=policy_path,
        **spec_kw,
    )
    with LocalFleet(spec) as fleet:
        model = next(p.model for p in fleet.pods if p.model)
        direct_urls = [p.sidecar_url for p in fleet.pods]
        rounds: dict[str, list[dict[str, Any]]] = {"direct": [], "router": []}
        asyncio.run(
            _round(direct_urls, model, argparse.Namespace(**{**vars(args), "requests": args.clients}))
        )
        for _ in range(args.rounds):  # alternate, so a shared machine's drift hits both sides alike
            rounds["direct"].append(asyncio.run(_round(direct_urls, model, args)))
            rounds["router"].append(asyncio.run(_round([fleet.router_url], model, args)))
    policy_path.unlink(missing_ok=True)
    med = {
        side: {
            k: statistics.median(r[k] for r in rs if r[k] is not None) for k in ("ttft_p50_s", "tok_per_s")
        }
        for side, rs in rounds.items()
    }
    return {
        "machine": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]},
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
        "rounds": rounds,
        "median": med,
        "failed": {side: sum(r["failed"] for r in rs) for side, rs in rounds.items()},
        "added_ttft_p50_ms": (med["router"]["ttft_p50_s"] - med["direct"]["ttft_p50_s"]) * 1000,
        "ttft_ratio": med["router"]["ttft_p50_s"] / med["direct"]["ttft_p50_s"],
        "throughput_ratio": med["router"]["tok_per_s"] / med["direct"]["tok_per_s"],
    }


def report(res: dict[str, Any]) -> str:
    c, m, med = res["config"], res["machine"], res["median"]
    head = (
        f"# {m['cpus']} CPUs, 1-min load average {m['load_1min']:.2f}; {c['engines']} × engine-sim "
        f"{c['profile']} speedup {c['speedup']}, routing {c['routing_policy']}; {c['clients']} streaming "
        f"clients, {c['requests']} requests × {c['max_tokens']} tokens per round, median of {c['rounds']} "
        f"alternating rounds; failed: {res['failed']}"
    )
    d, r = med["direct"], med["router"]
    return "\n".join([
        head,
        f"TTFT p50      direct {d['ttft_p50_s'] * 1000:9.1f} ms   router {r['ttft_p50_s'] * 1000:9.1f} ms   "
        f"added {res['added_ttft_p50_ms']:+.1f} ms   ratio {res['ttft_ratio']:.3f}",
        f"throughput    direct {d['tok_per_s']:9.0f} tok/s router {r['tok_per_s']:9.0f} tok/s   "
        f"ratio {res['throughput_ratio']:.3f}",
    ])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--profile", default="h100-llama3-8b-tp1")
    p.add_argument("--speedup", type=float, default=1.0, help="engine-sim speed relative to the profile")
    p.add_argument("--routing-policy", default="go-routing")
    p.add_argument("--clients", type=int, default=32, help="concurrent closed-loop clients")
    p.add_argument("--requests", type=int, default=128, help="requests per round")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", help="keep the fleet's logs here")
    p.add_argument("--json", help="write the full result here")
    args = p.parse_args()
    res = run(args)
    text = report(res)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
        Path(args.json).with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
