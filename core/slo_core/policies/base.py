"""The Protocols every scheduling and routing policy implements, and the snapshots they see.

One policy object runs unchanged in the simulator, in the sidecar (proxy mode), in engine-sim and in
the vLLM scheduler plugin: it sees only immutable snapshots, a clock value and an injected random
generator, and returns a decision. It may keep internal state (e.g. an online-tuned threshold) that
evolves only through these calls, so a run is reproducible from its inputs.

Engine side: at a frame boundary (every ``frame_steps`` engine steps, and on arrivals/finishes when
``reschedule_on_events``) the engine calls :meth:`EnginePolicy.decide` with the waiting and running
requests. The :class:`Decision` says which running requests to preempt (recompute later), the order
in which to admit waiting requests, the order of running requests for the token budget, and which
waiting requests to reject (admission control). Between frames the engine keeps the last orders:
new arrivals go after the ordered ones in arrival order unless ``hold_unlisted`` is set. Two optional
knobs persist between frames the same way: ``token_budget`` caps the tokens scheduled per step below
the engine's ``max_num_batched_tokens`` (Sarathi-Serve's fixed budget, dynamic batch sizing), and
``prefill_first`` admits waiting requests before scheduling running ones (vLLM v0's prefill-first
order) instead of vLLM v1's running-first order. ``slo_core.policies.apply`` is the one shared
implementation of how an engine applies a Decision to its queues. A policy that declares
``skip_quiet_decisions`` is not called at a frame or event where nothing waits and every running
request decodes (:func:`quiet_step`, the one rule every engine applies): the last orders and knobs stay.

Router side: :meth:`RouterPolicy.route` picks a replica for one request from replica snapshots
(possibly stale: ``snapshot_s`` says when each was taken) or rejects it. It sees only replicas the
routing pipeline's filters let through (``slo_core.routing``: model, context, GPU class, health), so a
policy never filters itself. Optional capabilities are declared on the policy (``BaseRouterPolicy``
gives the defaults): ``needs_request_snapshots`` (False: the replicas' counters suffice, which is much
cheaper to build) and ``gain_scored`` (True: ``RouteDecision.scores`` are estimated gains Δ_p, so a
maximum ≤ 0 means no replica can serve the request in time and admission control applies).
"""

from __future__ import annotations

import random
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter, itemgetter
from typing import Any, Protocol, runtime_checkable

from slo_core.perf.model import PerfProfile
from slo_core.slo import RequestKind, SLOTargets

# a request's id (views, SimRequests, anything with ``request_id``), as a C-level key function
request_id_of = attrgetter("request_id")

# compound programs an engine remembers (the least recently seen dropped): engine-sim and the plugin
MAX_ENGINE_PROGRAMS = 4096


def quiet_step(
    n_waiting: int, running: Iterable[tuple[int, int]], token_budget: int, free_blocks: int, block_size: int
) -> bool:
    """Whether a decision due now is quiet (see ``BaseEnginePolicy.skip_quiet_decisions``): nothing
    waits (held requests count as waiting), every running request is a decode (``running``: each one's
    (tokens, computed tokens); a decode has exactly one token left to compute), the token budget in
    force (the last decision's, else the engine's own) covers all of them, and the KV blocks their new
    tokens open fit the free ones (a decode of ``c`` computed tokens opens a block when ``c`` fills
    its blocks exactly), so the step preempts nobody and its running order decides nothing. The one
    rule every engine applies."""
    if n_waiting:
        return False
    n = 0
    new_blocks = 0
    for tokens, computed in running:
        if tokens - computed != 1:
            return False
        n += 1
        if computed % block_size == 0:
            new_blocks += 1
    return n <= token_budget and new_blocks <= free_blocks


