from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SloOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SLO_OUTCOME_UNSPECIFIED: _ClassVar[SloOutcome]
    SLO_OUTCOME_MET: _ClassVar[SloOutcome]
    SLO_OUTCOME_MISSED: _ClassVar[SloOutcome]
    SLO_OUTCOME_REJECTED: _ClassVar[SloOutcome]
SLO_OUTCOME_UNSPECIFIED: SloOutcome
SLO_OUTCOME_MET: SloOutcome
SLO_OUTCOME_MISSED: SloOutcome
SLO_OUTCOME_REJECTED: SloOutcome

class BoundsRequest(_message.Message):
    __slots__ = ("request_keys",)
    REQUEST_KEYS_FIELD_NUMBER: _ClassVar[int]
    request_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestBound(_message.Message):
    __slots__ = ("request_key", "output_bound", "priority", "deadline_unix_s")
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BOUND_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    request_key: str
    output_bound: int
    priority: float
    deadline_unix_s: float
    def __init__(self, request_key: _Optional[str] = ..., output_bound: _Optional[int] = ..., priority: _Optional[float] = ..., deadline_unix_s: _Optional[float] = ...) -> None: ...

class BoundsReply(_message.Message):
    __slots__ = ("bounds", "generated_unix_s")
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    bounds: _containers.RepeatedCompositeFieldContainer[RequestBound]
    generated_unix_s: float
    def __init__(self, bounds: _Optional[_Iterable[_Union[RequestBound, _Mapping]]] = ..., generated_unix_s: _Optional[float] = ...) -> None: ...

class EngineRequest(_message.Message):
    __slots__ = ("request_key", "phase", "prompt_tokens", "generated_tokens", "max_tokens", "arrival_unix_s", "kind", "tier", "priority_weight", "ttft_s", "tbt_s", "deadline_s", "deadline_unix_s", "tenant", "program_id", "stage", "output_bound", "first_token_unix_s", "stages", "program_start_unix_s")
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TBT_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BOUND_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    request_key: str
    phase: str
    prompt_tokens: int
    generated_tokens: int
    max_tokens: int
    arrival_unix_s: float
    kind: str
    tier: str
    priority_weight: float
    ttft_s: float
    tbt_s: float
    deadline_s: float
    deadline_unix_s: float
    tenant: str
    program_id: str
    stage: int
    output_bound: int
    first_token_unix_s: float
    stages: int
    program_start_unix_s: float
    def __init__(self, request_key: _Optional[str] = ..., phase: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., arrival_unix_s: _Optional[float] = ..., kind: _Optional[str] = ..., tier: _Optional[str] = ..., priority_weight: _Optional[float] = ..., ttft_s: _Optional[float] = ..., tbt_s: _Optional[float] = ..., deadline_s: _Optional[float] = ..., deadline_unix_s: _Optional[float] = ..., tenant: _Optional[str] = ..., program_id: _Optional[str] = ..., stage: _Optional[int] = ..., output_bound: _Optional[int] = ..., first_token_unix_s: _Optional[float] = ..., stages: _Optional[int] = ..., program_start_unix_s: _Optional[float] = ...) -> None: ...

class FinishedRequest(_message.Message):
    __slots__ = ("request_key", "generated_tokens", "finish_reason", "tier", "outcome", "prompt_tokens")
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_key: str
    generated_tokens: int
    finish_reason: str
    tier: str
    outcome: SloOutcome
    prompt_tokens: int
    def __init__(self, request_key: _Optional[str] = ..., generated_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., tier: _Optional[str] = ..., outcome: _Optional[_Union[SloOutcome, str]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class EngineReport(_message.Message):
    __slots__ = ("snapshot_unix_s", "step", "waiting", "running", "kv_usage", "kv_cache_tokens", "requests", "finished", "policy", "degraded_reason", "max_model_len", "models")
    SNAPSHOT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_REASON_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    snapshot_unix_s: float
    step: int
    waiting: int
    running: int
    kv_usage: float
    kv_cache_tokens: int
    requests: _containers.RepeatedCompositeFieldContainer[EngineRequest]
    finished: _containers.RepeatedCompositeFieldContainer[FinishedRequest]
    policy: str
    degraded_reason: str
    max_model_len: int
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, snapshot_unix_s: _Optional[float] = ..., step: _Optional[int] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., kv_cache_tokens: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[EngineRequest, _Mapping]]] = ..., finished: _Optional[_Iterable[_Union[FinishedRequest, _Mapping]]] = ..., policy: _Optional[str] = ..., degraded_reason: _Optional[str] = ..., max_model_len: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestState(_message.Message):
    __slots__ = ("request_id", "kind", "tier", "priority_weight", "phase", "prompt_tokens", "generated_tokens", "output_bound", "deadline_unix_s", "arrival_unix_s", "ttft_s", "tbt_s", "program_id", "stage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BOUND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TBT_S_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: str
    tier: str
    priority_weight: float
    phase: str
    prompt_tokens: int
    generated_tokens: int
    output_bound: int
    deadline_unix_s: float
    arrival_unix_s: float
    ttft_s: float
    tbt_s: float
    program_id: str
    stage: int
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[str] = ..., tier: _Optional[str] = ..., priority_weight: _Optional[float] = ..., phase: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., output_bound: _Optional[int] = ..., deadline_unix_s: _Optional[float] = ..., arrival_unix_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., tbt_s: _Optional[float] = ..., program_id: _Optional[str] = ..., stage: _Optional[int] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("models", "max_context_tokens", "gpu_class", "lora_adapters")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GPU_CLASS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    max_context_tokens: int
    gpu_class: str
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, models: _Optional[_Iterable[str]] = ..., max_context_tokens: _Optional[int] = ..., gpu_class: _Optional[str] = ..., lora_adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class PodState(_message.Message):
    __slots__ = ("pod", "snapshot_unix_s", "healthy", "draining", "waiting", "running", "kv_usage", "kv_cache_tokens", "outstanding_tokens", "profile", "engine_policy", "capabilities", "requests", "step_time_correction")
    POD_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_POLICY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    pod: str
    snapshot_unix_s: float
    healthy: bool
    draining: bool
    waiting: int
    running: int
    kv_usage: float
    kv_cache_tokens: int
    outstanding_tokens: int
    profile: str
    engine_policy: str
    capabilities: Capabilities
    requests: _containers.RepeatedCompositeFieldContainer[RequestState]
    step_time_correction: float
    def __init__(self, pod: _Optional[str] = ..., snapshot_unix_s: _Optional[float] = ..., healthy: _Optional[bool] = ..., draining: _Optional[bool] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., kv_cache_tokens: _Optional[int] = ..., outstanding_tokens: _Optional[int] = ..., profile: _Optional[str] = ..., engine_policy: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., requests: _Optional[_Iterable[_Union[RequestState, _Mapping]]] = ..., step_time_correction: _Optional[float] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("interval_ms", "aggregate_only")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    aggregate_only: bool
    def __init__(self, interval_ms: _Optional[int] = ..., aggregate_only: _Optional[bool] = ...) -> None: ...
