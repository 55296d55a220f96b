from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoundState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_STATE_UNSPECIFIED: _ClassVar[RoundState]
    ROUND_STATE_OPEN: _ClassVar[RoundState]
    ROUND_STATE_COLLECTING: _ClassVar[RoundState]
    ROUND_STATE_DECODING: _ClassVar[RoundState]
    ROUND_STATE_DONE: _ClassVar[RoundState]
    ROUND_STATE_FAILED: _ClassVar[RoundState]
ROUND_STATE_UNSPECIFIED: RoundState
ROUND_STATE_OPEN: RoundState
ROUND_STATE_COLLECTING: RoundState
ROUND_STATE_DECODING: RoundState
ROUND_STATE_DONE: RoundState
ROUND_STATE_FAILED: RoundState

class JoinRequest(_message.Message):
    __slots__ = ("client_id", "d", "job")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    D_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    d: int
    job: str
    def __init__(self, client_id: _Optional[str] = ..., d: _Optional[int] = ..., job: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("client_index", "n", "task", "data_hint", "task_params")
    class TaskParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DATA_HINT_FIELD_NUMBER: _ClassVar[int]
    TASK_PARAMS_FIELD_NUMBER: _ClassVar[int]
    client_index: int
    n: int
    task: str
    data_hint: str
    task_params: _containers.ScalarMap[str, float]
    def __init__(self, client_index: _Optional[int] = ..., n: _Optional[int] = ..., task: _Optional[str] = ..., data_hint: _Optional[str] = ..., task_params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetRoundRequest(_message.Message):
    __slots__ = ("client_id", "job")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    job: str
    def __init__(self, client_id: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "float64_le")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FLOAT64_LE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    float64_le: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., float64_le: _Optional[bytes] = ...) -> None: ...

class RoundInfo(_message.Message):
    __slots__ = ("round_id", "nonce", "scheme", "n", "k", "d", "transform", "task", "m", "global_state", "state", "deadline_unix_ms", "eval", "job_done", "task_step", "total_rounds", "job_failure", "job_id", "spec_version", "projection", "block_size", "value_bits", "bits")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    D_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    JOB_DONE_FIELD_NUMBER: _ClassVar[int]
    TASK_STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    JOB_FAILURE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROJECTION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    VALUE_BITS_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    nonce: int
    scheme: str
    n: int
    k: int
    d: int
    transform: str
    task: str
    m: int
    global_state: Tensor
    state: RoundState
    deadline_unix_ms: int
    eval: bool
    job_done: bool
    task_step: int
    total_rounds: int
    job_failure: str
    job_id: int
    spec_version: str
    projection: str
    block_size: int
    value_bits: int
    bits: int
    def __init__(self, round_id: _Optional[int] = ..., nonce: _Optional[int] = ..., scheme: _Optional[str] = ..., n: _Optional[int] = ..., k: _Optional[int] = ..., d: _Optional[int] = ..., transform: _Optional[str] = ..., task: _Optional[str] = ..., m: _Optional[int] = ..., global_state: _Optional[_Union[Tensor, _Mapping]] = ..., state: _Optional[_Union[RoundState, str]] = ..., deadline_unix_ms: _Optional[int] = ..., eval: _Optional[bool] = ..., job_done: _Optional[bool] = ..., task_step: _Optional[int] = ..., total_rounds: _Optional[int] = ..., job_failure: _Optional[str] = ..., job_id: _Optional[int] = ..., spec_version: _Optional[str] = ..., projection: _Optional[str] = ..., block_size: _Optional[int] = ..., value_bits: _Optional[int] = ..., bits: _Optional[int] = ...) -> None: ...

class Vector(_message.Message):
    __slots__ = ("values_f32", "indices_i32", "reference_f64", "values_packed", "value_bits", "value_count", "scale", "scales_f32")
    VALUES_F32_FIELD_NUMBER: _ClassVar[int]
    INDICES_I32_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_F64_FIELD_NUMBER: _ClassVar[int]
    VALUES_PACKED_FIELD_NUMBER: _ClassVar[int]
    VALUE_BITS_FIELD_NUMBER: _ClassVar[int]
    VALUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SCALES_F32_FIELD_NUMBER: _ClassVar[int]
    values_f32: bytes
    indices_i32: bytes
    reference_f64: bytes
    values_packed: bytes
    value_bits: int
    value_count: int
    scale: float
    scales_f32: bytes
    def __init__(self, values_f32: _Optional[bytes] = ..., indices_i32: _Optional[bytes] = ..., reference_f64: _Optional[bytes] = ..., values_packed: _Optional[bytes] = ..., value_bits: _Optional[int] = ..., value_count: _Optional[int] = ..., scale: _Optional[float] = ..., scales_f32: _Optional[bytes] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("round_id", "client_id", "client_seed", "vectors", "spec_version", "job")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEED_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    SPEC_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    client_id: str
    client_seed: int
    vectors: _containers.RepeatedCompositeFieldContainer[Vector]
    spec_version: str
    job: str
    def __init__(self, round_id: _Optional[int] = ..., client_id: _Optional[str] = ..., client_seed: _Optional[int] = ..., vectors: _Optional[_Iterable[_Union[Vector, _Mapping]]] = ..., spec_version: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("round_id", "received", "duplicate")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    received: int
    duplicate: bool
    def __init__(self, round_id: _Optional[int] = ..., received: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GetResultRequest(_message.Message):
    __slots__ = ("round_id", "wait", "client_id", "job")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    wait: bool
    client_id: str
    job: str
    def __init__(self, round_id: _Optional[int] = ..., wait: _Optional[bool] = ..., client_id: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class Contributor(_message.Message):
    __slots__ = ("client_id", "client_seed")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEED_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    client_seed: int
    def __init__(self, client_id: _Optional[str] = ..., client_seed: _Optional[int] = ...) -> None: ...

class RoundResult(_message.Message):
    __slots__ = ("round_id", "state", "reason", "estimate", "global_state", "n_prime", "beta", "c", "decode_seconds", "contributors", "r_hat", "eval_sq_error", "eval_sq_error_rand_k", "eval_sq_error_rand_k_spatial", "job_done", "nonce", "transform", "payload_bytes", "wire_bytes", "est_sq_error", "est_sq_error_stderr", "est_mean_sq_norm", "est_relative_error")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STATE_FIELD_NUMBER: _ClassVar[int]
    N_PRIME_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    C_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    R_HAT_FIELD_NUMBER: _ClassVar[int]
    EVAL_SQ_ERROR_FIELD_NUMBER: _ClassVar[int]
    EVAL_SQ_ERROR_RAND_K_FIELD_NUMBER: _ClassVar[int]
    EVAL_SQ_ERROR_RAND_K_SPATIAL_FIELD_NUMBER: _ClassVar[int]
    JOB_DONE_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EST_SQ_ERROR_FIELD_NUMBER: _ClassVar[int]
    EST_SQ_ERROR_STDERR_FIELD_NUMBER: _ClassVar[int]
    EST_MEAN_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    EST_RELATIVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    state: RoundState
    reason: str
    estimate: Tensor
    global_state: Tensor
    n_prime: int
    beta: float
    c: float
    decode_seconds: float
    contributors: _containers.RepeatedCompositeFieldContainer[Contributor]
    r_hat: float
    eval_sq_error: float
    eval_sq_error_rand_k: float
    eval_sq_error_rand_k_spatial: float
    job_done: bool
    nonce: int
    transform: str
    payload_bytes: int
    wire_bytes: int
    est_sq_error: float
    est_sq_error_stderr: float
    est_mean_sq_norm: float
    est_relative_error: float
    def __init__(self, round_id: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ..., reason: _Optional[str] = ..., estimate: _Optional[_Union[Tensor, _Mapping]] = ..., global_state: _Optional[_Union[Tensor, _Mapping]] = ..., n_prime: _Optional[int] = ..., beta: _Optional[float] = ..., c: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., contributors: _Optional[_Iterable[_Union[Contributor, _Mapping]]] = ..., r_hat: _Optional[float] = ..., eval_sq_error: _Optional[float] = ..., eval_sq_error_rand_k: _Optional[float] = ..., eval_sq_error_rand_k_spatial: _Optional[float] = ..., job_done: _Optional[bool] = ..., nonce: _Optional[int] = ..., transform: _Optional[str] = ..., payload_bytes: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., est_sq_error: _Optional[float] = ..., est_sq_error_stderr: _Optional[float] = ..., est_mean_sq_norm: _Optional[float] = ..., est_relative_error: _Optional[float] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("client_id", "job")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    job: str
    def __init__(self, client_id: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class RoundEvent(_message.Message):
    __slots__ = ("round_id", "state", "reason", "job_done", "received", "est_sq_error", "est_sq_error_stderr", "est_mean_sq_norm", "est_relative_error")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_DONE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    EST_SQ_ERROR_FIELD_NUMBER: _ClassVar[int]
    EST_SQ_ERROR_STDERR_FIELD_NUMBER: _ClassVar[int]
    EST_MEAN_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    EST_RELATIVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    state: RoundState
    reason: str
    job_done: bool
    received: int
    est_sq_error: float
    est_sq_error_stderr: float
    est_mean_sq_norm: float
    est_relative_error: float
    def __init__(self, round_id: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ..., reason: _Optional[str] = ..., job_done: _Optional[bool] = ..., received: _Optional[int] = ..., est_sq_error: _Optional[float] = ..., est_sq_error_stderr: _Optional[float] = ..., est_mean_sq_norm: _Optional[float] = ..., est_relative_error: _Optional[float] = ...) -> None: ...