def decision_due(
    step: int,
    frame_steps: int,
    on_events: bool,
    events: bool,
    n_waiting: int,
    *,
    deep_queue_from: int,
    deep_queue_every: int,
    urgent: bool,
) -> bool:
    """Whether an engine asks its policy at ``step``: at every frame boundary (``frame_steps``), and at
    an event (``events``: an arrival or a finish since its last decision) when the policy reschedules
    on events (``on_events``) and :func:`event_deferred` does not leave it for later. The one rule every
    engine applies (the simulator's step inlines it: a call per step was ~2 % of the hour)."""
    return step % frame_steps == 0 or (
        on_events
        and events
        and not event_deferred(
            step, n_waiting, deep_queue_from=deep_queue_from, deep_queue_every=deep_queue_every, urgent=urgent
        )
    )


def event_deferred(
    step: int, n_waiting: int, *, deep_queue_from: int, deep_queue_every: int, urgent: bool
) -> bool:
    """Whether an engine leaves the decision an event (an arrival or a finish since its last decision)
    calls for until later: while ``deep_queue_from`` (> 0) or more requests wait (held ones included),
    at a step off the ``deep_queue_every`` cadence, unless one of them is ``urgent`` (a latency
    request arrived since the last decision: its first token is due within a TTFT). Frame boundaries
    are never deferred. See ``BaseEnginePolicy.deep_queue_from``; the one rule every engine applies."""
    return 0 < deep_queue_from <= n_waiting and not urgent and step % deep_queue_every != 0


def attained_service(prompt_tokens: int, computed_tokens: int, generated_tokens: int) -> int:
    """Tokens of service a request received, each prompt token once (a recompute is not counted):
    what ``RequestView.program_attained_tokens`` sums over a program's calls."""
    if generated_tokens > 0:
        return prompt_tokens + generated_tokens
    return min(computed_tokens, prompt_tokens)


@dataclass(frozen=True, slots=True)
class RequestView:
    """An immutable snapshot of one request (one call of a compound program) inside an engine.

    Times are absolute seconds on the engine's clock. ``deadline_at_s`` is the time by which this
    request should complete: its end-to-end deadline, a compound call's stage sub-deadline, or the
    best-effort default; None for latency requests (their tokens are due at first_due + i·TBT).
    """

    request_id: str
    slo: SLOTargets
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    generated_tokens: int = 0
    computed_tokens: int = 0
    deadline_at_s: float | None = None
    first_token_s: float | None = None
    output_bound: int | None = None
    true_output_tokens: int | None = None
    tenant: str = "default"
    program_id: str | None = None
    stage: int | None = None
    program_arrival_s: float | None = None
    program_deadline_at_s: float | None = None
    program_attained_tokens: int = 0
    preemptions: int = 0
    waiting_since_s: float | None = None

    @property
    def kind(self) -> RequestKind:
        return self.slo.kind

    @property
    def priority_weight(self) -> float:
        return self.slo.priority_weight

    @property
    def in_prefill(self) -> bool:
        """Prompt (or, after a preemption, the recompute of prompt + output) not fully computed.

        vLLM v1 accounting: a decoding request has every token computed except the one it sampled
        last, so it is in prefill while more than that one token is uncomputed.
        """
        return self.computed_tokens < self.prompt_tokens + max(0, self.generated_tokens - 1)

    @property
    def kv_tokens(self) -> int:
        return self.computed_tokens

    def token_due_at_s(self, index: int) -> float:
        """Absolute due time of output token ``index`` (0-based)."""
        if self.slo.kind is RequestKind.LATENCY:
            return self.arrival_s + self.slo.token_deadline_s(index)
        assert self.deadline_at_s is not None
        return self.deadline_at_s


@dataclass(frozen=True, slots=True)
class EngineView:
    """An immutable snapshot of an engine's state and limits."""

    now_s: float
    step: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int
    block_size: int = 16
    profile: PerfProfile | None = None
    engine_id: str = "engine-0"

    @property
    def kv_tokens_free(self) -> int:
        return self.kv_blocks_free * self.block_size


@dataclass(frozen=True, slots=True)
class Decision:
    """What the engine should do now (request ids refer to the snapshots passed in)."""

    admit: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()
    running_order: tuple[str, ...] | None = None
    reject: tuple[str, ...] = ()
    hold_unlisted: bool = False
    reason: str = ""
    token_budget: int | None = None
    prefill_first: bool = False


