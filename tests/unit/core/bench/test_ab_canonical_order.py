"""bench/ab_canonical_order.py's incremental order gives canonical_queue's list at every call, whatever
arrives, leaves or moves between the queues in between (the A/B it times relies on it, and checks it
again in the run)."""

from __future__ import annotations

import random
from types import ModuleType

import pytest
from repo_paths import ROOT, load_script

from slo_core.policies.base import RequestView
from slo_core.policies.slide_batching import canonical_queue
from slo_core.slo import RequestKind, SLOTargets

SLO = SLOTargets(kind=RequestKind.BEST_EFFORT, deadline_s=60.0)


@pytest.fixture(scope="module")
def ab() -> ModuleType:
    load_script(ROOT / "bench" / "gmax_sweep.py", "gmax_sweep")  # the script imports it by name
    return load_script(ROOT / "bench" / "ab_canonical_order.py", "ab_canonical_order")


def _view(i: int, arrival_s: float) -> RequestView:
    return RequestView(
        request_id=f"p{i % 7}/c{i}", slo=SLO, arrival_s=arrival_s, prompt_tokens=8, max_tokens=8
    )


@pytest.mark.parametrize("seed", range(5))
def test_incremental_order_is_the_canonical_queue_at_every_call(ab: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    order = ab.IncrementalOrder()
    queued: list[RequestView] = []
    next_id = 0
    for step in range(300):
        # arrivals (many at once now and then: the full-sort path), ties in arrival included
        for _ in range(rng.choice((0, 1, 2, 3, 80 if step % 97 == 0 else 0))):
            queued.append(_view(next_id, float(rng.randrange(step + 1)) / 4))
            next_id += 1
        rng.shuffle(queued)  # the engine's order is not the canonical one
        for _ in range(rng.randrange(3)):
            if queued:
                queued.pop(rng.randrange(len(queued)))
        if step % 50 == 49 and queued:  # a request whose key moved: the order must notice
            i = rng.randrange(len(queued))
            old = queued[i]
            queued[i] = _view(int(old.request_id.rsplit("c", 1)[1]), old.arrival_s + rng.choice((-5.0, 5.0)))
        cut = rng.randrange(len(queued) + 1)
        running, waiting = queued[:cut], queued[cut:]
        want = canonical_queue(waiting, running)
        got = order.queue(waiting, running)
        assert got[1] == want[1]
        assert [r.request_id for r in got[0]] == [r.request_id for r in want[0]]
        assert all(a is b for a, b in zip(got[0], want[0], strict=True))
