"""Live-fleet routing comparison: one replayed trace through the real router, sidecars and engine-sims.

One local fleet (``slofleet up``'s processes) of heterogeneous pods — H100 and A100 Llama-3-8B
profiles — serves the same trace once per routing policy: for each policy a fresh ``slofleet router``
process is started over the same sidecars (``--routing-policy``), the trace is replayed open-loop at
its (rescaled) arrival times, and the router is stopped again. The trace is the first N requests of
the shipped Azure 2023 conversation trace (prompt and output lengths, inter-arrival gaps scaled to
``--rate-rps``); each request gets a tier by a hash of its index (50 % chat, 30 % batch, 20 % spare).
Goodput is computed client-side from each token's arrival time with ``slo_core.gain`` (token goodput,
priority-weighted), per tier. ``ignore_eos`` makes each request produce exactly its trace output length.

    .venv/bin/python bench/live_fleet/replay.py [--requests 240] [--rate-rps 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime
import gzip
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from slo_core import data
from slo_core.crd.loads import parse_policy
from slo_core.gain import Delivery, GainParams, goodput_function, request_goodput
from slo_lab.localfleet.launcher import LocalFleet, free_port
from slo_lab.localfleet.spec import EngineGroup, FleetSpec

POLICY = """\
apiVersion: slofleet.io/v1alpha1
kind: SLOPolicy
metadata: {name: live-fleet, namespace: default}
spec:
  priorityClasses: [{name: gold, weight: 3}, {name: silver, weight: 2}, {name: bronze, weight: 1}]
  tiers:
    - {name: chat, kind: latency, ttftS: 2.0, tbtS: 0.15, priorityClass: gold}
    - {name: batch, kind: deadline, deadlineS: 40, priorityClass: silver}
    - {name: spare, kind: best-effort, priorityClass: bronze}
  defaultTier: chat
  admission: {maxWaitS: 60, onOverload: reject}
  scheduling: {name: fcfs}
  routing: {name: go-routing}
"""
TIER_OF = ["chat"] * 5 + ["batch"] * 3 + ["spare"] * 2


def load_trace(n: int, rate_rps: float, max_prompt: int, max_output: int) -> list[dict[str, Any]]:
    """The first ``n`` requests: arrival offsets rescaled to ``rate_rps`` on average, lengths capped."""
    rows = []
    with gzip.open(data.path("azure2023_conv.csv.gz"), "rt") as f:
        for row in csv.DictReader(f):
            rows.append(row)
            if len(rows) == n:
                break
    stamps = [datetime.datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]
    span = max(stamps[-1] - stamps[0], 1e-9)
    scale = (n / rate_rps) / span
    return [
        {
            "at_s": (t - stamps[0]) * scale,
            "prompt_tokens": min(max_prompt, max(4, int(r["ContextTokens"]))),
            "output_tokens": min(max_output, max(1, int(r["GeneratedTokens"]))),
            "tier": TIER_OF[(i * 7919) % len(TIER_OF)],
        }
        for i, (t, r) in enumerate(zip(stamps, rows, strict=True))
    ]


async def _send(h: httpx.AsyncClient, url: str, model: str, i: int, req: dict[str, Any]) -> dict[str, Any]:
    words = " ".join(["w"] * (req["prompt_tokens"] - 2))
    body = {"model": model, "prompt": f"r{i} {words}", "max_tokens": req["output_tokens"], "stream": True,
            "ignore_eos": True}  # fmt: skip
    t0 = time.monotonic()
    times: list[float] = []
    status, completed = 0, False
    try:
        async with h.stream(
            "POST", url + "/v1/completions", json=body, headers={"x-slo-tier": req["tier"]}
        ) as r:
            status = r.status_code
            if status == 200:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        completed = len(times) > 0
                    elif line.startswith("data: {"):
                        if '"error"' in line:
                            status = 599
                            break
                        times.append(time.monotonic() - t0)
    except httpx.HTTPError:
        status = 598
    return {**req, "status": status, "token_times_s": times, "completed": completed and status == 200}


async def replay(url: str, model: str, trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=300) as h:
        start = time.monotonic()

        async def at(i: int, req: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start + req["at_s"] - time.monotonic()))
            return await _send(h, url, model, i, req)

        return list(await asyncio.gather(*(at(i, r) for i, r in enumerate(trace))))


def score(results: list[dict[str, Any]], tiers: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per tier: requests, completed, rejected (503), errors, SLO attainment, token goodput (weighted)."""
    fn, params = goodput_function("token"), GainParams()
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in results:
        row = out[r["tier"]]
        row["requests"] += 1
        row["rejected"] += r["status"] in (429, 503)
        row["errors"] += r["status"] not in (200, 429, 503)
        targets = tiers[r["tier"]].targets()
        delivery = Delivery(slo=targets, arrival_s=0.0, input_tokens=r["prompt_tokens"],
                            token_times_s=r["token_times_s"], completed=r["completed"])  # fmt: skip
        row["completed"] += r["completed"]
        row[f"status_{r['status']}"] += 1
        row["goodput_tokens"] += fn(delivery, params)
        row["met_slo"] += r["completed"] and request_goodput(delivery) > 0
    for row in out.values():
        row["attainment"] = row["met_slo"] / row["requests"]
    total = {k: sum(row[k] for row in out.values()) for k in ("requests", "goodput_tokens", "met_slo")}
    out["all"] = {**total, "attainment": total["met_slo"] / max(1, total["requests"])}
    return {k: dict(v) for k, v in out.items()}