def slots_twin(cls: type, field_names: tuple[str, ...]) -> Any:
    """A plain class with the slots of the frozen slots dataclass ``cls``, for building its instances fast.

    A frozen dataclass's __init__ sets every field through ``object.__setattr__`` (a RequestView of 19
    fields: ~2.7 us). Filling an instance of the twin with plain attribute stores and then assigning
    ``__class__ = cls`` builds the same object in ~0.4 us (CPython allows the assignment between
    classes of the same slots layout; it is tried here). ``field_names``: the fields the caller sets,
    checked against ``cls`` so that a field added to it fails at import instead of staying unset.
    """
    if (
        tuple(f.name for f in fields(cls)) != field_names
        or tuple(getattr(cls, "__slots__", ())) != field_names
    ):
        raise ImportError(f"{cls.__name__}'s fields changed: update the builder that sets {field_names}")
    bases = getattr(cls, "__orig_bases__", cls.__bases__)  # a Generic dataclass: Generic[T], as cls
    twin = types.new_class(f"_{cls.__name__}Slots", bases, {}, lambda ns: ns.update(__slots__=field_names))
    probe: Any = object.__new__(twin)
    probe.__class__ = cls  # TypeError here if the layouts ever differ
    return twin


# RequestView's fast builder (object.__new__, plain stores, then ``__class__ = RequestView``), for the
# snapshots the simulator and the vLLM plugin build at every decision
RequestViewSlots = slots_twin(
    RequestView,
    (
        "request_id",
        "slo",
        "arrival_s",
        "prompt_tokens",
        "max_tokens",
        "generated_tokens",
        "computed_tokens",
        "deadline_at_s",
        "first_token_s",
        "output_bound",
        "true_output_tokens",
        "tenant",
        "program_id",
        "stage",
        "program_arrival_s",
        "program_deadline_at_s",
        "program_attained_tokens",
        "preemptions",
        "waiting_since_s",
    ),
)
_DecisionSlots = slots_twin(
    Decision,
    (
        "admit",
        "preempt",
        "running_order",
        "reject",
        "hold_unlisted",
        "reason",
        "token_budget",
        "prefill_first",
    ),
)


class PositionalOrder(tuple[str, ...]):
    """An order of request ids (a plain tuple of them to every reader) that also carries each id's
    position in the admission pool the policy was given: the running requests its decision preempts,
    in the order it was given them, then the ``waiting`` ones. ``at[k]`` is the index of ``self[k]``
    there, and ``n`` the pool's length (``len(waiting)`` when nothing is preempted).

    A policy returns one as ``Decision.admit`` when it ordered that pool; an engine that applies the
    decision to the very queues those snapshots were taken of, in the same order, can then place its
    requests by position instead of looking every id up (:func:`slo_core.policies.apply.apply_decision`,
    which checks ``n`` and the positions and otherwise reads the ids). The ids must be the pool's
    ``[at[k]]`` ids: :func:`positional` builds both from one list of indices."""

    at: Sequence[int]
    n: int

    def __new__(cls, ids: Iterable[str], at: Sequence[int], n: int) -> PositionalOrder:
        out = super().__new__(cls, ids)
        out.at = at
        out.n = n
        return out

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle as the tuple of ids every reader sees
        return (tuple, (tuple(self),))


def pick_ids(ids: Sequence[str], index: list[int]) -> tuple[str, ...]:
    """``tuple(ids[i] for i in index)``, done in C."""
    if not index:
        return ()
    if len(index) == 1:
        return (ids[index[0]],)
    out: tuple[str, ...] = itemgetter(*index)(ids)
    return out


