"""The HTTP stack of the token path, chosen by measurement: the same byte relay on each stack, side by side.

One engine-sim, and in front of it the relay of bench/lean_relay.py on three stacks plus the router
itself (engine mode's plain relay, no tags):

- ``aiohttp``       aiohttp's server and client (the floor of bench/path_overhead.py)
- ``asgi+aiohttp``  uvicorn + httptools + uvloop (the router's and sidecar's server), aiohttp's client
- ``asgi+slo_net``  the same server with slo_net.upstream (the router's and sidecar's client)
- ``router``        the router, on the last stack, with everything it does per request

Each is driven with the closed-loop load of path_overhead.py (its ``_round``), stacks interleaved round
by round, at two shapes: 1-token requests (the CPU column is then CPU per request: what a stack costs to
take a request in and send it on) and 64-token streams (CPU per token). Ratios are against ``aiohttp``
in the same run:

    .venv/bin/python bench/relay_stacks.py [--clients 64] [--rounds 3] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from path_overhead import POLICY, ROOT, _cpu_s, _free_port, _round, _slofleet, _wait_ready, run_and_report

STACKS = ("aiohttp", "asgi+aiohttp", "asgi+slo_net", "router")
SHAPES = ((1, 640), (64, 128))  # (max_tokens, requests per round)


def _spawn(work: Path, model: str) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    exe, py = _slofleet(), sys.executable
    port = {k: _free_port() for k in ("engine", *STACKS)}
    url = {k: f"http://127.0.0.1:{p}" for k, p in port.items()}
    endpoints = f"endpoints:\n  - id: e\n    url: {url['engine']}\n    models: [{model}]\n"
    (work / "router.yaml").write_text(endpoints)
    (work / "policy.yaml").write_text(POLICY)
    relay = [py, str(ROOT / "bench" / "lean_relay.py"), "--upstream", url["engine"], "--port"]
    cmds = {
        "engine": [exe, "--log-level", "WARNING", "engine-sim", "--host", "127.0.0.1", "--port",
                   str(port["engine"]), "--model", model],
        "aiohttp": [*relay, str(port["aiohttp"])],
        "asgi+aiohttp": [*relay, str(port["asgi+aiohttp"]), "--stack", "asgi-aiohttp"],
        "asgi+slo_net": [*relay, str(port["asgi+slo_net"]), "--stack", "asgi-slonet"],
        "router": [exe, "--log-level", "WARNING", "router", "--host", "127.0.0.1",
                   "--port", str(port["router"]), "--endpoints", str(work / "router.yaml"),
                   "--policy-file", str(work / "policy.yaml")],
    }  # fmt: skip
    logs = {k: (work / f"{k}.log").open("wb") for k in cmds}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = {
        k: subprocess.Popen(c, env=env, stdout=logs[k], stderr=subprocess.STDOUT) for k, c in cmds.items()
    }
    return procs, url


async def _bench(
    args: argparse.Namespace, procs: dict[str, subprocess.Popen[bytes]], url: dict[str, str]
) -> dict[str, Any]:
    await _wait_ready([url[s] + ("/ready" if s == "router" else "/health") for s in STACKS])
    for s in STACKS:
        await _round(url[s], args.model, 4, 8, 8)
    out: dict[str, Any] = {}
    for max_tokens, requests in SHAPES:
        rounds: dict[str, list[dict[str, float]]] = {s: [] for s in STACKS}
        for _ in range(args.rounds):
            for s in STACKS:
                await _round(url[s], args.model, args.clients, args.clients, 1)  # warm pools
                cpu0 = _cpu_s(procs[s].pid)
                r = await _round(url[s], args.model, args.clients, requests, max_tokens)
                done = max(1, requests - int(r["failed"]))
                r["cpu_us_per_request"] = 1e6 * (_cpu_s(procs[s].pid) - cpu0) / done
                r["cpu_us_per_token"] = r["cpu_us_per_request"] / max_tokens
                rounds[s].append(r)
        med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in rounds.items()}
        for s, rs in rounds.items():
            med[s]["failed"] = sum(r["failed"] for r in rs)
        out[str(max_tokens)] = {"rounds": rounds, "median": med}
    return out


def _table(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"{m['cpus']} CPUs; 1-min load average {m['load_1min_before']:.2f} before, "
        f"{m['load_1min_after']:.2f} after; {res['config']['clients']} closed-loop clients; "
        f"median of {res['config']['rounds']} interleaved rounds; relay CPU read from /proc",
        "",
    ]
    for max_tokens, r in res["by_shape"].items():
        med = r["median"]
        base = med["aiohttp"]
        unit = "request" if max_tokens == "1" else "token"
        lines += [
            f"### {max_tokens}-token requests",
            "",
            f"| stack | relay CPU us per {unit} | vs aiohttp | TTFT p50 ms | over aiohttp ms | tok/s ratio "
            "| failed |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in STACKS:
            p = med[s]
            cpu, ref = p[f"cpu_us_per_{unit}"], base[f"cpu_us_per_{unit}"]
            lines.append(
                f"| {s} | {cpu:.0f} | {cpu / ref:.2f}x | {1000 * p['ttft_p50_s']:.1f} | "
                f"{1000 * (p['ttft_p50_s'] - base['ttft_p50_s']):+.1f} | "
                f"{p['tokens_per_s'] / base['tokens_per_s']:.3f} | {p['failed']} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--md", type=Path, help="write the table here (and the full result as .json beside it)")
    args = p.parse_args()
    return run_and_report(
        args,
        "by_shape",
        lambda work: _spawn(work, args.model),
        lambda procs, url: _bench(args, procs, url),
        _table,
    )


if __name__ == "__main__":
    sys.exit(main())