def router_counters(url: str) -> dict[str, float]:
    """The router's own rejects, retries and upstream failures (its /metrics), summed per series name."""
    wanted = ("slofleet_router_rejects_total", "slofleet_router_retries_total",
              "slofleet_router_upstream_failures_total", "slofleet_router_downgraded_total")  # fmt: skip
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            key = line.rsplit(" ", 1)[0]
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_router(fleet: LocalFleet, policy_file: Path, routing: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "slo_core.cli", "--log-level", "WARNING", "router", "--port", str(port),
           "--endpoints", str(fleet.workdir / "endpoints.yaml"), "--policy-file", str(policy_file),
           "--routing-policy", routing]  # fmt: skip
    log = (fleet.workdir / "logs" / f"router-{routing}.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"router for {routing} did not become ready; see {log.name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default="go-routing,min-load,round-robin")
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--rate-rps", type=float, default=4.0)
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--max-prompt-tokens", type=int, default=1500)
    p.add_argument("--max-output-tokens", type=int, default=200)
    p.add_argument("--json", help="write the results here (and a .md table beside it)")
    args = p.parse_args()
    trace = load_trace(args.requests, args.rate_rps, args.max_prompt_tokens, args.max_output_tokens)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"live-fleet-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    policy_file = work / "policy.yaml"
    policy_file.write_text(POLICY)
    tiers = parse_policy(POLICY).spec.tiers_runtime()
    spec = FleetSpec(
        engines=[EngineGroup(count=2, profile="h100-llama3-8b-tp1", speedup=args.speedup),
                 EngineGroup(count=2, profile="a100-llama3-8b-tp1", speedup=args.speedup)],
        port=0, policy_file=policy_file, workdir=work,
    )  # fmt: skip
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"},
                               "load_1min_start": os.getloadavg()[0], "policies": {}}  # fmt: skip
    with LocalFleet(spec) as fleet:
        model = next(pod.model for pod in fleet.pods if pod.model)
        for routing in args.policies.split(","):
            proc, url = run_router(fleet, policy_file, routing)
            try:
                t0 = time.monotonic()
                raw = asyncio.run(replay(url, model, trace))
                results["policies"][routing] = {
                    "wall_s": time.monotonic() - t0,
                    "tiers": score(raw, tiers),
                    "router": router_counters(url),
                }
                print(routing, json.dumps(results["policies"][routing]["tiers"]["all"]), flush=True)
            finally:
                proc.terminate()
                proc.wait(20)
            time.sleep(3)  # let the pods drain before the next policy
    results["load_1min_end"] = os.getloadavg()[0]
    table = markdown(results)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        Path(args.json).with_suffix(".md").write_text(table + "\n")


def markdown(results: dict[str, Any]) -> str:
    c = results["config"]
    lines = [
        f"{c['requests']} requests of the Azure 2023 conversation trace at {c['rate_rps']} req/s through "
        f"2× H100 + 2× A100 Llama-3-8B engine-sims (speedup {c['speedup']}), fcfs in each engine; "
        f"1-min load {results['load_1min_start']:.1f} → {results['load_1min_end']:.1f} on "
        f"{os.cpu_count()} CPUs.",
        "",
        "| routing | tier | requests | completed | rejected | errors | SLO attainment | goodput tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for routing, res in results["policies"].items():
        for tier, row in res["tiers"].items():
            lines.append(
                f"| {routing} | {tier} | {row['requests']:.0f} | {row.get('completed', 0):.0f} | "
                f"{row.get('rejected', 0):.0f} | {row.get('errors', 0):.0f} | {row['attainment']:.3f} | "
                f"{row['goodput_tokens']:.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
