"""Every process in the token path against the floor, in one run: CPU per streamed token, throughput, TTFT.

Starts on loopback one engine-sim and, in front of it, each hop a request can cross:

- ``direct``          client -> engine-sim
- ``lean``            client -> lean byte relay (bench/lean_relay.py, the floor) -> engine-sim
- ``router``          client -> router -> engine-sim (a plain relay: no tags, no state stream)
- ``engine mode``     client -> router -> engine-sim, as deployed in engine mode: signed SLO tags, the
                      engine reporting to its own sidecar (analyzer, state stream to the router); the
                      sidecar is off the token path, its CPU is shown but is no relay hop
- ``sidecar``         client -> sidecar (proxy mode, FCFS) -> engine-sim
- ``router+sidecar``  client -> router -> sidecar -> engine-sim (proxy mode, stock vLLM)

and drives each path with the same closed-loop streaming load (C clients sending back to back,
``ignore_eos`` so every request yields exactly ``max_tokens``; the identical requests finish together,
so they arrive in waves of C), paths interleaved round by round so a shared machine's drift hits all
alike. Before each measured round its path gets one 1-token request per client, so every hop's
connection pool is warm. The CPU seconds of every process are read from /proc around each round, so
each path's table row shows what each hop costs per streamed token (with ``--max-tokens 1``: per
request); TTFT is measured by the client (request sent -> first content chunk), "mean streams" is the
concurrency the path actually held (Little's law). Ratios are against ``direct`` (throughput, TTFT)
and against the lean relay's own CPU per token (the floor):

    .venv/bin/python bench/path_overhead.py [--clients 16,64] [--rounds 3] [--requests 96] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("direct", "lean", "router", "engine mode", "sidecar", "router+sidecar")
TAG_KEY = "bench-tag-key-0123456789abcdef"
# one batch tier with a long deadline: nothing here is infeasible, every request is relayed
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
  routing: {name: round-robin}
"""
HOPS = {  # the processes each path crosses, client side first
    "direct": ("engine",),
    "lean": ("lean", "engine"),
    "router": ("router", "engine"),
    "engine mode": ("router_em", "engine_em"),
    "sidecar": ("sidecar", "engine"),
    "router+sidecar": ("router_px", "sidecar", "engine"),
}
ENGINE_OF = {"engine mode": "engine_em"}  # the engine process of a path (default: "engine")
ROUTER_OF = {"router": "router", "engine mode": "router_em", "router+sidecar": "router_px"}
SIDECAR_OF = {"engine mode": "sidecar_em", "sidecar": "sidecar", "router+sidecar": "sidecar"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slofleet() -> str:
    found = shutil.which("slofleet", path=str(Path(sys.executable).parent)) or shutil.which("slofleet")
    if found is None:
        raise SystemExit("the slofleet command is not installed (pip install -e .)")
    return found


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _wait_ready(urls: list[str], timeout_s: float = 90.0) -> None:
    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        for url in urls:
            while True:
                try:
                    async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > end:
                    raise SystemExit(f"{url} did not become ready")
                await asyncio.sleep(0.3)


async def _one(
    http: aiohttp.ClientSession, url: str, body: bytes, max_tokens: int
) -> tuple[float, float] | None:
    """One stream's TTFT and duration, or None if it failed. The token count is checked from the usage
    chunk."""
    t0 = time.perf_counter()
    ttft: float | None = None
    tail = b""
    async with http.post(url, data=body, headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            print(f"{url}: status {r.status}: {(await r.read())[:200]!r}", file=sys.stderr)
            return None
        async for chunk in r.content.iter_any():
            if ttft is None and (b'"text":"' in chunk or b'"text": "' in chunk):
                ttft = time.perf_counter() - t0
            tail = (tail + chunk)[-4096:]
    usage = [line for line in tail.split(b"\n") if b'"usage"' in line and line.startswith(b"data:")]
    got = json.loads(usage[-1][5:])["usage"]["completion_tokens"] if usage else None
    if ttft is None or got != max_tokens:
        print(f"{url}: incomplete stream (ttft {ttft}, completion_tokens {got})", file=sys.stderr)
        return None
    return ttft, time.perf_counter() - t0


def _body(model: str, max_tokens: int) -> bytes:
    return json.dumps({
        "model": model, "prompt": "Summarise the benefits of SLO-aware routing for LLM fleets. " * 6,
        "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip


def _summary(done: list[tuple[float, float]], failed: int, wall: float, max_tokens: int) -> dict[str, float]:
    ttfts = [t for t, _ in done]
    return {
        "ttft_p50_s": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "tokens_per_s": len(done) * max_tokens / wall,
        "streams": sum(d for _, d in done) / wall,  # mean concurrent streams (Little's law)
        "failed": failed,
    }


async def _round(base: str, model: str, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    """Closed loop: ``clients`` streams sent back to back."""
    body = _body(model, max_tokens)
    todo = iter(range(requests))
    done: list[tuple[float, float]] = []
    failed = 0

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal failed
        for _ in todo:
            got = await _one(http, base + "/v1/completions", body, max_tokens)
            if got is None:
                failed += 1
            else:
                done.append(got)

    conn = aiohttp.TCPConnector(limit=clients * 2)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return _summary(done, failed, wall, max_tokens)


async def _engine_ttft(engine_url: str) -> tuple[float, float]:
    """The engine's own TTFT histogram (sum s, count): what the engine took, from its arrival on."""
    async with aiohttp.ClientSession() as http, http.get(engine_url + "/metrics") as r:
        text = await r.text()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for kind in found:
            if line.startswith(f"vllm:time_to_first_token_seconds_{kind}"):
                found[kind] += float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


def _spawn(args: argparse.Namespace, work: Path) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    exe, py = _slofleet(), sys.executable
    names = ("engine", "lean", "router", "sidecar", "router_px", "engine_em", "sidecar_em", "router_em")
    port = {k: _free_port() for k in names}
    grpc_em = _free_port()
    url = {k: f"http://127.0.0.1:{p}" for k, p in port.items()}
    for name, target in (("router", "engine"), ("router_px", "sidecar")):
        (work / f"{name}.yaml").write_text(
            f"endpoints:\n  - id: {target}\n    url: {url[target]}\n    models: [{args.model}]\n"
        )
    (work / "router_em.yaml").write_text(
        f"endpoints:\n  - id: pod\n    url: {url['engine_em']}\n    models: [{args.model}]\n"
        f"    mode: engine\n    grpc: 127.0.0.1:{grpc_em}\n"
    )
    keys = work / "tag-keys"
    keys.write_text(TAG_KEY + "\n")
    (work / "policy.yaml").write_text(POLICY)
    quiet = [exe, "--log-level", "WARNING"]
    policy = str(work / "policy.yaml")
    cmds = {
        "engine": [*quiet, "engine-sim", "--host", "127.0.0.1", "--port", str(port["engine"]),
                   "--speedup", str(args.speedup), "--model", args.model],
        "lean": [py, str(ROOT / "bench" / "lean_relay.py"), "--port", str(port["lean"]),
                 "--upstream", url["engine"], *(["--uvloop"] if args.lean_uvloop else [])],
        "sidecar": [*quiet, "sidecar", "--host", "127.0.0.1", "--port", str(port["sidecar"]),
                    "--engine-url", url["engine"], "--predictor", "fallback", "--max-running", "256",
                    "--policy-file", policy],
        "router": [*quiet, "router", "--host", "127.0.0.1", "--port", str(port["router"]),
                   "--endpoints", str(work / "router.yaml"), "--policy-file", policy],
        "router_px": [*quiet, "router", "--host", "127.0.0.1", "--port", str(port["router_px"]),
                      "--endpoints", str(work / "router_px.yaml"), "--policy-file", policy],
        "engine_em": [*quiet, "engine-sim", "--host", "127.0.0.1", "--port", str(port["engine_em"]),
                      "--speedup", str(args.speedup), "--model", args.model,
                      "--analyzer", f"127.0.0.1:{grpc_em}", "--tag-key-file", str(keys)],
        "sidecar_em": [*quiet, "sidecar", "--host", "127.0.0.1", "--port", str(port["sidecar_em"]),
                       "--engine-url", url["engine_em"], "--predictor", "fallback", "--mode", "engine",
                       "--grpc-port", str(grpc_em), "--policy-file", policy],
        "router_em": [*quiet, "router", "--host", "127.0.0.1", "--port", str(port["router_em"]),
                      "--endpoints", str(work / "router_em.yaml"), "--policy-file", policy,
                      "--tag-key-file", str(keys)],
    }  # fmt: skip
    needed = {h for path in args.paths for h in HOPS[path]} | {
        SIDECAR_OF.get(p, "engine") for p in args.paths
    }
    cmds = {k: c for k, c in cmds.items() if k in needed}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = {k: (work / f"{k}.log").open("wb") for k in cmds}
    procs = {
        k: subprocess.Popen(c, env=env, stdout=logs[k], stderr=subprocess.STDOUT) for k, c in cmds.items()
    }
    bases = {
        "direct": url["engine"], "lean": url["lean"], "router": url["router"], "sidecar": url["sidecar"],
        "router+sidecar": url["router_px"], "engine mode": url["router_em"],
        "_engine": url["engine"], "_engine_em": url["engine_em"],
    }  # fmt: skip
    return procs, bases


async def _bench(
    args: argparse.Namespace, procs: dict[str, subprocess.Popen[bytes]], bases: dict[str, str]
) -> dict[str, Any]:
    ready = {"direct": "/health", "lean": "/health"}  # the rest: /ready (their upstream answers too)
    await _wait_ready([bases[p] + ready.get(p, "/ready") for p in args.paths])
    for path in args.paths:  # warm every hop (connections, caches)
        await _round(bases[path], args.model, 4, 8, 8)
    pids = {k: p.pid for k, p in procs.items()}
    results: dict[str, Any] = {}
    for clients in args.clients:
        rounds: dict[str, list[dict[str, float]]] = {p: [] for p in args.paths}
        for _ in range(args.rounds):
            for path in args.paths:
                engine_url = bases["_" + ENGINE_OF.get(path, "engine")]
                # every hop's upstream pool warm before its round: a path sat idle while the others ran,
                # long enough for the router's 2 s keep-alive to drop its connections while the lean
                # relay's 15 s kept its own; cold connects are not what a path costs under steady load
                await _round(bases[path], args.model, clients, clients, 1)
                ttft0 = await _engine_ttft(engine_url)
                cpu0 = {k: _cpu_s(pid) for k, pid in pids.items()}
                r = await _round(bases[path], args.model, clients, args.requests, args.max_tokens)
                tokens = max(1, (args.requests - int(r["failed"])) * args.max_tokens)
                for k, pid in pids.items():
                    r[f"{k}_cpu_us_per_token"] = 1e6 * (_cpu_s(pid) - cpu0[k]) / tokens
                ttft1 = await _engine_ttft(engine_url)
                r["engine_ttft_mean_s"] = (ttft1[0] - ttft0[0]) / max(1.0, ttft1[1] - ttft0[1])
                rounds[path].append(r)
        med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in rounds.items()}
        for p, rs in rounds.items():
            med[p]["failed"] = sum(r["failed"] for r in rs)
        results[str(clients)] = {"rounds": rounds, "median": med}
    return results


def _table(res: dict[str, Any]) -> str:
    m = res["machine"]
    out = [
        f"{m['cpus']} CPUs; 1-min load average {m['load_1min_before']:.2f} before, "
        f"{m['load_1min_after']:.2f} after; engine-sim speedup {res['config']['speedup']}; "
        f"{res['config']['requests']} requests x {res['config']['max_tokens']} tokens per round, "
        f"median of {res['config']['rounds']} interleaved rounds; lean relay on "
        f"{'uvloop' if res['config'].get('lean_uvloop') else 'asyncio'}'s event loop; closed loop: C "
        "clients back to back (identical requests, so they arrive in waves of C)",
        "",
    ]
    for clients, r in res["by_clients"].items():
        med = r["median"]
        d, floor = med["direct"], med["lean"]["lean_cpu_us_per_token"]
        out += [
            f"### {clients} concurrent streams (lean relay floor: {floor:.0f} us CPU per token)",
            "",
            "| path | mean streams | tok/s ratio | TTFT p50 ms | TTFT added ms | over lean ms "
            "| TTFT mean: engine / hops ms | engine us/tok | lean us/tok | router us/tok | sidecar us/tok "
            "| relay hops / floor | failed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for path in res["config"]["paths"]:
            p = med[path]
            router = p[f"{ROUTER_OF[path]}_cpu_us_per_token"] if path in ROUTER_OF else 0.0
            sidecar = p[f"{SIDECAR_OF[path]}_cpu_us_per_token"] if path in SIDECAR_OF else 0.0
            engine = p[f"{ENGINE_OF.get(path, 'engine')}_cpu_us_per_token"]
            hops = [h for h in HOPS[path] if not h.startswith("engine")]
            hop_cpu = sum(p[f"{h}_cpu_us_per_token"] for h in hops)
            out.append(
                f"| {path} | {p['streams']:.1f} | {p['tokens_per_s'] / d['tokens_per_s']:.3f} | "
                f"{1000 * p['ttft_p50_s']:.1f} | "
                f"{1000 * (p['ttft_p50_s'] - d['ttft_p50_s']):+.1f} | "
                f"{1000 * (p['ttft_p50_s'] - med['lean']['ttft_p50_s']):+.1f} | "
                f"{1000 * p['engine_ttft_mean_s']:.1f} / "
                f"{1000 * (p['ttft_mean_s'] - p['engine_ttft_mean_s']):.1f} | "
                f"{engine:.0f} | "
                f"{p['lean_cpu_us_per_token'] if path == 'lean' else 0:.0f} | "
                f"{router:.0f} | {sidecar:.0f} | "
                f"{hop_cpu / floor if hops else 0:.2f} | {p['failed']} |"
            )
        out += [""]
        out += (
            []
            if "engine mode" not in res["config"]["paths"]
            else [
                "engine mode: the sidecar column is its analyzer and state work (engine reports, bounds, the "
                "router's state stream), off the token path; the relay hop is the router alone.",
            ]
        )
        out.append("")
    return "\n".join(out)


Procs = dict[str, "subprocess.Popen[bytes]"]


def run_and_report(
    args: argparse.Namespace,
    key: str,
    spawn: Callable[[Path], tuple[Procs, dict[str, str]]],
    bench: Callable[[Procs, dict[str, str]], Coroutine[Any, Any, Any]],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """Start the processes in a scratch folder, run the bench, stop them (their logs shown if it fails),
    then print the table and, with ``--md``, write it and the full result (JSON) beside it; the
    machine's load is recorded before and after."""
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        procs, urls = spawn(Path(tmp))
        try:
            measured: Any = asyncio.run(bench(procs, urls))
        except BaseException:
            for k in procs:
                print(f"--- {k} log:\n" + (Path(tmp) / f"{k}.log").read_text()[-2000:], file=sys.stderr)
            raise
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(20)
    res = {
        "machine": {"cpus": os.cpu_count(), "load_1min_before": load0, "load_1min_after": os.getloadavg()[0]},
        "config": {k: v for k, v in vars(args).items() if k != "md"},
        key: measured,
    }
    text = table(res)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
        args.md.with_suffix(".json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="16,64", help="comma-separated concurrent streams per load level")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=96, help="requests per round")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--speedup", type=float, default=1.0, help="engine-sim speed-up factor")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument(
        "--lean-uvloop",
        action="store_true",
        help="run the lean relay on uvloop (the router's and sidecar's loop) instead of asyncio's",
    )
    p.add_argument(
        "--paths", default=",".join(PATHS), help="comma-separated paths to run (direct and lean always)"
    )
    p.add_argument("--md", type=Path, help="write the table here (and the full result as .json beside it)")
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(args.paths) - set(PATHS)
    if unknown or not {"direct", "lean"} <= set(args.paths):
        p.error(f"--paths: choose from {', '.join(PATHS)}; direct and lean (the references) are needed")
    return run_and_report(
        args,
        "by_clients",
        lambda work: _spawn(args, work),
        lambda procs, urls: _bench(args, procs, urls),
        _table,
    )


if __name__ == "__main__":
    sys.exit(main())