def positional(ids: Sequence[str], at: list[int], n: int) -> tuple[str, ...]:
    """The ids ``ids[i] for i in at`` (``ids``: those of the admission pool, see
    :class:`PositionalOrder`, or a list that starts with them; ``at``: indices into the pool; ``n``:
    its length), as a :class:`PositionalOrder`."""
    return PositionalOrder(pick_ids(ids, at), at, n) if at else ()


def new_decision(
    *,
    admit: tuple[str, ...] = (),
    preempt: tuple[str, ...] = (),
    running_order: tuple[str, ...] | None = None,
    reject: tuple[str, ...] = (),
    hold_unlisted: bool = False,
    reason: str = "",
    token_budget: int | None = None,
    prefill_first: bool = False,
) -> Decision:
    """``Decision(...)`` with the same defaults, built through :func:`slots_twin` (equal to it); for
    policies that decide every few engine steps."""
    d = object.__new__(_DecisionSlots)
    d.admit = admit
    d.preempt = preempt
    d.running_order = running_order
    d.reject = reject
    d.hold_unlisted = hold_unlisted
    d.reason = reason
    d.token_budget = token_budget
    d.prefill_first = prefill_first
    d.__class__ = Decision
    out: Decision = d
    return out


@dataclass(frozen=True, slots=True)
class FinishedView:
    """Feedback about a request that left the engine (for online tuning)."""

    request: RequestView
    finish_s: float
    gain: float
    ideal_gain: float
    met_slo: bool


@runtime_checkable
class EnginePolicy(Protocol):
    """An engine-level scheduling policy (see module docstring for the contract)."""

    name: str
    frame_steps: int
    reschedule_on_events: bool

    def decide(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        engine: EngineView,
        rng: random.Random,
    ) -> Decision: ...

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None: ...


