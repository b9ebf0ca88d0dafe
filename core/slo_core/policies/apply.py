"""How an engine applies a policy's :class:`~slo_core.policies.base.Decision` to its queues.

One pure function shared by the simulator, engine-sim and the sidecar, so that every engine reads a
Decision the same way:

* ``preempt`` names running requests; they leave ``running`` (their KV cache is freed by the caller)
  and go back to waiting for recompute. Unknown or non-running ids are ignored.
* ``reject`` names waiting requests; they leave the engine. A request both admitted and rejected is
  rejected.
* ``admit`` orders waiting requests (policy-preempted ones included): listed requests come first, in
  that order; the unlisted ones follow, policy-preempted first (vLLM requeues a preempted request
  at the front), then the rest in their current order. With ``hold_unlisted`` the unlisted ones are
  held: they stay queued but are not offered for admission until a later decision lists them.
  An ``admit`` that is a :class:`~slo_core.policies.base.PositionalOrder` of the admission pool as
  it was given to the policy (the preempted, then the waiting) is placed by position when nothing is
  rejected: the same queues; positions that cannot be that pool's fall back to the ids.
* ``running_order`` orders running requests for the token budget: listed ones first in that order,
  then the unlisted in their current order. None keeps the current order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Generic, Protocol, TypeVar

from slo_core.policies.base import Decision, PositionalOrder, request_id_of, slots_twin


class HasRequestId(Protocol):
    @property
    def request_id(self) -> str: ...


T = TypeVar("T", bound=HasRequestId)


@dataclass(frozen=True, slots=True)
class AppliedDecision(Generic[T]):
    """The queues after a decision (the caller frees KV of ``preempted`` and drops ``rejected``)."""

    waiting: list[T]
    running: list[T]
    preempted: list[T]
    rejected: list[T]
    listed: frozenset[str]  # with hold_unlisted, the ids admission may take; empty otherwise
    hold_unlisted: bool

    def offered(self) -> list[T]:
        """Waiting requests in admission order, without the held ones."""
        if not self.hold_unlisted:
            return list(self.waiting)
        return [r for r in self.waiting if r.request_id in self.listed]


_NOTHING: frozenset[str] = frozenset()

# built once per decision: through slots_twin, not the frozen dataclass's slow __init__
_AppliedSlots = slots_twin(
    AppliedDecision, ("waiting", "running", "preempted", "rejected", "listed", "hold_unlisted")
)


def ordered(items: Sequence[T], order: Sequence[str]) -> tuple[list[T], list[T]]:
    """Split ``items`` into (listed in ``order``'s order, the rest in current order); duplicates once."""
    n = len(order)
    ids = list(map(request_id_of, items))  # C-level passes from here on, not a Python loop per item
    if n <= len(items) and ids[:n] == list(order):
        # the common case of a policy that keeps the order: a prefix already in place
        return list(items[:n]), list(items[n:])
    if n * _SHORT < len(items):
        return _ordered_short(items, ids, order)
    by_id = dict(zip(ids, items, strict=True))
    if n == len(by_id) == len(items) and by_id.keys() == set(order):
        # a whole new order of the queue (what most policies return): every id once, nothing left
        return list(map(by_id.__getitem__, order)), []
    listed: list[T] = []
    seen: set[str] = set()
    for rid in order:
        r = by_id.get(rid)
        if r is not None and rid not in seen:
            listed.append(r)
            seen.add(rid)
    rest = [r for r in items if r.request_id not in seen]
    return listed, rest


def by_position(items: Sequence[T], at: Sequence[int]) -> tuple[list[T], list[T]] | None:
    """:func:`ordered` for an order given by position (``items[i] for i in at``, then the rest in
    current order), or None when ``at`` is not a list of distinct indices into ``items`` (the caller
    then reads the order's ids). The same lists as :func:`ordered` on those items' ids when the ids
    are distinct, as in an engine's queue, without looking any of them up (C-level passes only, for
    a whole new order)."""
    n = len(items)
    k = len(at)
    if k == 0 or k > n:
        return None
    try:
        taken = set(at)
        if len(taken) != k or min(taken) < 0 or max(taken) >= n:
            return None
        listed = [items[at[0]]] if k == 1 else list(itemgetter(*at)(items))
    except TypeError:  # not integers
        return None
    if k == n:
        return listed, []
    return listed, [r for i, r in enumerate(items) if i not in taken]


def _names_match(listed: Sequence[HasRequestId], order: Sequence[str]) -> bool:
    """Whether the first, middle and last requests placed by position carry the ids ``order`` lists
    there: a cheap check that the positions index the pool they were made for."""
    k = len(order)
    return all(listed[i].request_id == order[i] for i in (0, k // 2, k - 1))


# an order of fewer than 1/_SHORT of the items (a policy that lists only what it admits, holding the
# rest) finds each of its ids by a scan of the ids instead of a dict of all the items
_SHORT = 16


def _ordered_short(items: Sequence[T], ids: list[str], order: Sequence[str]) -> tuple[list[T], list[T]]:
    """:func:`ordered` for a short ``order`` (ids unique among ``items``, as in an engine's queue)."""
    at: list[int] = []
    seen: set[str] = set()
    for rid in order:
        if rid in seen:
            continue
        seen.add(rid)
        try:
            at.append(ids.index(rid))
        except ValueError:
            continue
    rest = list(items)
    for i in sorted(at, reverse=True):
        del rest[i]
    return [items[i] for i in at], rest


def _taken_out(items: Sequence[T], ids: Sequence[str]) -> tuple[list[T], list[T]]:
    """(the items whose id is in ``ids``, the rest), both in order; no pass over ``items`` without ids."""
    if not ids:
        return [], list(items)
    wanted = set(ids)
    taken = [r for r in items if r.request_id in wanted]
    return taken, ([r for r in items if r.request_id not in wanted] if taken else list(items))


def apply_decision(decision: Decision, waiting: Sequence[T], running: Sequence[T]) -> AppliedDecision[T]:
    """Apply ``decision`` to ``waiting`` and ``running`` (both in their current order); pure."""
    # most decisions preempt and reject nothing: no pass over the queues then
    preempted, still_running = _taken_out(running, decision.preempt)
    rejected, queued = _taken_out(waiting, decision.reject)
    admit = decision.admit
    placed = None
    if type(admit) is PositionalOrder and not rejected and admit.n == len(preempted) + len(waiting):
        placed = by_position([*preempted, *waiting] if preempted else waiting, admit.at)
        if placed is not None and not _names_match(placed[0], admit):
            placed = None  # positions of another pool (an order kept from an earlier call): by id
    listed, rest = placed if placed is not None else ordered([*preempted, *queued], admit)
    if decision.running_order is not None:
        first, later = ordered(still_running, decision.running_order)
        still_running = first + later
    a = object.__new__(_AppliedSlots)
    a.waiting = listed + rest
    a.running = still_running
    a.preempted = preempted
    a.rejected = rejected
    # read only to hold the unlisted (a set of a whole new order's ids was ~half of applying it)
    a.listed = frozenset(map(request_id_of, listed)) if decision.hold_unlisted else _NOTHING
    a.hold_unlisted = decision.hold_unlisted
    a.__class__ = AppliedDecision
    out: AppliedDecision[T] = a
    return out
