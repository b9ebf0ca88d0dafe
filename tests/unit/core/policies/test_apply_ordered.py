"""apply.ordered: its fast path (the order already in place) gives what the general split gives."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from slo_core.policies.apply import ordered


@dataclass(frozen=True)
class Item:
    request_id: str


def reference(items: list[Item], order: list[str]) -> tuple[list[Item], list[Item]]:
    by_id = {r.request_id: r for r in items}
    listed: list[Item] = []
    for rid in order:
        if rid in by_id and by_id[rid] not in listed:
            listed.append(by_id[rid])
    return listed, [r for r in items if r not in listed]


@given(
    n=st.sampled_from([0, 1, 3, 12, 40, 300]),
    prefix=st.booleans(),
    order=st.lists(st.sampled_from([f"r{i}" for i in range(15)] + ["r299", "r39", "r301"]), max_size=14),
    seed=st.integers(0, 100),
)
def test_ordered_equals_the_general_split(n: int, prefix: bool, order: list[str], seed: int) -> None:
    """Whole orders, heads of the current order, and short orders of a long queue (the scan for a few
    ids), with duplicates and unknown ids."""
    items = [Item(f"r{i}") for i in range(n)]
    random.Random(seed).shuffle(items)
    if prefix:  # a policy that keeps the current order (all of it or a head of it)
        order = [r.request_id for r in items][: len(order)]
    assert ordered(items, order) == reference(items, order)