class BaseEnginePolicy:
    """Convenience base: a frame of one step, reschedule on events, ignore feedback.

    ``order_free_decisions`` (optional, default False): a policy sets it when its decision is a
    function of the requests' contents and the engine view alone (not the order of ``waiting`` and
    ``running``, nothing drawn from ``rng``, no state carried into later decisions) and it only orders
    and admits (no preemption, no ``token_budget``, no ``prefill_first``). A simulated engine may then
    leave out a decision that cannot change what runs (``slo_core.sim.engine.SimEngine``), taking it
    later on the snapshot it would have seen, so the decision must not read what other replicas move
    meanwhile (``program_attained_tokens``, which counts a program's calls everywhere).

    ``skip_quiet_decisions`` (optional, default False): a policy sets it when its decision at a quiet
    step (:func:`quiet_step`: nothing waits, and every running request decodes within the budget in
    force and the free KV blocks) would admit, preempt and reject nobody and set no ``token_budget``
    below the running decodes (and, for a policy that does not reschedule on events, set the very
    knobs the last decision set, since an arrival before the next frame meets those). Such a step
    preempts nobody, so its running order decides nothing; the decision could only reorder the
    running requests for later steps and move the policy's own state. Every engine (the simulator,
    engine-sim, the vLLM plugin) then leaves it out and keeps the last decision's orders and knobs;
    the policy decides again at the next frame or event that is not quiet. Unlike
    ``order_free_decisions`` this is a change of the policy's cadence, not an exact shortcut: the
    policy's own state (a tuner's epochs, a step-time correction) moves at the decisions it takes.

    ``deep_queue_from``, ``deep_queue_every`` (optional, default 0 and 1: off): while at least
    ``deep_queue_from`` requests wait (held ones included), every engine takes the policy's events only at
    every ``deep_queue_every``-th step, or at once after a latency request's arrival (:func:`event_deferred`,
    the one rule every engine applies); frame boundaries still decide. Between them the last decision's
    orders and knobs stay and arrivals wait behind the ordered requests, as between frames. Over a deep
    queue a decision at every arrival and finish costs a pass over thousands of requests while each changes
    little of what runs; this is a change of the policy's cadence, not an exact shortcut
    (``bench/event_decisions.py`` measures what it costs and saves).

    ``keyed_admission`` (optional, default False): a policy sets it when its decision is exactly
    ``Decision(admit=<the waiting ids sorted by admission_key, ties in queue order>)`` with a reason,
    knobs (``token_budget``, ``prefill_first``) that are the same at every decision, and nothing else
    (no preemption, rejection, running order or held requests, nothing drawn from ``rng``, no state),
    and :meth:`admission_key` is a function of the request's snapshot alone that does not change while
    the request waits. With ``keyed_running`` also set, the decision's ``running_order`` is the
    running requests that decode in their current order, then those in prefill sorted by
    admission_key (ties in current order): Sarathi-Priority's. The queue a decision leaves is then sorted,
    and it stays so if each request that joins it is placed where the next decision's stable sort
    would put it: an arrival after every request of an equal or smaller key, a request the engine
    preempts (requeued at the front) before every request of an equal or greater one. A simulated
    engine may keep its queue that way instead of asking the policy (the same orders, without a
    pass over the queue per decision).

    ``live_running`` (optional, default False): a policy sets it when it reads the snapshots of its
    running requests only through a ``slo_core.policies.gmax_snapshot.SnapshotTable`` (or iterates
    them, which builds them all) and keeps none of them past the decision unless it iterated them. A
    simulated engine may then pass them as ``LiveSnapshots``, whose progress fields the table reads
    from the engine's requests instead of a new snapshot of each at every step.
    """

    name = "base"
    frame_steps = 1
    reschedule_on_events = True
    deep_queue_from = 0
    deep_queue_every = 1
    order_free_decisions = False
    skip_quiet_decisions = False
    keyed_admission = False
    keyed_running = False
    live_running = False

    def admission_key(self, r: RequestView) -> Any:
        """The sort key of ``r`` in a ``keyed_admission`` policy's admission order."""
        raise NotImplementedError(f"{self.name} does not order admission by a key")

    def observe(self, finished: Sequence[FinishedView], now_s: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ReplicaCapabilities:
    """What a replica can serve (the router's capability filters)."""

    models: tuple[str, ...] = ()
    max_context_tokens: int = 1 << 30
    gpu_class: str = ""
    lora_adapters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """A (possibly stale) snapshot of one replica as the router sees it."""

    replica_id: str
    snapshot_s: float
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]
    kv_blocks_total: int
    kv_blocks_free: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16
    profile: PerfProfile | None = None
    engine_policy: str = "fcfs"
    healthy: bool = True
    capabilities: ReplicaCapabilities = field(default_factory=ReplicaCapabilities)
    reported_outstanding_tokens: int | None = None

    @property
    def outstanding_tokens(self) -> int:
        """Tokens still to process: unprefilled prompt plus remaining output (bound or cap).

        A replica that reports the figure itself (``reported_outstanding_tokens``: the simulator's
        incremental counter, a sidecar's gauge) is taken at its word; otherwise it is summed from the
        request snapshots.
        """
        if self.reported_outstanding_tokens is not None:
            return self.reported_outstanding_tokens
        total = 0
        for r in (*self.waiting, *self.running):
            expected = r.output_bound if r.output_bound is not None else r.max_tokens
            total += max(0, r.prompt_tokens - r.computed_tokens) + max(0, expected - r.generated_tokens)
        return total


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's pick: a replica id, or None to reject (with a reason and a retry hint)."""

    replica_id: str | None
    reason: str = ""
    retry_after_s: float | None = None
    to_best_effort: bool = False
    scores: tuple[tuple[str, float], ...] = ()


@runtime_checkable
class RouterPolicy(Protocol):
    """A routing policy: pick a replica for a request from replica snapshots (see the module docstring)."""

    name: str
    needs_request_snapshots: bool
    gain_scored: bool

    def route(
        self,
        request: RequestView,
        replicas: Sequence[ReplicaView],
        now_s: float,
        rng: random.Random,
    ) -> RouteDecision: ...


class BaseRouterPolicy:
    """Convenience base declaring a router policy's optional capabilities (override per policy)."""

    name = "base"
    needs_request_snapshots = True
    gain_scored = False
