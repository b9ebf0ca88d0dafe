"""In-process A/B of SlideBatching's canonical order: the plain sort against an incremental one.

    PYTHONPATH=core:lab .venv/bin/python bench/ab_canonical_order.py --duration 90 \\
        --out bench/results/sim_speed/ab_canonical_order.md

One gmax_sweep task (SlideBatching, ToT x4 at the overload point by default) in which every call of
:func:`slo_core.policies.slide_batching.canonical_queue` runs both implementations on the same
queues, in alternating order, each timed on the process clock, and asserts that they return the same
list. Timing both in one process on the same inputs is what makes the comparison readable on this
host: the same run's CPU seconds moved by 1.45x between two invocations (101.5 and 146.9 s, the
same digest), far more than the difference measured here.

The incremental order keeps the last call's order and places only the new requests (the keys,
arrival then id, do not change while a request is queued); it is exact by construction (checked
here at every call). It was tried because the sort looked like a quarter of a deep-queue run in a
sampled profile; in place it is slower than the sort it replaces. It makes four passes over the
request snapshots (filter, look up, key, ids) where the sort makes one for its keys, and in a run a
pass costs what it touches, not what it computes: the same sort on the same queue costs ~2.5x as
much per request in the run (snapshots cold) as repeated once the run has ended (warm), which the
script also measures.
"""

from __future__ import annotations

import argparse
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import islice
from operator import attrgetter, lt
from pathlib import Path
from typing import Any

import gmax_sweep  # bench/ is the script's own folder, first on sys.path

from slo_core.bench.runner import run_one_timed
from slo_core.policies import slide_batching as sb
from slo_core.policies.base import RequestView, request_id_of

Queue = tuple[list[RequestView], list[bool]]
_ARRIVAL_ID = attrgetter("arrival_s", "request_id")  # the canonical order's key


class IncrementalOrder:
    """``canonical_queue`` kept from one call to the next for one policy instance."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def queue(self, waiting: Sequence[RequestView], running: Sequence[RequestView]) -> Queue:
        items = [*running, *waiting]
        by_id = dict(zip(map(request_id_of, items), items, strict=True))
        merged = self._merged(by_id) if len(by_id) == len(items) else None
        queue = merged if merged is not None else sorted(items, key=_ARRIVAL_ID)
        self.ids = list(map(request_id_of, queue))
        if not running:
            return queue, [True] * len(queue)
        running_ids = set(map(request_id_of, running))
        return queue, [rid not in running_ids for rid in self.ids]

    def _merged(self, by_id: dict[str, RequestView]) -> list[RequestView] | None:
        kept_ids = list(filter(by_id.__contains__, self.ids))
        kept = list(map(by_id.__getitem__, kept_ids))
        keys = list(map(_ARRIVAL_ID, kept))
        if not all(map(lt, keys, islice(keys, 1, None))):  # a key moved: sort it all
            return None
        n_new = len(by_id) - len(kept)
        if n_new > 64 and n_new * 4 > len(kept):
            return None
        lo = 0
        for r in sorted(map(by_id.__getitem__, by_id.keys() - set(kept_ids)), key=_ARRIVAL_ID):
            k = _ARRIVAL_ID(r)
            lo = bisect_right(keys, k, lo)
            keys.insert(lo, k)
            kept.insert(lo, r)
            lo += 1
        return kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="tot", choices=sorted(gmax_sweep.FAMILIES))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rps", type=float, default=26.0, help="total requests/s")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    plain = sb.canonical_queue
    orders: dict[int, IncrementalOrder] = {}
    current: list[int] = [0]
    spent = {"plain": 0.0, "incremental": 0.0}
    calls = [0]
    items = [0]
    sample: list[tuple[Sequence[RequestView], Sequence[RequestView]]] = []
    clock = time.process_time

    def timed(name: str, fn: Callable[[], Queue]) -> Queue:
        t = clock()
        out = fn()
        spent[name] += clock() - t
        return out

    def both(waiting: Sequence[RequestView], running: Sequence[RequestView]) -> Queue:
        order = orders.setdefault(current[0], IncrementalOrder())
        calls[0] += 1
        items[0] += len(waiting) + len(running)
        if calls[0] == 10_000:  # one real queue, kept to time the sort again with its snapshots warm
            sample.append((list(waiting), list(running)))
        run_plain = lambda: plain(waiting, running)  # noqa: E731
        run_incr = lambda: order.queue(waiting, running)  # noqa: E731
        if calls[0] % 2:
            a, b = timed("plain", run_plain), timed("incremental", run_incr)
        else:
            b, a = timed("incremental", run_incr), timed("plain", run_plain)
        if a[1] != b[1] or len(a[0]) != len(b[0]) or any(x is not y for x, y in zip(a[0], b[0], strict=True)):
            sys.exit(f"the orders differ at call {calls[0]}")
        return a

    original_plan = sb.SlideBatching.plan

    def plan(self: sb.SlideBatching, *a: Any, **k: Any) -> sb.SlidePlan:
        current[0] = id(self)  # one incremental order per engine's policy
        return original_plan(self, *a, **k)

    sb.canonical_queue = both  # type: ignore[assignment]
    sb.SlideBatching.plan = plan  # type: ignore[method-assign]
    task = gmax_sweep.Task(
        args.family, args.replicas, 0, args.rps, "slide-batching", ("token",), args.duration, "round-robin"
    )
    _, cpu = run_one_timed(task.config(), ("slide-batching", "round-robin", args.rps))
    n = max(1, calls[0])
    warm = ""
    if sample:
        w, r = sample[0]
        plain(w, r)
        t = clock()
        for _ in range(200):
            plain(w, r)
        warm_us = (clock() - t) / 200 * 1e6
        warm = (
            f"The plain sort again on call 10,000's queue ({len(w) + len(r)} requests), 200 times in a row "
            f"once the run had ended (its snapshots warm in cache): {warm_us:.0f} us a call, "
            f"{warm_us / (len(w) + len(r)) * 1e3:.0f} ns a request.\n"
        )
    text = (
        f"SlideBatching, {args.family} x{args.replicas}, {args.rps:g} req/s, {args.duration:g} s window, "
        f"seed 0: {calls[0]} calls, {items[0] / n:.0f} requests a call on average, "
        f"{cpu:.1f} CPU s for the whole run (both implementations included)\n\n"
        "| implementation | CPU s in all | us a call | ns a request |\n|---|---:|---:|---:|\n"
        + "".join(
            f"| {name} | {s:.2f} | {s / n * 1e6:.0f} | {s / max(1, items[0]) * 1e9:.0f} |\n"
            for name, s in spent.items()
        )
        + "\nSame list from both at every call (checked).\n\n"
        + warm
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
