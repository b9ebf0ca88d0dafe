"""Python's cyclic garbage collector kept to young collections while a simulation runs.

A fleet simulation holds hundreds of thousands of container objects that live for the whole run (each
request, its token times, its snapshots), and the collector's full passes scan all of them, over and
over as the heap grows, for nothing a run needs: reference counting frees everything else the moment
it is dropped, so the collector changes no result, only when unreachable cycles are freed. At ToT x4
overload (120 s, ``bench/results/sim_speed/run_phases_collector_tot_r4_overload_120s.md``), with
CPython's thresholds the collector took 21 % of Autellix's CPU time, 14 % of SlideBatching's, 10 % of
Tempo's; paused as below, the same runs (identical records) took 25 %, 18 % and 11 % less CPU.

While :func:`young_collections_only` is entered, the collector still runs its youngest generation
(every :data:`YOUNG_THRESHOLD` net container allocations; short-lived cycles are freed as before) but
never the older two; the thresholds in force before are restored when the last entered context exits
(the simulator may run in several threads of one process). A collector turned off by the caller
(``gc.disable()`` or a first threshold of 0) stays off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000  # net container allocations between young collections (CPython's default: 700)
_NEVER = 1_000_000_000  # an older generation's threshold that a run never reaches


class _Pauses:
    """How many callers are inside :func:`young_collections_only`, and the thresholds to restore."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: tuple[int, int, int] | None = None


_pauses = _Pauses()


@contextmanager
def young_collections_only() -> Iterator[None]:
    """Run the body with the collector's older generations left alone (see the module docstring)."""
    p = _pauses
    with p.lock:
        if p.depth == 0:
            before = gc.get_threshold()
            if before[0] > 0:  # 0: automatic collection is off, and stays off
                p.saved = before
                gc.set_threshold(YOUNG_THRESHOLD, _NEVER, _NEVER)
        p.depth += 1
    try:
        yield
    finally:
        with p.lock:
            p.depth -= 1
            if p.depth == 0 and p.saved is not None:
                gc.set_threshold(*p.saved)
                p.saved = None
