"""Orders placed by position (``PositionalOrder``): the engine's queues come out as the ids would
place them, invalid positions fall back to the ids, and to every other reader the order is the tuple
of its ids."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo_core.policies.apply import apply_decision, by_position, ordered
from slo_core.policies.base import Decision, PositionalOrder, positional


@dataclass(frozen=True)
class Item:
    request_id: str


def queue(n: int, seed: int) -> list[Item]:
    items = [Item(f"r{i}") for i in range(n)]
    random.Random(seed).shuffle(items)
    return items


@given(n=st.integers(1, 300), k=st.integers(1, 300), seed=st.integers(0, 1000))
def test_by_position_places_what_the_ids_place(n: int, k: int, seed: int) -> None:
    """Whole new orders and orders of part of the queue (the rest keeps its order)."""
    items = queue(n, seed)
    at = random.Random(seed + 1).sample(range(n), min(k, n))
    ids = [items[i].request_id for i in at]
    assert by_position(items, at) == ordered(items, ids)


@pytest.mark.parametrize(
    "at",
    [
        [],  # nothing listed: the ids' path handles it
        [0, 0],  # a position twice
        [0, 5],  # past the end
        [-1],  # negative (Python would index from the end)
        [0, 1, 2, 3, 4, 0],  # longer than the queue
        [0.0, 1.0],  # not integers
    ],
)
def test_invalid_positions_are_refused(at: list[int]) -> None:
    assert by_position(queue(5, 0), at) is None


def decisions(items: list[Item], running: list[Item], seed: int) -> list[tuple[Decision, Decision]]:
    """(positional, plain) pairs of decisions that list the same ids."""
    rng = random.Random(seed)
    n = len(items)
    at = rng.sample(range(n), rng.randint(1, n)) if n else []
    ids = tuple(items[i].request_id for i in at)
    admit = PositionalOrder(ids, at, n)
    pairs = [(Decision(admit=admit), Decision(admit=ids))]
    pairs.append((Decision(admit=admit, hold_unlisted=True), Decision(admit=ids, hold_unlisted=True)))
    if n:  # a rejected request: placed by its id, never by a stale position
        rej = (items[rng.randrange(n)].request_id,)
        pairs.append((Decision(admit=admit, reject=rej), Decision(admit=ids, reject=rej)))
    if running:
        # the preempted join the pool, in running order before the waiting: positions into it
        pre_at = sorted(rng.sample(range(len(running)), rng.randint(1, len(running))))
        pool = [running[j] for j in pre_at] + items
        pre = tuple(pool[j].request_id for j in rng.sample(range(len(pre_at)), len(pre_at)))
        p_at = rng.sample(range(len(pool)), rng.randint(1, len(pool)))
        p_ids = tuple(pool[i].request_id for i in p_at)
        pairs.append(
            (
                Decision(admit=PositionalOrder(p_ids, p_at, len(pool)), preempt=pre),
                Decision(admit=p_ids, preempt=pre),
            )
        )
        # positions of the waiting queue alone while some are preempted: read by id
        pairs.append((Decision(admit=admit, preempt=pre), Decision(admit=ids, preempt=pre)))
    # positions of a queue of another length: read by id
    pairs.append((Decision(admit=PositionalOrder(ids, at, n + 1)), Decision(admit=ids)))
    if len(at) > 1:  # positions made for another pool of the same length (kept from an earlier call)
        stale = PositionalOrder(ids, [*at[1:], at[0]], n)
        pairs.append((Decision(admit=stale), Decision(admit=ids)))
    return pairs


@given(n=st.integers(0, 40), n_run=st.integers(0, 4), seed=st.integers(0, 1000))
def test_apply_decision_by_position_equals_by_id(n: int, n_run: int, seed: int) -> None:
    items = queue(n, seed)
    running = [Item(f"x{i}") for i in range(n_run)]
    for by_pos, by_id in decisions(items, running, seed):
        assert apply_decision(by_pos, items, running) == apply_decision(by_id, items, running)


def test_a_positional_order_reads_as_the_tuple_of_its_ids() -> None:
    ids = ["a", "b", "c", "d"]
    order = positional(ids, [2, 0, 3], 4)
    assert isinstance(order, PositionalOrder)
    assert order == ("c", "a", "d")
    assert list(order) == ["c", "a", "d"]
    assert hash(order) == hash(("c", "a", "d"))
    assert order.at == [2, 0, 3] and order.n == 4
    assert positional(ids, [1], 4) == ("b",) and positional(ids, [1], 4).at == [1]
    assert positional(ids, [], 4) == ()
    # copies (and a deep copy of a decision) are the plain tuple: no positions to go stale
    for c in (copy.copy(order), copy.deepcopy(order), copy.deepcopy(Decision(admit=order)).admit):
        assert type(c) is tuple and c == ("c", "a", "d")
