"""What engine mode's report costs: building a step's snapshot, encoding it, one ``Analyzer.Report`` round
trip to an in-process sidecar (bounds back), per report and per live request.

The step pays only the snapshot (plain rows, at most once per report interval); encoding and the gRPC
call happen on the plugin's background thread; the sidecar pays the handler (estimator, state). Run:

    .venv/bin/python bench/engine_report_cost.py [--requests 32,256] [--reports 200] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from slo_core.slo import PriorityClass, RequestKind, SLOTargets, SLOTier
from slo_core.wire.tags import EngineTags
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.estimators import FallbackEstimator
from slo_sidecar.runtime import running_sidecar
from slo_sidecar.service import Sidecar
from slo_vllm_plugin.analyzer_client import grpc_send
from slo_vllm_plugin.report import EngineSnapshot, RequestRow, to_report


def _rows(n: int, step: int) -> tuple[RequestRow, ...]:
    tags = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), tenant="t", tier="chat")
    return tuple(
        RequestRow(f"req-{i}", "decode", 200, step + i % 50, 1024, 1.7e9, tags, 1.7e9 + 0.2) for i in range(n)
    )


async def _measure(n: int, reports: int) -> dict[str, float]:
    tier = SLOTier("chat", RequestKind.LATENCY, PriorityClass("high", 1.0), ttft_s=1.0, tbt_s=0.1)
    sc = Sidecar(
        knobs=SidecarKnobs(mode="engine"),
        config=PolicyConfig(tiers={"chat": tier}, default_tier="chat"),
        engine_url="http://127.0.0.1:9",
        estimator=FallbackEstimator(),
    )
    async with running_sidecar(sc, grpc_port=0) as run:
        send = grpc_send(run.grpc_target)
        build, encode, call = [], [], []
        loop = asyncio.get_running_loop()
        for step in range(reports):
            t0 = time.perf_counter()
            snap = EngineSnapshot(time.time(), step, 0, n, 0.5, 1 << 20, _rows(n, step))
            t1 = time.perf_counter()
            msg = to_report(snap, [])
            t2 = time.perf_counter()
            await loop.run_in_executor(None, send, msg)  # the plugin's thread; the sidecar on this loop
            t3 = time.perf_counter()
            build.append(t1 - t0)
            encode.append(t2 - t1)
            call.append(t3 - t2)
    med = statistics.median
    return {"requests": n, "snapshot_us": 1e6 * med(build), "encode_us": 1e6 * med(encode),
            "report_rtt_us": 1e6 * med(call)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", default="32,256")
    p.add_argument("--reports", type=int, default=200)
    p.add_argument("--md", type=Path)
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    rows = [asyncio.run(_measure(int(n), args.reports)) for n in args.requests.split(",")]
    out = [
        f"{os.cpu_count()} CPUs, 1-min load {load0:.2f} before / {os.getloadavg()[0]:.2f} after; "
        f"median of {args.reports} reports (sidecar in process, loopback gRPC)",
        "",
        "| live requests | step: snapshot us | thread: encode us | thread: Report round trip us "
        "| step us per request |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['requests']} | {r['snapshot_us']:.0f} | {r['encode_us']:.0f} | {r['report_rtt_us']:.0f} "
            f"| {r['snapshot_us'] / r['requests']:.2f} |"
        )
    text = "\n".join(out)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
