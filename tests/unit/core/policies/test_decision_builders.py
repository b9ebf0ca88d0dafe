"""The fast builders of Decision and AppliedDecision give what the dataclasses' constructors give.

``new_decision`` and ``apply_decision`` build them through ``slots_twin``; their objects must equal,
hash and read like the constructors', with every field in its place, and stay frozen; ``slots_twin``
refuses a field list that is not the dataclass's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo_core.policies.apply import AppliedDecision, apply_decision, ordered
from slo_core.policies.base import Decision, new_decision, slots_twin

ids = st.lists(st.sampled_from([f"r{i}" for i in range(8)]), max_size=6, unique=True).map(tuple)


@given(
    admit=ids,
    preempt=ids,
    running_order=st.one_of(st.none(), ids),
    reject=ids,
    hold_unlisted=st.booleans(),
    reason=st.text(max_size=12),
    token_budget=st.one_of(st.none(), st.integers(1, 8192)),
    prefill_first=st.booleans(),
)
def test_new_decision_equals_the_constructor(**kw: object) -> None:
    built = new_decision(**kw)  # type: ignore[arg-type]
    want = Decision(**kw)  # type: ignore[arg-type]
    assert built == want
    assert hash(built) == hash(want)
    assert [getattr(built, f.name) for f in dataclasses.fields(Decision)] == list(kw.values())
    assert new_decision() == Decision()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.reason = "changed"  # type: ignore[misc]


@dataclass(frozen=True)
class Item:
    request_id: str


@given(
    n_wait=st.integers(0, 5),
    n_run=st.integers(0, 5),
    admit=ids,
    preempt=ids,
    reject=ids,
    order=st.one_of(st.none(), ids),
    hold=st.booleans(),
)
def test_apply_decision_builds_what_the_constructor_builds(
    n_wait: int,
    n_run: int,
    admit: tuple[str, ...],
    preempt: tuple[str, ...],
    reject: tuple[str, ...],
    order: tuple[str, ...] | None,
    hold: bool,
) -> None:
    waiting = [Item(f"r{i}") for i in range(n_wait)]
    running = [Item(f"r{i}") for i in range(n_wait, n_wait + n_run)]
    d = Decision(admit=admit, preempt=preempt, running_order=order, reject=reject, hold_unlisted=hold)
    got = apply_decision(d, waiting, running)
    preempted = [r for r in running if r.request_id in preempt]
    still = [r for r in running if r.request_id not in preempt]
    rejected = [r for r in waiting if r.request_id in reject]
    listed, rest = ordered([*preempted, *[r for r in waiting if r not in rejected]], admit)
    if order is not None:
        first, later = ordered(still, order)
        still = first + later
    want = AppliedDecision(
        waiting=listed + rest,
        running=still,
        preempted=preempted,
        rejected=rejected,
        listed=frozenset(r.request_id for r in listed) if hold else frozenset(),  # only held by it
        hold_unlisted=hold,
    )
    assert got == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.hold_unlisted = not hold  # type: ignore[misc]


def test_slots_twin_refuses_a_field_list_that_is_not_the_dataclasses() -> None:
    with pytest.raises(ImportError, match="Decision's fields changed"):
        slots_twin(Decision, ("admit", "preempt"))
