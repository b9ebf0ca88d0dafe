"""Per-request values a policy computes from a request's snapshot, kept between its decisions.

At a deep queue most waiting requests are the same snapshot objects decision after decision; a policy
that recomputed their values (and looked each one up by id) every decision spent most of its time on
requests that had not moved. :class:`SnapshotSlots` keeps one slot per request, the values in one
float64 array per field, and on each :meth:`SnapshotSlots.sync` matches the snapshots it already
holds by identity in C (a live object's ``id()`` is its own, and the store holds every snapshot it
matched), looks up by request id only the rest, and recomputes a request's values only when its new
snapshot differs in what they are computed from (``same``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from slo_core.policies.base import RequestView

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class SnapshotSlots:
    """Slots of an engine's waiting requests (the first :attr:`size` slots, in no particular order),
    each with its snapshot (:attr:`views`) and its values (:attr:`col`, one array per field)."""

    def __init__(
        self,
        fields: tuple[str, ...],
        compute: Callable[[RequestView], tuple[float, ...]],
        same: Callable[[RequestView, RequestView], bool],
    ) -> None:
        """``compute``: a request's values, in ``fields`` order; ``same(old, new)``: whether two
        snapshots of one request give the same values (then ``new`` is kept without recomputing)."""
        self.fields = fields
        self._compute = compute
        self._same = same
        self.reset()

    def reset(self) -> None:
        """Forget every request (the values' inputs changed, e.g. the engine's profile)."""
        self.slot: dict[str, int] = {}
        self.views: list[RequestView | None] = []
        self.size = 0
        self._view_id: I64 = np.zeros(0, dtype=np.int64)
        self.col: dict[str, F64] = {name: np.zeros(0) for name in self.fields}

    def sync(self, snapshots: Sequence[RequestView]) -> I64:
        """Make the slots hold exactly ``snapshots`` (request ids unique); returns each one's slot."""
        n = len(snapshots)
        m = self.size
        view_ids = np.fromiter(map(id, snapshots), np.int64, n)
        by_id = np.argsort(self._view_id[:m])
        slots = find_sorted(self._view_id[by_id], by_id, view_ids)
        same = slots >= 0
        fresh = np.flatnonzero(~same).tolist()  # joined, or a new snapshot of a request held
        slot = self.slot
        present = np.zeros(m, dtype=np.bool_)
        present[slots[same]] = True
        for i in fresh:
            s = slot.get(snapshots[i].request_id)
            if s is not None:
                present[s] = True
        # drop the requests that left, from the last slot down: each drop moves the last slot's
        # request into the hole; ``where`` follows every slot's request to its new place
        where = np.arange(m)
        owner = where.copy()
        for s in np.flatnonzero(~present)[::-1].tolist():
            last = self.size - 1
            self._drop(s)
            if s != last:
                moved = owner[last]
                where[moved] = s
                owner[s] = moved
        slots[same] = where[slots[same]]
        views = self.views
        for i in fresh:
            r = snapshots[i]
            s = slot.get(r.request_id)
            if s is None:
                s = self._append(r.request_id)
                renew = True
            else:
                renew = not self._same(_held(views, s), r)
            if renew:
                for name, value in zip(self.fields, self._compute(r), strict=True):
                    self.col[name][s] = value
            views[s] = r
            self._view_id[s] = view_ids[i]
            slots[i] = s
        return slots

    def _append(self, rid: str) -> int:
        s = self.size
        if s == len(self._view_id):
            cap = max(64, 2 * s)
            view_id = np.zeros(cap, dtype=np.int64)
            view_id[:s] = self._view_id[:s]
            self._view_id = view_id
            for name, old in self.col.items():
                new = np.zeros(cap)
                new[:s] = old[:s]
                self.col[name] = new
            self.views.extend([None] * (cap - len(self.views)))
        self.slot[rid] = s
        self.size = s + 1
        return s

    def _drop(self, s: int) -> None:
        """Free slot ``s``: the last slot's request moves into it."""
        last = self.size - 1
        views = self.views
        del self.slot[_held(views, s).request_id]
        if s != last:
            moved = _held(views, last)
            self.slot[moved.request_id] = s
            views[s] = moved
            self._view_id[s] = self._view_id[last]
            for a in self.col.values():
                a[s] = a[last]
        views[last] = None
        self.size = last

    def view(self, s: int) -> RequestView:
        """The snapshot slot ``s`` holds."""
        return _held(self.views, s)


def find_sorted(keys: I64, values: I64, queries: I64) -> I64:
    """For each query, the value beside its key in ``keys`` (sorted ascending, unique), or -1 where
    the key is not there: a lookup of many keys at once, in C."""
    if len(keys) == 0:
        return np.full(len(queries), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    found: I64 = np.where(keys[at] == queries, values[at], -1)
    return found


def _held(views: list[RequestView | None], s: int) -> RequestView:
    v = views[s]
    if v is None:
        raise AssertionError(f"slot {s} holds no snapshot")
    return v
