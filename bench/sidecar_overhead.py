"""The sidecar's cost: TTFT p50 and token throughput through the sidecar vs straight to engine-sim.

Starts ``slofleet engine-sim`` and ``slofleet sidecar`` (proxy mode, FCFS, fallback predictor) as
separate processes on loopback, then drives both with the same closed-loop streaming load (C clients,
each sending requests back to back, ``ignore_eos`` so every request produces exactly ``max_tokens``)
in alternating rounds — direct, sidecar, direct, sidecar, ... — so slow drift of a shared machine hits
both sides alike. TTFT is measured by the client (request sent → first content chunk). Reported as
ratios from this one run, with the CPU time each server process spends per streamed token (on a
crowded machine the latency ratios mostly show CPU contention; the CPU cost does not):

    .venv/bin/python bench/sidecar_overhead.py [--rounds 3] [--clients 16] [--requests 48] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from slo_core import data

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompts(n: int) -> list[str]:
    with gzip.open(data.path("sharegpt_first_turn_5k.jsonl.gz"), "rt") as f:
        rows = [json.loads(line)["prompt"] for _, line in zip(range(n), f, strict=False)]
    return [p[:2000] for p in rows]


def _slofleet() -> str:
    found = shutil.which("slofleet", path=str(Path(sys.executable).parent)) or shutil.which("slofleet")
    if found is None:
        raise SystemExit("the slofleet command is not installed (pip install -e .)")
    return found


async def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < end:
            try:
                if (await http.get(url, timeout=1.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"{url} did not become ready")


async def _one(
    http: httpx.AsyncClient, base: str, model: str, prompt: str, max_tokens: int
) -> tuple[float, int]:
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with http.stream("POST", base + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    assert ttft is not None and tokens == max_tokens, (ttft, tokens)
    return ttft, tokens


async def _round(
    base: str, model: str, prompts: list[str], clients: int, max_tokens: int
) -> dict[str, float]:
    queue = list(prompts)
    ttfts: list[float] = []
    total = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal total
        while queue:
            ttft, n = await _one(http, base, model, queue.pop(), max_tokens)
            ttfts.append(ttft)
            total += n

    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {"ttft_p50_s": statistics.median(ttfts), "tokens_per_s": total / wall, "wall_s": wall}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _bench(args: argparse.Namespace, engine: str, sidecar: str, pids: dict[str, int]) -> dict[str, Any]:
    await _wait_ready(engine + "/health")
    await _wait_ready(sidecar + "/ready")
    async with httpx.AsyncClient() as http:
        model = (await http.get(engine + "/v1/models")).json()["data"][0]["id"]
    prompts = _prompts(args.requests)
    await _round(engine, model, prompts[:8], 4, 8)  # warm both paths (connections, caches)
    await _round(sidecar, model, prompts[:8], 4, 8)
    rounds: dict[str, list[dict[str, float]]] = {"direct": [], "sidecar": []}
    for _ in range(args.rounds):
        for name, base in (("direct", engine), ("sidecar", sidecar)):
            cpu0 = {k: _cpu_s(pid) for k, pid in pids.items()}
            r = await _round(base, model, prompts, args.clients, args.max_tokens)
            tokens = len(prompts) * args.max_tokens
            for k, pid in pids.items():  # CPU per streamed token: a cost the machine's load does not blur
                r[f"{k}_cpu_us_per_token"] = 1e6 * (_cpu_s(pid) - cpu0[k]) / tokens
            rounds[name].append(r)
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "wall_s"}
        for name, rs in rounds.items()
    }
    return {
        "engine": "engine-sim (default H100 / Llama-3-8B-like profile)",
        "speedup": args.speedup,
        "clients": args.clients,
        "requests_per_round": args.requests,
        "max_tokens": args.max_tokens,
        "rounds": rounds,
        "median": med,
        "ttft_p50_added_ms": 1000 * (med["sidecar"]["ttft_p50_s"] - med["direct"]["ttft_p50_s"]),
        "ttft_p50_ratio": med["sidecar"]["ttft_p50_s"] / med["direct"]["ttft_p50_s"],
        "throughput_ratio": med["sidecar"]["tokens_per_s"] / med["direct"]["tokens_per_s"],
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }


def _report(res: dict[str, Any]) -> str:
    d, s = res["median"]["direct"], res["median"]["sidecar"]
    head = (
        f"# {res['cpus']} CPUs, 1-min load average {res['load_avg_1m']:.2f}; engine-sim speedup "
        f"{res['speedup']}, {res['clients']} streaming clients, {res['requests_per_round']} requests x "
        f"{res['max_tokens']} tokens per round, median of {len(res['rounds']['direct'])} alternating rounds"
    )
    ttft = (
        f"TTFT p50      direct {1000 * d['ttft_p50_s']:8.1f} ms   sidecar {1000 * s['ttft_p50_s']:8.1f} ms   "
        f"added {res['ttft_p50_added_ms']:+.1f} ms   ratio {res['ttft_p50_ratio']:.3f}"
    )
    tput = (
        f"throughput    direct {d['tokens_per_s']:8.0f} tok/s sidecar {s['tokens_per_s']:8.0f} tok/s   "
        f"ratio {res['throughput_ratio']:.3f}"
    )
    cpu = (
        f"CPU/token     engine-sim {s['engine_cpu_us_per_token']:6.0f} us   "
        f"sidecar {s['sidecar_cpu_us_per_token']:6.0f} us   (per streamed token, rounds through the sidecar)"
    )
    return "\n".join([head, ttft, tput, cpu])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=48, help="requests per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speedup", type=float, default=1.0, help="engine-sim speed-up factor")
    parser.add_argument("--json", type=Path, help="write the full result here (and a .txt beside it)")
    args = parser.parse_args()
    exe = _slofleet()
    e_port, s_port = _free_port(), _free_port()
    engine, sidecar = f"http://127.0.0.1:{e_port}", f"http://127.0.0.1:{s_port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [exe, "--log-level", "WARNING", "engine-sim", "--host", "127.0.0.1", "--port", str(e_port),
             "--speedup", str(args.speedup)], env=env,
        ),
        subprocess.Popen(
            [exe, "--log-level", "WARNING", "sidecar", "--host", "127.0.0.1", "--port", str(s_port),
             "--engine-url", engine, "--predictor", "fallback", "--max-running", "256"], env=env,
        ),
    ]  # fmt: skip
    try:
        res = asyncio.run(_bench(args, engine, sidecar, {"engine": procs[0].pid, "sidecar": procs[1].pid}))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
    text = _report(res)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
        args.json.with_suffix(".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
