"""Parameters of the GMAX engine policy (JITServe §4.2–§4.3) as a validated pydantic model.

Every field states its unit. The four registry variants (``gmax``, ``gmax-oracle``,
``gmax-no-analyzer``, ``gmax-no-gmax``) differ only in ``length_source`` and ``ordering``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slo_core.gain import GOODPUT_FUNCTIONS, GainParams
from slo_core.slo import DEFAULT_BEST_EFFORT_DEADLINE_S

LengthSource = Literal["analyzer", "oracle", "mean"]
Ordering = Literal["gmax", "sjf"]
Feasibility = Literal["bound", "probabilistic"]
CompoundDeadline = Literal["program", "stage"]
BoundReadingMode = Literal["static", "learned"]


class GMAXParams(BaseModel):
    """Knobs of GMAX; defaults follow the paper where it states a value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    goodput: str = Field(
        "token", description="goodput function the priorities estimate (slo_core.gain names; unitless)"
    )
    gain: GainParams = Field(default_factory=GainParams, description="weights of the goodput functions")
    length_source: LengthSource = Field(
        "analyzer",
        description="remaining-length estimate: 'analyzer' = RequestView.output_bound (fallback below when "
        "unset), 'oracle' = true_output_tokens, 'mean' = mean_output_tokens (the no-analyzer ablation)",
    )
    ordering: Ordering = Field(
        "gmax", description="'gmax' = cutoff + length window (Algorithm 1); 'sjf' = shortest bound first"
    )
    feasibility: Feasibility = Field(
        "probabilistic",
        description="how a deadline/compound request's chance of finishing in time scales its goodput: "
        "'bound' = yes/no on the analyzer's bound (JITServe Appendix B); 'probabilistic' = P(true length "
        "fits the time left) under a log-normal whose bound_quantile is the bound (a compound stage: the "
        "product over its calls)",
    )
    compound_deadline: CompoundDeadline = Field(
        "program",
        description="deadline a compound call's feasibility and value are judged against: 'program' = its "
        "program's end-to-end deadline (the only one the goodput functions pay for), 'stage' = the "
        "analyzer's stage sub-deadline (JITServe §4.1)",
    )
    program_rest: bool = Field(
        True,
        description="under the 'request' and 'token' goodputs (both pay a program once, at its end) a "
        "compound call's priority divides its program's value by the program's remaining work (this "
        "stage and the time the analyzer reserved for later stages), not by this stage's alone",
    )
    bound_quantile: float = Field(
        0.95, gt=0.5, lt=1, description="quantile the analyzer's output bound stands for (fraction)"
    )
    length_sigma: float = Field(
        0.45,
        gt=0,
        description="log-normal spread σ of a true output length around its bound (unitless; "
        "0.45 ≈ the shipped forest's median q95-bound/true ratio of ~2)",
    )
    bound_reading: BoundReadingMode = Field(
        "learned",
        description="how the feasibility test reads the analyzer's bound (gmax_bound): 'static' = as its "
        "bound_quantile for every request; 'learned' = per request kind, where the bounds of the requests "
        "that finished sat above their true lengths (never below the bound_quantile's z)",
    )
    calibrate_bound: bool = Field(
        True,
        description="with the learned reading, scale each analyzer bound to where the static reading would "
        "put it (bound·exp(−(z_kind − z_static)·σ)) and use that bound for every estimate (t_gen, value, "
        "pace budget, feasibility at the static z); False: only the feasibility test reads the learned z "
        "(measured: Tree-of-Thoughts x2 token goodput at overload 0.9045 → 0.9299, bench/results/gmax/"
        "issue15/README.md, thirteenth pass)",
    )
    bound_window: int = Field(
        200, ge=1, description="finished requests per kind the learned reading keeps (requests)"
    )
    bound_min_samples: int = Field(
        20, ge=1, description="finished requests of a kind before its learned reading replaces the static one"
    )
    bound_z_cap: float = Field(
        6.0, gt=0, description="most standard deviations a learned reading puts the bound above the median"
    )
    fallback_output_tokens: int = Field(
        1024, ge=1, description="output-length bound (tokens) used when the analyzer set none"
    )
    refine_every_tokens: int = Field(
        50, ge=1, description="when generation passes a fallback/mean bound, it grows by this many tokens"
    )
    mean_output_tokens: float = Field(
        300.0, gt=0, description="mean response length (tokens) of the no-analyzer ablation"
    )
    frame_steps: int = Field(50, ge=1, description="Δ: engine steps per scheduling frame (§4.2)")
    deep_queue_from: int = Field(
        512,
        ge=0,
        description="from this many waiting requests on, engines take arrivals and finishes only every "
        "deep_queue_every steps, a latency arrival at once (0: at every one). On by default: in a pod "
        "a decision over thousands of requests delays the engine's step by milliseconds (the plugin "
        "subclasses vLLM's synchronous Scheduler); charged that cost, GMAX with the rule leads GMAX "
        "at every ToT overload point measured (bench/decision_cost.py)",
    )
    deep_queue_every: int = Field(
        10, ge=1, description="engine steps between event decisions over a deep queue (deep_queue_from)"
    )
    p_initial: float = Field(0.95, gt=0, le=1, description="initial priority cutoff p (unitless, 0 < p ≤ 1)")
    p_candidates: tuple[float, ...] = Field(
        (0.5, 0.7, 0.8, 0.9, 0.95, 1.0), description="cutoffs the online tuner explores (unitless)"
    )
    tune_p: bool = Field(True, description="tune p online from observed goodput (§4.2)")
    tune_epoch_s: float = Field(30.0, gt=0, description="engine-clock seconds each tried cutoff runs")
    tune_explore: float = Field(
        0.2, ge=0, le=1, description="initial probability of exploring a non-best cutoff (decays)"
    )
    delta_per_frame: float = Field(
        1.0,
        ge=0,
        description="δ: goodput added per frame spent waiting (tokens; under the 'request' goodput δ tokens' "
        "share of the request, δ/(prompt + bound))",
    )
    calm_delta_per_frame: float | None = Field(
        50.0,
        ge=0,
        description="δ while the engine is calm: it has dropped no waiting request (past its deadline) for "
        "calm_window_s (only under the hard-deadline goodputs with reject_past_deadline, whose drops are "
        "the signal); None = delta_per_frame always. A strong guard starts wide compound stages the "
        "density order leaves last in slot-bound bursts, which cost triage at overload "
        "(bench/results/gmax/issue15/fourteenth_screens); 50 at all 36 point-objectives "
        "(bench/results/standard_sweep/issue15_calm_300s)",
    )
    calm_window_s: float = Field(
        30.0, gt=0, description="seconds without a drop after which the engine counts as calm"
    )
    best_effort_deadline_s: float = Field(
        DEFAULT_BEST_EFFORT_DEADLINE_S, gt=0, description="default deadline (s) of best-effort requests"
    )
    fairness: float = Field(0.0, ge=0, le=1, description="f in (1−f)·priority + f·Fair (unitless)")
    fairness_half_life_s: float = Field(
        300.0, gt=0, description="half-life (s) of the per-tenant attained service behind Fair"
    )
    preemption: bool = Field(True, description="allow cost-aware preemption at frame boundaries")
    preempt_min_ratio: float = Field(
        1.0, ge=1, description="a preemptor's priority must exceed the victim's by this factor (unitless)"
    )
    preempt_horizon_frames: float = Field(
        2.0, gt=0, description="frames over which a swap's priority gain is counted against its stall"
    )
    reject_past_deadline: bool = Field(
        True,
        description="drop waiting deadline/compound requests whose (program) deadline passed; only with "
        "hard-deadline goodputs ('token', 'request')",
    )
    max_wait_s: float | None = Field(
        None, gt=0, description="drop requests not started within this many seconds (JITServe §5); None = off"
    )
    pace_budget: bool = Field(
        True,
        description="cap the tokens per engine step so the running requests keep the pace they need "
        "(gmax_budget); False: the engine's max_num_batched_tokens every step",
    )
    pace_quantile: float = Field(
        0.15,
        ge=0,
        lt=1,
        description="the step must keep the pace of this quantile of the running requests' needed paces "
        "(fraction; 0 = the most pressed request)",
    )
    pace_safety: float = Field(
        0.9, gt=0, le=1, description="share of the needed pace the step may use (fraction)"
    )
    min_prefill_tokens: int = Field(
        256, ge=1, description="prefill tokens per step the pace cap always leaves (tokens)"
    )
    demand_floor: bool = Field(
        True,
        description="raise the pace cap to the prefill rate that starts every waiting deadline/compound "
        "request by its latest start, when the engine's budget can hold that rate (gmax_budget; not under "
        "the 'request' goodput)",
    )
    demand_pace_quantile: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="the demand floor never makes a step slower than the pace this quantile of the running "
        "requests needs (fraction, ≥ pace_quantile)",
    )
    latency_lane: bool = Field(
        True,
        description="while the pace cap holds, admit latency requests whose first token is still due ahead "
        "of the others and prefill them outside the cap",
    )
    lane_max_tokens: int = Field(
        8192, ge=0, description="at most this many prompt tokens enter the latency lane per decision (tokens)"
    )
    default_step_s: float = Field(
        0.03, gt=0, description="decode-step time (s) assumed when the engine has no performance profile"
    )
    default_prefill_tokens_per_s: float = Field(
        8000.0, gt=0, description="prefill speed (tokens/s) assumed when the engine has no profile"
    )
    correct_step_time: bool = Field(
        True, description="scale the modelled step time by the measured engine step time (momentum 0.9)"
    )

    @field_validator("goodput")
    @classmethod
    def _known_goodput(cls, value: str) -> str:
        if value not in GOODPUT_FUNCTIONS:
            raise ValueError(
                f"unknown goodput {value!r}; choose one of: {', '.join(sorted(GOODPUT_FUNCTIONS))}"
            )
        return value

    @property
    def drops_past_deadline(self) -> bool:
        """Whether GMAX drops waiting deadline/compound requests whose (program) deadline passed:
        ``reject_past_deadline`` under a hard-deadline goodput ('token', 'request'), which no late
        completion pays."""
        return self.reject_past_deadline and self.goodput in ("token", "request")

    @model_validator(mode="after")
    def _candidates_valid(self) -> GMAXParams:
        if not self.p_candidates:
            raise ValueError("p_candidates needs at least one cutoff")
        bad = [p for p in self.p_candidates if not 0 < p <= 1]
        if bad:
            raise ValueError(f"every cutoff must lie in (0, 1], got {bad}")
        if self.bound_min_samples > self.bound_window:
            raise ValueError(
                f"bound_min_samples ({self.bound_min_samples}) above bound_window ({self.bound_window}): "
                "the learned reading could never start"
            )
        return self
