"""The long fuzz run of issue 17: >= 10,000 hostile and mutated requests at a running local fleet's router.

Starts ``slofleet up``'s processes (engine-sim, a sidecar, the router; slo_lab.localfleet) and sends the
hand-written hostile cases of :mod:`slo_lab.fuzzcases` in rotation with seeded mutations of a valid chat
body, ``--concurrency`` at a time. Counts answers by status class, answers >= 400 that are not OpenAI
error objects, connections dropped without an answer, and samples the router's RSS (``/proc``) as it
goes; a valid request must still succeed at the end. Writes a JSON and a Markdown table:

    nice .venv/bin/python bench/front_door_fuzz.py [--requests 10000] [--concurrency 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from slo_lab.fuzzcases import chunks, hostile_cases, is_openai_error, mutation, valid_body
from slo_lab.localfleet.launcher import LocalFleet
from slo_lab.localfleet.spec import EngineGroup, FleetSpec

ROOT = Path(__file__).resolve().parents[1]


async def _achunks(total: int) -> AsyncIterator[bytes]:
    for piece in chunks(total):
        yield piece


def _summary(kwargs: dict[str, Any]) -> str:
    """What was sent, short enough for a result file (a mutation's JSON body, else the body's size)."""
    if "json" in kwargs:
        return json.dumps(kwargs["json"])[:200]
    content = kwargs.get("content")
    return f"<{len(content)} bytes>" if isinstance(content, bytes) else "<streamed body>"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def run(args: argparse.Namespace, url: str, model: str, router_pid: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    cases = hostile_cases(model, huge=True)
    statuses: Counter[str] = Counter()
    by_case: Counter[str] = Counter()
    five_xx: Counter[str] = Counter()
    not_openai: list[str] = []
    five_xx_examples: list[str] = []
    dropped: list[str] = []
    rss: list[tuple[int, float]] = [(0, rss_mb(router_pid))]
    sent = 0
    lock = asyncio.Lock()

    def next_request(i: int) -> tuple[str, dict[str, Any]]:
        if i % args.hostile_every == 0:
            name, kwargs = cases[(i // args.hostile_every) % len(cases)]
            if name.startswith("64 MB") and (i // args.hostile_every) // len(cases) >= args.huge_rounds:
                name, kwargs = cases[0]
            kwargs = dict(kwargs)
            if name == "64 MB body, chunked":  # an async, fresh stream for the async client
                kwargs["content"] = _achunks(64 << 20)
            return name, kwargs
        body, headers = mutation(rng, model)
        return "mutation", {"json": body, "headers": headers}

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while True:
            async with lock:
                if sent >= args.requests:
                    return
                i = sent
                sent += 1
                name, kwargs = next_request(i)
            headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
            what = f"#{i} {name} {_summary(kwargs)} {headers}"
            t0 = time.monotonic()
            try:
                resp = await http.post(url + "/v1/chat/completions", headers=headers, **kwargs)
            except httpx.TransportError as exc:
                dropped.append(f"{exc!r} after {time.monotonic() - t0:.1f} s: {what}"[:400])
                continue
            statuses[f"{resp.status_code // 100}xx"] += 1
            by_case[f"{name} -> {resp.status_code}"] += 1
            if resp.status_code >= 500:
                try:
                    code = resp.json()["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = resp.text[:60]
                five_xx[f"{resp.status_code} {code}"] += 1
                took = f"after {time.monotonic() - t0:.1f} s"
                five_xx_examples.append(f"{resp.text[:200]} {took}: {what}"[:500])
            if resp.status_code >= 400:
                try:
                    ok = is_openai_error(resp.json())
                except ValueError:
                    ok = False
                if not ok:
                    not_openai.append(f"{name}: {resp.status_code} {resp.text[:120]}")
            if i % 500 == 0:
                rss.append((i, rss_mb(router_pid)))

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=args.concurrency)) as http:
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))
        final = await http.post(url + "/v1/chat/completions", json=valid_body(model))
    rss.append((args.requests, rss_mb(router_pid)))
    return {
        "requests": args.requests,
        "seconds": round(time.monotonic() - started, 1),
        "statuses": dict(sorted(statuses.items())),
        "five_xx": statuses.get("5xx", 0),
        "five_xx_by_code": dict(five_xx),
        "five_xx_examples": five_xx_examples[:10],
        "dropped_connections": len(dropped),
        "dropped_examples": dropped[:10],
        "errors_not_openai_shaped": len(not_openai),
        "not_openai_examples": not_openai[:10],
        "valid_request_after": final.status_code,
        "router_rss_mb": [(i, round(m, 1)) for i, m in rss],
        "by_case": dict(sorted(by_case.items())),
        "load_average": os.getloadavg(),
    }


def markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    rss = [m for _, m in result["router_rss_mb"]]
    lines = [
        "# Front-door fuzz run (issue 17)",
        "",
        f"`nice .venv/bin/python bench/front_door_fuzz.py --requests {args.requests} "
        f"--concurrency {args.concurrency} --seed {args.seed}` against `slofleet up --engines 1` "
        "(engine-sim, one sidecar, the router).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| requests | {result['requests']} ({result['seconds']} s) |",
        f"| answers by status class | {result['statuses']} |",
        f"| 5xx answers (by status and error code) | {result['five_xx']} {result['five_xx_by_code']} |",
        f"| connections dropped without an answer | {result['dropped_connections']} |",
        f"| error answers that are not OpenAI error objects | {result['errors_not_openai_shaped']} |",
        f"| valid request afterwards | {result['valid_request_after']} |",
        f"| router RSS start / max / end (MB) | {rss[0]} / {max(rss)} / {rss[-1]} |",
        f"| load average (1, 5, 15 min) | {', '.join(f'{x:.1f}' for x in result['load_average'])} |",
        "",
        "Answers per case (hand-written hostile cases in rotation, the rest seeded mutations):",
        "",
        "| case -> status | count |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in result["by_case"].items()),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hostile-every", type=int, default=5, help="every Nth request is a hand-written case"
    )
    parser.add_argument("--huge-rounds", type=int, default=3, help="rounds that include the 64 MB bodies")
    parser.add_argument("--workdir", type=Path, help="keep the fleet's logs here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "front_door_fuzz")
    args = parser.parse_args()
    spec = FleetSpec(engines=[EngineGroup(count=1, speedup=200)], port=0, workdir=args.workdir)
    with LocalFleet(spec) as fleet:
        router = next(c for c in fleet.children if c.name == "router")
        assert router.proc is not None
        result = asyncio.run(run(args, fleet.router_url, fleet.served_model(), router.proc.pid))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result, args))
    print(markdown(result, args))


if __name__ == "__main__":
    main()
