"""What engine mode's report costs: building a step's snapshot, encoding it, one ``Analyzer.Report`` round
trip to an in-process sidecar (bounds back), per report and per live request; and what judging SLO
outcomes costs the step (every live request's :class:`slo_core.gain.SLOWatch` fed its new output count).

The step pays the snapshot (plain rows, at most once per report interval) and, every step, one watch
call per request that made tokens; encoding and the gRPC call happen on the plugin's background
thread; the sidecar pays the handler (estimator, outcome counters, gauges). ``--finished K``: each
report also carries K finished rows with their outcome and prompt. Run:

    .venv/bin/python bench/engine_report_cost.py [--requests 32,256] [--reports 200] [--finished 8] \\
        [--md OUT.md]
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
from slo_vllm_plugin.report import MET, MISSED, EngineSnapshot, Finished, RequestRow, judge, to_report, watch


def _rows(n: int, step: int) -> tuple[RequestRow, ...]:
    tags = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), tenant="t", tier="chat")
    return tuple(
        RequestRow(f"req-{i}", "decode", 200, step + i % 50, 1024, 1.7e9, tags, 1.7e9 + 0.2) for i in range(n)
    )


def _finished(step: int, k: int) -> list[Finished]:
    return [Finished(f"done-{step}-{j}", 40, "stop", "chat", MET if j % 3 else MISSED, 200) for j in range(k)]


class _Request:
    """What the plugin reads off a vLLM request per step (its output count)."""

    __slots__ = ("num_output_tokens",)

    def __init__(self) -> None:
        self.num_output_tokens = 0


def _watch_pass_s(n: int, steps: int) -> float:
    """Median time of one step's watch updates for ``n`` requests that each made a token, as the
    plugin's ``update_from_output`` does them (two dict lookups, the count, the watch)."""
    tags = EngineTags(SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.1), tenant="t", tier="chat")
    now = time.time()
    ids = [f"req-{i}" for i in range(n)]
    watches = {rid: watch(tags, now) for rid in ids}
    requests = {rid: _Request() for rid in ids}
    times = []
    for step in range(1, steps + 1):
        for req in requests.values():  # the engine's own work: not timed
            req.num_output_tokens = step
        t0 = time.perf_counter()
        t = time.time()
        for rid in ids:
            w = watches.get(rid)
            if w is not None and (req := requests.get(rid)) is not None:
                w.tokens(req.num_output_tokens, t)
        times.append(time.perf_counter() - t0)
    assert judge(watches[ids[0]], "stop") in (MET, MISSED)
    return statistics.median(times)


async def _measure(n: int, reports: int, finished: int) -> dict[str, float]:
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
            msg = to_report(snap, _finished(step, finished))
            t2 = time.perf_counter()
            await loop.run_in_executor(None, send, msg)  # the plugin's thread; the sidecar on this loop
            t3 = time.perf_counter()
            build.append(t1 - t0)
            encode.append(t2 - t1)
            call.append(t3 - t2)
    med = statistics.median
    return {"requests": n, "snapshot_us": 1e6 * med(build), "encode_us": 1e6 * med(encode),
            "report_rtt_us": 1e6 * med(call), "watch_us": 1e6 * _watch_pass_s(n, reports)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", default="32,256")
    p.add_argument("--reports", type=int, default=200)
    p.add_argument("--finished", type=int, default=8, help="finished rows per report")
    p.add_argument("--md", type=Path)
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    rows = [asyncio.run(_measure(int(n), args.reports, args.finished)) for n in args.requests.split(",")]
    out = [
        f"{os.cpu_count()} CPUs, 1-min load {load0:.2f} before / {os.getloadavg()[0]:.2f} after; "
        f"median of {args.reports} reports (sidecar in process, loopback gRPC), "
        f"{args.finished} finished rows per report",
        "",
        "| live requests | step: snapshot us | thread: encode us | thread: Report round trip us "
        "| step us per request | every step: SLO watches us | watch us per request |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['requests']} | {r['snapshot_us']:.0f} | {r['encode_us']:.0f} | {r['report_rtt_us']:.0f} "
            f"| {r['snapshot_us'] / r['requests']:.2f} | {r['watch_us']:.1f} "
            f"| {r['watch_us'] / r['requests']:.3f} |"
        )
    text = "\n".join(out)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
