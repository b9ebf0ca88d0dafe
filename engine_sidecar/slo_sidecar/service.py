"""The sidecar's core, without HTTP: admission, the generation task of each request, and accounting.

:meth:`Sidecar.accept` validates a request and admits it (or raises an :class:`APIError`: 400 with what
to fix, 429 over a tier's concurrency limit, 503 when draining, the engine is down or the queue is
full). :meth:`Sidecar.generate` runs one request's upstream attempts; :meth:`Sidecar.end` accounts
for it exactly once, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from slo_core.slo import SLOTargets, SLOTier
from slo_core.wire.headers import TENANT_HEADER, program_start_of, verify_headers
from slo_core.wire.keyring import KeyRing
from slo_core.wire.request_slo import SLOParamError, SLORequest, parse_slo
from slo_core.wire.signing import sign
from slo_core.wire.tags import EngineTags
from slo_net.upstream import UpstreamPool
from slo_sidecar.analyzer import CompoundAnalyzer
from slo_sidecar.attempt import generated_text, run_attempt
from slo_sidecar.calibration import CalibrationGauges, CalibrationHub
from slo_sidecar.config import PolicyConfig, SidecarKnobs
from slo_sidecar.engine_client import EngineRejected, EngineStatus, EngineUnavailable
from slo_sidecar.errors import APIError, overloaded
from slo_sidecar.estimators import LengthEstimator
from slo_sidecar.front import CHAT, ParsedBody, parse_body
from slo_sidecar.history import History
from slo_sidecar.job import Job
from slo_sidecar.metrics import SidecarMetrics
from slo_sidecar.mirror import EngineMirror
from slo_sidecar.scheduling import Scheduler
from slo_sidecar.tracker import Tracker

log = logging.getLogger(__name__)

# set by the router (which strips it from client requests): the tenant a request is accounted to
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class Sidecar:
    """Everything one sidecar process shares, built once and passed to the HTTP and gRPC fronts."""

    def __init__(
        self,
        *,
        knobs: SidecarKnobs,
        config: PolicyConfig,
        engine_url: str,
        estimator: LengthEstimator,
        estimator_source: str = "",
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.knobs = knobs
        self.config = config
        # --tag-key-file: the key ring that signs engine tags and authenticates gRPC calls (followed live)
        self.keys: Callable[[], KeyRing] | None = None
        self.engine_url = engine_url.rstrip("/")
        self.estimator = estimator
        self.estimator_source = estimator_source
        self.metrics = metrics or SidecarMetrics()
        self.history = History(knobs.history_size)
        self.tracker = Tracker(self.history)
        self.scheduler = Scheduler(
            config.make_policy(),
            self.metrics,
            mode=knobs.mode,
            max_running=knobs.max_running,
            frame_s=knobs.frame_s,
            kv_cache_tokens=knobs.kv_cache_tokens,
            max_batched_tokens=knobs.max_batched_tokens,
            engine_priority=knobs.engine_priority,
        )
        self.engine = EngineStatus()
        self.client: httpx.AsyncClient | None = None  # probes
        self.session: UpstreamPool | None = None  # generation (engine_client.new_session)
        self.jobs: dict[str, Job] = {}
        self.tier_inflight: Counter[str] = Counter()
        self.draining = False
        self.config_error = ""
        self._background: set[asyncio.Task[Any]] = set()
        self.calibration = make_hub(estimator, knobs)
        self.calibration_gauges = CalibrationGauges(self.metrics.registry) if self.calibration else None
        # engine mode: what the engine's scheduler reports (the router streams from the engine directly)
        self.mirror = EngineMirror(
            knobs=knobs,
            estimator=estimator,
            metrics=self.metrics,
            calibration=self.calibration,
            compound=CompoundAnalyzer(self.history.patterns),  # the patterns the proxy path learns too
            tiers=lambda: self.config.tiers,
        )

    # ---- admission ---------------------------------------------------------------------------
    async def accept(self, headers: Mapping[str, str], body: Any, endpoint: str) -> Job:
        cfg = self.config
        self._check_signed(headers)
        parsed = parse_body(body, endpoint, max_tokens_limit=self.context_tokens())
        try:
            # a signed request's SLO is the one the router signed: only its headers count
            slo = parse_slo(headers, {} if self.knobs.signed_requests else body)
        except SLOParamError as exc:
            raise APIError(400, str(exc), param=exc.param, code="invalid_slo") from None
        tier_name = slo.tier or cfg.default_tier
        tier = cfg.tiers.get(tier_name)
        if tier is None:
            raise APIError(
                400,
                f"unknown SLO tier {tier_name!r}; choose one of: {', '.join(sorted(cfg.tiers))}",
                param="tier",
                code="invalid_slo",
            )
        try:
            targets = tier.targets(ttft_s=slo.ttft_s, tbt_s=slo.tbt_s, deadline_s=slo.deadline_s)
        except ValueError as exc:
            raise APIError(400, f"tier {tier_name!r}: {exc}", param="slo", code="invalid_slo") from None
        try:
            return await self._admit(headers, parsed, slo, tier, targets)
        except APIError as err:
            err.labels = (tier_name, targets.priority_class)
            raise

    async def _admit(
        self,
        headers: Mapping[str, str],
        parsed: ParsedBody,
        slo: SLORequest,
        tier: SLOTier,
        targets: SLOTargets,
    ) -> Job:
        cfg, tier_name = self.config, tier.name
        self._check_size(parsed.prompt_tokens, parsed.max_tokens)
        max_tokens = parsed.max_tokens or self.knobs.default_max_tokens
        if max_tokens is None:  # what vLLM does: the context left after the prompt
            max_tokens = max(1, self.context_tokens() - parsed.prompt_tokens)
        self._check_capacity(tier_name)  # early, before spending time on the bound; again below
        tenant = headers.get(TENANT_HEADER) or "default"
        plan, hub = None, self.calibration
        if hub is not None:  # one forest pass; refinements are arithmetic on the plan
            plan = await asyncio.to_thread(
                hub.plan,
                parsed.prompt_text or None,
                parsed.prompt_tokens,
                targets.kind.value,
                max_tokens,
                parsed.model,
                tenant,
            )
        if hub is not None and plan is not None:
            # applied: the calibrated bound; else the forest's own submission bound, read off the same
            # forest pass (raw[0] is the quantile OutputBoundEstimator.bound computes): no second pass
            bound = hub.bound_at(plan, 0) if self.knobs.calibration_apply else hub.forest_bound(plan)
        else:
            bound = await self._off_loop(
                self.estimator.bound,
                parsed.prompt_text or None,
                parsed.prompt_tokens,
                targets.kind.value,
                max_tokens,
            )
        self._check_capacity(tier_name)  # no await from here until the job is counted: no overshoot
        max_wait = min(slo.max_wait_s or cfg.max_wait_s, cfg.max_wait_s)
        live = self.tracker.new_request(
            tier=tier,
            targets=targets,
            prompt_text=parsed.prompt_text,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=max_tokens,
            max_wait_s=max_wait,
            bound=int(bound),
            program_id=slo.program_id,
            stage=slo.stage,
            stated_stages=slo.stages,
            program_start_unix_s=program_start_of(headers),
            tenant=tenant,
            request_id=self._request_id(headers.get("x-request-id")),
        )
        live.plan = plan
        if hub is not None and plan is not None:  # in flight: a censored score until it ends (as simulated)
            hub.calibrator.track(live)
        job = Job(live, parsed)
        self.jobs[live.request_id] = job
        self.tier_inflight[tier_name] += 1
        self.metrics.prompt_tokens.labels(tier_name, targets.priority_class).inc(parsed.prompt_tokens)
        return job

    def _check_signed(self, headers: Mapping[str, str]) -> None:
        """With ``signed_requests``: 403 unless the router signed the SLO, tier, tenant and request id
        (a caller that reaches this pod without the router cannot choose its tier or tenant)."""
        if not self.knobs.signed_requests:
            return
        why = (
            "no tag key"
            if self.keys is None
            else verify_headers(headers, self.keys().verify_keys, time.time())
        )
        if why is None:
            return
        self.metrics.unsigned_requests.labels(why).inc()
        raise APIError(
            403,
            f"this pod takes requests only from the slofleet router ({why} headers)",
            code="unsigned_request",
        )

    def _request_id(self, given: str | None) -> str | None:
        """Keep the router's request id (for tracing across hops) when it is safe and not in use."""
        if given and _SAFE_ID.fullmatch(given) and given not in self.jobs:
            return given
        return None

    async def _off_loop(self, fn: Callable[..., int], *args: Any) -> int:
        """Predictor calls run in a thread (QRF: ~1 ms) unless the estimator says it is cheap."""
        if getattr(self.estimator, "cheap", False):
            return int(fn(*args))
        return int(await asyncio.to_thread(fn, *args))

    def context_tokens(self) -> int:
        """The model's context (prompt plus output, tokens): the engine's max_model_len when it says."""
        return self.engine.max_model_len or self.knobs.max_context_tokens

    def _check_size(self, prompt_tokens: int, max_tokens: int | None) -> None:
        limit = self.context_tokens()
        longest = min(self.knobs.max_prompt_tokens or limit, limit)
        if prompt_tokens > longest:
            raise APIError(
                400,
                f"the prompt is about {prompt_tokens} tokens; this model accepts at most {longest}: "
                "shorten the prompt",
                param="prompt",
                code="context_length_exceeded",
            )
        if max_tokens is not None and prompt_tokens + max_tokens > limit:
            raise APIError(
                400,
                f"prompt (about {prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"context limit of {limit} tokens: lower max_tokens or shorten the prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )

    def _check_capacity(self, tier: str) -> None:
        k, s = self.knobs, self.scheduler
        if self.draining:
            raise overloaded("this pod is shutting down; send the request to another replica", "draining", 1)
        if not self.engine.healthy:
            raise overloaded(f"the engine is not available ({self.engine.error})", "engine_unavailable", 2)
        limit = k.tier_max_inflight
        if limit is not None and self.tier_inflight[tier] >= limit:
            raise APIError(
                429,
                f"tier {tier!r} already has {limit} requests in flight on this pod; retry later",
                kind="rate_limit_error",
                code="tier_limit",
                retry_after_s=1,
            )
        queued = len(self.jobs) - k.max_running  # the engine's seats are taken first
        if queued >= k.max_queue:
            raise overloaded(
                f"{queued} requests are already waiting on this pod", "queue_full", s.retry_after_s()
            )

    # ---- generation --------------------------------------------------------------------------
    def upstream_body(self, job: Job) -> dict[str, Any]:
        """The body of the next attempt: a continuation (prompt + generated text) after a preemption."""
        live, parsed = job.live, job.parsed
        body = dict(parsed.forward)
        body["stream"] = parsed.stream
        if parsed.stream:  # counted off each chunk's usage; a non-streamed answer is passed through
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        done = live.generated_tokens
        if done or parsed.max_tokens is not None or self.knobs.default_max_tokens is not None:
            body["max_tokens"] = max(1, live.max_tokens - done)
        # else: the engine applies its own default (the context left), exactly as vLLM alone would
        if done:
            text = generated_text(job)
            if parsed.endpoint == CHAT:
                body["messages"] = [*parsed.forward["messages"], {"role": "assistant", "content": text}]
                body["add_generation_prompt"] = False
                body["continue_final_message"] = True
            else:
                body["prompt"] = live.prompt_text + text
        if job.engine_priority is not None:
            body["priority"] = job.engine_priority
        if self.knobs.mode == "engine":
            tags = EngineTags(
                targets=live.targets,
                request_key=live.request_id,
                tenant=live.tenant,
                deadline_at_s=self.tracker.unix(live.deadline_at_s)
                if live.deadline_at_s is not None
                else None,
                output_bound=live.bound,
                program_id=live.program_id,
                stage=live.stage,
            )
            xargs = tags.to_xargs()
            if self.keys is not None:  # the plugin schedules unsigned or forged tags best-effort
                now_s = time.time()
                xargs = sign(xargs, self.keys().signing_key(now_s), now_s)
            client = parsed.forward.get("vllm_xargs") or {}
            client = {k: v for k, v in client.items() if not str(k).startswith("slo_")}
            body["vllm_xargs"] = {**client, **xargs}
        return body

    async def generate(self, job: Job) -> None:
        """Attempts until the request completes; preemption sends it back to wait. Emits done/error."""
        try:
            async with asyncio.timeout_at(
                self._loop_time_at(job.live.arrival_s + self.knobs.request_timeout_s)
            ):
                await self._attempts(job)
            job.emit("done")
        except TimeoutError:
            job.emit(
                "error",
                APIError(
                    504, "the request ran past its time limit", kind="timeout_error", code="request_timeout"
                ),
            )
        except APIError as err:
            job.emit("error", err)
        except EngineRejected as exc:
            job.emit(
                "error",
                APIError(exc.status, f"the engine rejected the request: {exc}", code="engine_rejected"),
            )
        except EngineUnavailable as exc:
            log.warning("request %s: %s", job.request_id, exc)
            job.emit("error", overloaded(f"the engine failed: {exc}", "engine_failed", 2))
        except Exception:  # a bug must end the request with an answer, never leave it waiting
            log.exception("request %s: generation failed unexpectedly", job.request_id)
            job.emit(
                "error",
                APIError(
                    500,
                    "internal error while generating; it was logged",
                    kind="server_error",
                    code="internal_error",
                ),
            )
        finally:
            if job.attempt_task is not None and not job.attempt_task.done():
                job.attempt_task.cancel()
            self.scheduler.forget(job)

    async def _attempts(self, job: Job) -> None:
        while True:
            await job.released.wait()
            if job.rejection is not None:
                raise job.rejection
            job.attempts += 1
            job.preempting = False
            job.attempt_task = asyncio.create_task(run_attempt(self, job, self.upstream_body(job)))
            try:
                await job.attempt_task
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if job.preempting and not (task is not None and task.cancelling()):
                    continue
                raise

    def _loop_time_at(self, mono_s: float) -> float:
        return asyncio.get_running_loop().time() + (mono_s - self.now())

    def refine_later(self, job: Job) -> None:
        """Re-estimate the bound off the event loop every ``refine_every_tokens`` tokens."""
        live = job.live
        if live.generated_tokens - live.last_refined_tokens < self.knobs.refine_every_tokens:
            return
        live.last_refined_tokens = live.generated_tokens
        if self.calibration is not None and live.plan is not None and self.knobs.calibration_apply:
            live.bound = self.calibration.bound_at(live.plan, live.generated_tokens)
            return

        # a predictor that reads no text (the fallback's quantiles) spares decoding the raw chunks
        wants_text = getattr(self.estimator, "reads_text", True)

        async def refine() -> None:
            value = await self._off_loop(
                self.estimator.refine,
                live.bound,
                live.prompt_text or None,
                live.prompt_tokens,
                live.generated_tokens,
                generated_text(job) if wants_text else None,
                live.targets.kind.value,
                live.max_tokens,
            )
            live.bound = max(int(value), min(live.max_tokens, live.generated_tokens + 1))

        task = asyncio.create_task(refine())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- accounting --------------------------------------------------------------------------
    def note_reject(self, err: APIError, tier: str = "-", pclass: str = "-") -> None:
        self.metrics.rejects.labels(tier, pclass, err.code or str(err.status)).inc()

    def end(self, job: Job, status: str, err: APIError | None = None) -> None:
        """Account for a request that ended: ok, error, aborted (client gone) or rejected (admission)."""
        if self.jobs.pop(job.request_id, None) is None:
            return
        live, m = job.live, self.metrics
        tier, pclass = live.tier.name, live.targets.priority_class
        self.tier_inflight[tier] -= 1
        arrived_s = None
        if self.calibration is not None and live.plan is not None:
            arrived_s = self.calibration.calibrator.untrack(live)
        outcome = self.tracker.outcome(
            live, status == "ok", self.config.objective.goodput, self.config.objective.gain
        )
        m.requests.labels(tier, pclass, status).inc()
        m.goodput_earned.labels(tier, pclass).inc(outcome.earned)
        m.goodput_lost.labels(tier, pclass).inc(max(0.0, outcome.ideal - outcome.earned))
        m.output_tokens.labels(tier, pclass).inc(live.generated_tokens)
        if status == "rejected" and err is not None:
            self.note_reject(err, tier, pclass)
        if status != "aborted":
            m.slo_result(tier, pclass, outcome.met_slo)
        if status == "ok" and live.started:
            m.ttft.labels(tier, pclass).observe(live.ttft_s())
            if live.generated_tokens > 1:
                m.tbt.labels(tier, pclass).observe(live.mean_tbt_s())
            m.e2e.labels(tier, pclass).observe(live.token_times_s[-1] - live.arrival_s)
            m.bound_ratio.labels(tier, pclass).observe(live.bound_at_arrival / max(1, live.generated_tokens))
            learn = getattr(self.estimator, "observe", None)
            if learn is not None and job.finish_reason == "stop":  # a natural end: a true length sample
                learn(live.generated_tokens)
            if self.calibration is not None and live.plan is not None and job.finish_reason == "stop":
                self.calibration.observe(live.plan, live.generated_tokens, live.bound_at_arrival, arrived_s)
        self.tracker.finish(live, outcome, status, self._history_fields(job))

    def _history_fields(self, job: Job) -> dict[str, Any]:
        """What retraining (``slofleet predictor train --from-history``) needs beyond the row's counts;
        prompt text only where the operator opted in (--history-prompt-text)."""
        out: dict[str, Any] = {"model": job.parsed.model, "finish_reason": job.finish_reason}
        if self.knobs.history_prompt_text:
            out["prompt"] = job.live.prompt_text
        return out

    def outstanding_tokens(self) -> int:
        """Admitted work not yet done: prompts not yet prefilled plus output bounds left (tokens)."""
        total = 0
        for job in list(self.jobs.values()):
            live = job.live
            total += max(0, live.bound - live.generated_tokens) + (0 if live.started else live.prompt_tokens)
        return total

    def waiting(self) -> int:
        """Requests waiting for a batch slot: the sidecar's queue and the engine's (proxy), the engine's."""
        if self.knobs.mode == "proxy":
            return len(self.scheduler.waiting) + self.engine.waiting
        return max(self.engine.waiting, 0)

    def update_gauges(self) -> None:
        m = self.metrics
        if not (self.knobs.mode == "engine" and self.mirror.seen):  # else set by each engine report
            m.outstanding_tokens.set(self.outstanding_tokens())
            m.program_requests.set(sum(1 for j in list(self.jobs.values()) if j.live.program_id))
            m.engine_waiting.set(self.waiting())
        if self.calibration is not None and self.calibration_gauges is not None:
            self.calibration_gauges.update(self.calibration)
        for gauge in (m.queue_depth, m.running):
            gauge.clear()
        for gauge, jobs in ((m.queue_depth, self.scheduler.waiting), (m.running, self.scheduler.running)):
            counts = Counter((j.live.tier.name, j.live.targets.priority_class) for j in jobs)
            for (tier, pclass), n in counts.items():
                gauge.labels(tier, pclass).set(n)

    def now(self) -> float:
        return time.monotonic()


def make_hub(estimator: LengthEstimator, knobs: SidecarKnobs) -> CalibrationHub | None:
    """The online calibration of a QRF estimator (None for the fallback estimator or when disabled)."""
    from slo_core.predict.estimator import OutputBoundEstimator

    if not knobs.calibration or not isinstance(estimator, OutputBoundEstimator):
        return None
    return CalibrationHub(
        estimator,
        origin=f"{knobs.pod or 'sidecar'}-{uuid.uuid4().hex[:12]}",  # kept across restarts (saved)
        strata=knobs.calibration_strata,
        model=knobs.model_name,
        window=knobs.calibration_window,
    )
