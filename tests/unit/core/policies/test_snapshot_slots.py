"""SnapshotSlots holds exactly the snapshots of its last sync, each slot with its snapshot's values,
whatever joined, left, or got a new snapshot in between; it recomputes a value only for a request
that joined or whose new snapshot differs in what the values are computed from."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from slo_core.policies.base import RequestView
from slo_core.policies.snapshot_slots import SnapshotSlots
from slo_core.slo import RequestKind, SLOTargets

SLO = SLOTargets(RequestKind.DEADLINE, deadline_s=8.0)


def _values(r: RequestView) -> tuple[float, ...]:
    return (float(r.prompt_tokens), float(r.computed_tokens) * 0.5)


def _same(old: RequestView, new: RequestView) -> bool:
    return old.prompt_tokens == new.prompt_tokens and old.computed_tokens == new.computed_tokens


@given(seed=st.integers(0, 10_000), n=st.integers(0, 120))
@settings(max_examples=150, deadline=None)
def test_the_slots_follow_the_queue(seed: int, n: int) -> None:
    rng = random.Random(seed)
    computed: list[str] = []

    def values(r: RequestView) -> tuple[float, ...]:
        computed.append(r.request_id)
        return _values(r)

    store = SnapshotSlots(("prompt", "half_computed"), values, _same)
    fresh = 0

    def new() -> RequestView:
        nonlocal fresh
        fresh += 1
        return RequestView(f"r{fresh}", SLO, 0.0, rng.randint(1, 900), 16, computed_tokens=rng.randint(0, 9))

    def check(slots: list[int]) -> None:
        assert store.size == len(queue) == len(set(slots))
        for r, s in zip(queue, slots, strict=True):
            assert store.view(s) is r
            assert (store.col["prompt"][s], store.col["half_computed"][s]) == _values(r)

    queue = [new() for _ in range(n)]
    for _ in range(8):
        rng.shuffle(queue)
        check(store.sync(queue).tolist())
        computed.clear()
        # the next queue: some leave, some join, some get a new snapshot (of the same values or not)
        expected: set[str] = set()
        for _ in range(min(len(queue), rng.randint(0, 6))):
            queue.pop(rng.randrange(len(queue)))
        for i in rng.sample(range(len(queue)), k=min(len(queue), 5)):
            r = queue[i]
            if rng.random() < 0.5:
                queue[i] = replace(r, max_tokens=r.max_tokens + 1)  # the values do not move
            else:
                queue[i] = replace(r, computed_tokens=r.computed_tokens + 1)
                expected.add(r.request_id)
        joined = [new() for _ in range(rng.randint(0, 4))]
        queue += joined
        expected |= {r.request_id for r in joined}
        check(store.sync(queue).tolist())
        assert sorted(computed) == sorted(expected)


def test_reset_forgets_every_request() -> None:
    store = SnapshotSlots(("prompt", "half_computed"), _values, _same)
    r = RequestView("a", SLO, 0.0, 10, 16)
    store.sync([r])
    store.reset()
    assert store.size == 0 and store.slot == {}
    assert store.sync([r]).tolist() == [0] and store.view(0) is r
