"""``SLOScheduler``: a vLLM v1 ``Scheduler`` subclass that applies a slofleet policy every frame.

Load it with ``--scheduler-cls slo_vllm_plugin.scheduler.SLOScheduler`` (pinned to
vllm 0.32, whose scheduler interface is not public). Before each stock scheduling pass it:

1. at a frame boundary (the policy's ``frame_steps``, or an arrival/finish when the policy
   reschedules on events) snapshots waiting and running requests with their SLO tags from
   ``vllm_xargs`` and asks the policy for a :class:`~slo_core.policies.base.Decision`;
2. preempts the running requests the policy names through vLLM's own ``_preempt_request`` (KV blocks
   freed, the request recomputed later), aborts the ones it rejects;
3. reorders ``self.waiting`` to the policy's admission order, holding back requests the policy does
   not want admitted yet, reorders ``self.running`` to the policy's running order (vLLM gives the
   token budget in that order and preempts from its end), caps the step's token budget at the
   policy's ``token_budget`` if it set one, then lets vLLM's own pass build the batch.

``Decision.prefill_first`` (vLLM v0's order) has no equivalent in v1's running-first pass and is
ignored here; the simulator and engine-sim honour it.

Engine mode: at most once per ``SLOFLEET_REPORT_INTERVAL_S`` a step snapshots its requests (phase,
token counts, verified SLO tags) and KV use for the analyzer client's thread, which reports them to the
sidecar (``Analyzer.Report``: the engine view routers get) and brings back refined bounds; the step
never waits on it. Requests leaving the engine are reported with their output length, prompt and SLO
outcome, judged when it is freed by its :func:`~slo_vllm_plugin.report.watch`; a latency request's
watch is also fed its output count after every step that made tokens for it (two dict lookups and a
compare per request in the step's outputs), the other kinds need only their finish time.

A policy that learns from finished requests (``EnginePolicy.observe``: GMAX's cutoff tuner, its
per-tenant service for ``spec.fairness``, its reading of the analyzer's bounds) is told of each
request that finished on its own, as the simulator tells it: the bridge keeps the output tokens'
times (the step's time for each token it made) and builds core's
:class:`~slo_core.policies.feedback.Feedback` of them when the request is freed. A request that
ends on a stop *string* is not among them: vLLM v1 detects stop strings in its front end, which
aborts the request in the engine, and an abort cannot be told from a client that went away.

Any policy error, or an analyzer that stopped answering, degrades to vLLM's stock order for that
step: requests are never failed by the plugin. Requires ``--scheduling-policy fcfs`` (the default);
under ``priority`` the waiting heap cannot be reordered, so only preemptions are applied.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from slo_core.policies.base import Decision, EngineView
from slo_core.policies.feedback import Feedback
from slo_core.slo import RequestKind
from slo_vllm_plugin.bridge import PolicyBridge
from slo_vllm_plugin.engine_trace import EngineTrace
from slo_vllm_plugin.metrics import PluginMetrics
from slo_vllm_plugin.report import (
    EngineSnapshot,
    Finished,
    RequestRow,
    Throttle,
    finish_reason,
    judge,
    watch,
)
from slo_vllm_plugin.settings import PluginSettings, load_objective, load_policy

# vLLM configures only its own "vllm" logger (handler, format, INFO): under it the plugin's start line
# and its degradations appear in vLLM's output like vLLM's own, not only what reaches Python's stderr
# fallback (WARNING and above, unformatted).
log = logging.getLogger(f"vllm.{__name__}")


def _load_tag_keys(settings: PluginSettings) -> Any:
    """The key file SLO tags must be signed with, followed live as the operator rotates the Secret
    (None: no key configured, tags trusted as before).

    A configured key file that cannot be read at start fails closed: no tag verifies, every request
    is best-effort, and the error says why."""
    if not settings.tag_key_file:
        return None
    from slo_core.wire.keyring import KeyFile

    try:
        key_file = KeyFile(settings.tag_key_file)
    except (OSError, ValueError) as exc:
        log.error(
            "slofleet: tag key file %s unusable (%s): every request is best-effort",
            settings.tag_key_file,
            exc,
        )
        return []
    return lambda: key_file().verify_keys


class SLOScheduler(Scheduler):  # type: ignore[misc]
    """vLLM scheduler that applies a slofleet engine policy (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slo_settings = PluginSettings.from_env()
        self.slo_trace = EngineTrace(self.slo_settings.trace_path)
        self.slo_metrics = PluginMetrics(self.slo_settings.metrics_port)
        self.slo_analyzer = _start_analyzer(self.slo_settings)
        policy = load_policy(self.slo_settings)
        self.slo_bridge = PolicyBridge(
            policy,
            bounds=self._fresh_bounds,
            deadlines=self._fresh_deadlines,
            tag_keys=_load_tag_keys(self.slo_settings),
            on_unsigned=self.slo_metrics.unsigned,
            on_quiet=self.slo_metrics.quiet,
            feedback=_feedback(self.slo_settings),
        )
        self._slo_profile = _load_profile(self.slo_settings.profile)
        self._slo_degraded_reason = ""
        self._slo_report = Throttle(self.slo_settings.report_interval_s)
        self._slo_finished: list[Finished] = []
        self._slo_watches: dict[str, Any] = {}  # request id -> SLOWatch of latency requests (engine mode)
        self._slo_rejecting: set[str] = set()
        log.info(
            "slofleet scheduler: policy=%s analyzer=%s tags=%s",
            policy.name,
            self.slo_settings.analyzer or "none",
            "signed" if self.slo_settings.tag_key_file else "trusted",
        )
        if self.slo_analyzer is not None:
            from slo_vllm_plugin.analyzer_client import client_problem

            problem = client_problem()
            if problem:  # said at start, not at the first request: the metric and the operator see it
                log.error(
                    "slofleet: %s; scheduling falls back to vLLM's stock order until the image has the "
                    "grpcio/protobuf of requirements/image.lock",
                    problem,
                )
                self._degrade(problem)
        self.slo_trace.event("start", policy=policy.name)

    # ---- hooks ---------------------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        self.slo_bridge.note_event()
        self.slo_bridge.arrived(request)
        if self.slo_analyzer is not None:
            tags = self.slo_bridge.tags(request)
            if tags is not None and tags.targets.kind is RequestKind.LATENCY:  # per-token deadlines
                self._slo_watches[request.request_id] = watch(tags, float(request.arrival_time))
        self._slo_publish(force=False)  # an arrival shows in the sidecar's state without waiting a step
        if self.slo_trace.enabled:
            rid = request.request_id
            self.slo_trace.event("arrive", request_id=rid, key=self._slo_key(rid))

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        finished = super().finish_requests(request_ids, finished_status)
        for req in finished:
            self.slo_trace.event("abort", request_id=req.request_id)
        self._forget(finished)
        return list(finished)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.slo_bridge.step += 1
        held: list[Any] = []
        try:
            held = self._apply_policy()
        except Exception as exc:  # a policy bug must never fail the engine step
            self._degrade(f"policy error: {exc!r}")
        stock_budget = self.max_num_scheduled_tokens
        budget = self.slo_bridge.token_budget
        if budget is not None and 0 < budget < stock_budget and not self._slo_degraded_reason:
            self.max_num_scheduled_tokens = budget
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = stock_budget
        if held:
            for req in held:
                self.waiting.add_request(req)
        self._slo_publish(force=False)
        for data in output.scheduled_new_reqs:
            self.slo_trace.event(
                "admit",
                request_id=data.req_id,
                key=self._slo_key(data.req_id),
                step=self.slo_bridge.step,
                tokens=output.num_scheduled_tokens.get(data.req_id, 0),
            )
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        done = []
        watches, requests, now = self._slo_watches, self.requests, time.time()
        bridge = self.slo_bridge
        timed = bridge.feedback is not None
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                # finished ones were judged (and dropped) when freed: not in requests any more
                w = watches.get(out.request_id)
                if (w is not None or timed) and (req := requests.get(out.request_id)) is not None:
                    if w is not None:
                        w.tokens(req.num_output_tokens, now)
                    if timed:
                        bridge.made_tokens(req, now)
                if out.finish_reason is not None:
                    done.append(out.request_id)
                    self.slo_trace.event("finish", request_id=out.request_id, reason=str(out.finish_reason))
        if done:
            self.slo_bridge.note_event()
            self.slo_bridge.forget(done)
            # an engine that just emptied is not stepped again: show it idle now
            self._slo_publish(force=not self.waiting and not self.running)
        return outputs

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        rid = request.request_id
        reason = finish_reason(request)
        # before forget drops its tags; a request that finished on its own is fed back to the policy
        self.slo_bridge.call_ended(request, reason, rejected=rid in self._slo_rejecting, now_s=time.time())
        if self.slo_analyzer is not None:
            tags = self.slo_bridge.tags(request)
            w = self._slo_watches.pop(rid, None) or watch(tags, float(request.arrival_time))
            w.tokens(int(request.num_output_tokens), time.time())  # this step's tokens, freed in it
            self._slo_finished.append(
                Finished(
                    (tags.request_key if tags else "") or rid,
                    int(request.num_output_tokens),
                    reason,
                    (tags.tier if tags else None) or "",
                    judge(w, reason, rejected=rid in self._slo_rejecting),
                    int(request.num_prompt_tokens),
                )
            )
        return super()._free_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        self.slo_trace.close()
        if self.slo_analyzer is not None:
            self.slo_analyzer.close()
        super().shutdown()

    # ---- engine mode: the engine view for the sidecar ---------------------------------------------

    def _slo_row(self, req: Any, phase: str | None) -> RequestRow:
        tags = self.slo_bridge.tags(req)
        if phase is None:
            phase = "prefill" if req.num_computed_tokens < req.num_prompt_tokens else "decode"
        return RequestRow(
            key=(tags.request_key if tags else "") or req.request_id,
            phase=phase,
            prompt_tokens=int(req.num_prompt_tokens),
            generated_tokens=int(req.num_output_tokens),
            max_tokens=int(req.max_tokens),
            arrival_unix_s=float(req.arrival_time),
            tags=tags,
        )

    def _slo_publish(self, *, force: bool) -> None:
        """Hand the analyzer client a snapshot when one is due (its thread sends it; no I/O here)."""
        analyzer = self.slo_analyzer
        if analyzer is None:
            return
        now = time.time()
        if not (self._slo_report.due(now) or force):
            return
        if self._slo_finished:
            analyzer.finished(self._slo_finished)
            self._slo_finished = []
        rows = [self._slo_row(r, "waiting") for r in self.waiting]
        rows += [self._slo_row(r, None) for r in self.running]
        pool = self.kv_cache_manager.block_pool
        total = max(1, int(pool.num_gpu_blocks))
        analyzer.publish(
            EngineSnapshot(
                snapshot_unix_s=now,
                step=self.slo_bridge.step,
                waiting=len(self.waiting),
                running=len(self.running),
                kv_usage=1.0 - pool.get_num_free_blocks() / total,
                kv_cache_tokens=total * int(self.block_size),
                requests=tuple(rows),
                policy=self.slo_bridge.policy.name,
                degraded_reason=self._slo_degraded_reason,
                max_model_len=int(getattr(self, "max_model_len", 0) or 0),
            )
        )

    # ---- policy application ----------------------------------------------------------------------

    def _fresh_bounds(self) -> dict[str, int] | None:
        if self.slo_analyzer is None:
            return {}
        return self.slo_analyzer.bounds_if_fresh(self.slo_settings.stale_after_s)

    def _fresh_deadlines(self) -> dict[str, float]:
        return self.slo_analyzer.deadlines() if self.slo_analyzer is not None else {}

    def _slo_key(self, request_id: str) -> str:
        """The sidecar's key of a request (its ``slo_request_key`` tag), else vLLM's id."""
        if not self.slo_trace.enabled:
            return request_id
        request = self.requests.get(request_id)
        tags = self.slo_bridge.tags(request) if request is not None else None
        return (tags.request_key if tags else "") or request_id

    def _engine_view(self, now_s: float) -> EngineView:
        pool = self.kv_cache_manager.block_pool
        return EngineView(
            now_s=now_s,
            step=self.slo_bridge.step,
            max_num_seqs=self.max_num_running_reqs,
            max_num_batched_tokens=self.max_num_scheduled_tokens,
            kv_blocks_total=pool.num_gpu_blocks,
            kv_blocks_free=pool.get_num_free_blocks(),
            block_size=self.block_size,
            profile=self._slo_profile,
        )

    def _apply_policy(self) -> list[Any]:
        """Run a frame if due; returns the waiting requests held back from this step."""
        bridge = self.slo_bridge
        if self.slo_analyzer is not None and self._fresh_bounds() is None:
            self._degrade("analyzer unreachable")
            return []
        due = bridge.frame_due(
            len(self.waiting),
            self.running,
            self.max_num_scheduled_tokens,
            self.kv_cache_manager.block_pool.get_num_free_blocks(),
            int(self.block_size),
        )
        if not isinstance(self.waiting, FCFSRequestQueue):
            if due:
                self._apply_preemptions(self._decide())
            return []
        if due:
            decision = self._decide()
            self._apply_preemptions(decision)
            self._apply_rejections(decision)
        offered, held = bridge.order_waiting(list(self.waiting))
        self.waiting.clear()
        self.waiting.extend(offered)
        self.running = bridge.order_running(self.running)
        self._recover()
        return held

    def _decide(self) -> Decision:
        started = time.perf_counter()
        decision = self.slo_bridge.decide(list(self.waiting), list(self.running), self._engine_view)
        self.slo_metrics.decision(time.perf_counter() - started)
        if self.slo_bridge.guard.degraded_reason:  # the policy failed: core's guard gave the stock decision
            self._degrade(self.slo_bridge.guard.degraded_reason)
        self.slo_trace.event(
            "decide",
            step=self.slo_bridge.step,
            admit=list(decision.admit),
            admit_keys=[self._slo_key(rid) for rid in decision.admit],
            preempt=list(decision.preempt),
            reject=list(decision.reject),
        )
        return decision

    def _apply_preemptions(self, decision: Decision) -> None:
        if not decision.preempt:
            return
        victims = set(decision.preempt)
        keep = []
        now = time.monotonic()
        for req in self.running:
            if req.request_id in victims and req.status == RequestStatus.RUNNING:
                self._preempt_request(req, now)
                self.slo_metrics.preemption()
                self.slo_trace.event("preempt", request_id=req.request_id, step=self.slo_bridge.step)
            else:
                keep.append(req)
        self.running = keep

    def _apply_rejections(self, decision: Decision) -> None:
        if decision.reject:
            self._slo_rejecting = set(decision.reject)  # judged as rejected when freed
            try:
                rejected = super().finish_requests(list(decision.reject), RequestStatus.FINISHED_ABORTED)
            finally:
                self._slo_rejecting = set()
            for req in rejected:
                self.slo_metrics.rejection()
                self.slo_trace.event("reject", request_id=req.request_id, reason=decision.reason)
            self._forget(rejected)

    def _forget(self, requests: list[Any]) -> None:
        if requests:
            self.slo_bridge.note_event()
            self.slo_bridge.forget(r.request_id for r in requests)

    def _degrade(self, reason: str) -> None:
        if reason != self._slo_degraded_reason:
            log.warning("slofleet scheduler degraded to stock order: %s", reason)
            self.slo_trace.event("degraded", reason=reason)
        self._slo_degraded_reason = reason
        self.slo_metrics.degraded(True)

    def _recover(self) -> None:
        if self._slo_degraded_reason and not self.slo_bridge.guard.degraded_reason:
            log.info("slofleet scheduler recovered from: %s", self._slo_degraded_reason)
            self.slo_trace.event("recovered")
            self._slo_degraded_reason = ""
            self.slo_metrics.degraded(False)


def _feedback(settings: PluginSettings) -> Feedback | None:
    """Feedback in the SLOPolicy's goodput (None: an objective that does not validate; the policy
    is then fcfs, which learns nothing)."""
    try:
        return Feedback.for_objective(load_objective(settings))
    except ValueError:
        return None


def _load_profile(name: str | None) -> Any:
    if not name:
        return None
    try:
        from slo_core.perf import load_profile

        return load_profile(name)
    except (ImportError, ValueError, FileNotFoundError) as exc:
        log.warning("slofleet: performance profile %r unavailable (%s)", name, exc)
        return None


def _start_analyzer(settings: PluginSettings) -> Any:
    if not settings.analyzer:
        return None
    from slo_vllm_plugin.analyzer_client import AnalyzerClient

    keys = None
    if settings.tag_key_file:  # the sidecar's gRPC services take only calls with a token
        from slo_core.wire.keyring import KeyFile

        # unusable: said by _load_tag_keys; calls go without a token, are refused, the plugin degrades
        with contextlib.suppress(OSError, ValueError):
            keys = KeyFile(settings.tag_key_file)
    return AnalyzerClient(settings.analyzer, interval_s=settings.report_interval_s, keys=keys)
