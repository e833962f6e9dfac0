from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mechanism(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MECHANISM_UNSPECIFIED: _ClassVar[Mechanism]
    SUBSET: _ClassVar[Mechanism]
    RAPPOR: _ClassVar[Mechanism]
    RAPPOR_ADMISSIBLE: _ClassVar[Mechanism]
    KRR: _ClassVar[Mechanism]
    WARNER: _ClassVar[Mechanism]
    HASHED: _ClassVar[Mechanism]

class NumericPart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NUMERIC_PART_UNSPECIFIED: _ClassVar[NumericPart]
    NUMERIC_MEAN: _ClassVar[NumericPart]
    NUMERIC_DISTRIBUTION: _ClassVar[NumericPart]
MECHANISM_UNSPECIFIED: Mechanism
SUBSET: Mechanism
RAPPOR: Mechanism
RAPPOR_ADMISSIBLE: Mechanism
KRR: Mechanism
WARNER: Mechanism
HASHED: Mechanism
NUMERIC_PART_UNSPECIFIED: NumericPart
NUMERIC_MEAN: NumericPart
NUMERIC_DISTRIBUTION: NumericPart

class MetricSpec(_message.Message):
    __slots__ = ("name", "labels", "mechanism", "epsilon", "q", "fingerprint", "period_seconds", "reports_per_period", "period_budget", "lifetime_budget", "time_resolution_seconds", "numeric", "strings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_PERIOD_FIELD_NUMBER: _ClassVar[int]
    PERIOD_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LIFETIME_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TIME_RESOLUTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUMERIC_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    mechanism: Mechanism
    epsilon: float
    q: int
    fingerprint: str
    period_seconds: int
    reports_per_period: int
    period_budget: float
    lifetime_budget: float
    time_resolution_seconds: int
    numeric: NumericSpec
    strings: StringsRound
    def __init__(self, name: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., mechanism: _Optional[_Union[Mechanism, str]] = ..., epsilon: _Optional[float] = ..., q: _Optional[int] = ..., fingerprint: _Optional[str] = ..., period_seconds: _Optional[int] = ..., reports_per_period: _Optional[int] = ..., period_budget: _Optional[float] = ..., lifetime_budget: _Optional[float] = ..., time_resolution_seconds: _Optional[int] = ..., numeric: _Optional[_Union[NumericSpec, _Mapping]] = ..., strings: _Optional[_Union[StringsRound, _Mapping]] = ...) -> None: ...

class StringsRound(_message.Message):
    __slots__ = ("metric", "round", "rounds", "buckets", "parents")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    round: int
    rounds: int
    buckets: int
    parents: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, metric: _Optional[str] = ..., round: _Optional[int] = ..., rounds: _Optional[int] = ..., buckets: _Optional[int] = ..., parents: _Optional[_Iterable[bytes]] = ...) -> None: ...

class NumericSpec(_message.Message):
    __slots__ = ("metric", "part", "low", "high", "boundaries", "levels")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    part: NumericPart
    low: float
    high: float
    boundaries: _containers.RepeatedScalarFieldContainer[float]
    levels: int
    def __init__(self, metric: _Optional[str] = ..., part: _Optional[_Union[NumericPart, str]] = ..., low: _Optional[float] = ..., high: _Optional[float] = ..., boundaries: _Optional[_Iterable[float]] = ..., levels: _Optional[int] = ...) -> None: ...

class GetMetricSpecsRequest(_message.Message):
    __slots__ = ("metrics", "if_version")
    METRICS_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    if_version: str
    def __init__(self, metrics: _Optional[_Iterable[str]] = ..., if_version: _Optional[str] = ...) -> None: ...

class GetMetricSpecsResponse(_message.Message):
    __slots__ = ("specs", "max_batch", "specs_version", "unchanged", "server_time_unix", "max_lateness_seconds")
    SPECS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    SPECS_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    specs: _containers.RepeatedCompositeFieldContainer[MetricSpec]
    max_batch: int
    specs_version: str
    unchanged: bool
    server_time_unix: int
    max_lateness_seconds: int
    def __init__(self, specs: _Optional[_Iterable[_Union[MetricSpec, _Mapping]]] = ..., max_batch: _Optional[int] = ..., specs_version: _Optional[str] = ..., unchanged: bool = ..., server_time_unix: _Optional[int] = ..., max_lateness_seconds: _Optional[int] = ...) -> None: ...

class IndexSets(_message.Message):
    __slots__ = ("set_size", "indices")
    SET_SIZE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    set_size: int
    indices: bytes
    def __init__(self, set_size: _Optional[int] = ..., indices: _Optional[bytes] = ...) -> None: ...

class Bitmaps(_message.Message):
    __slots__ = ("bits",)
    BITS_FIELD_NUMBER: _ClassVar[int]
    bits: bytes
    def __init__(self, bits: _Optional[bytes] = ...) -> None: ...

class HashedReports(_message.Message):
    __slots__ = ("words",)
    WORDS_FIELD_NUMBER: _ClassVar[int]
    words: bytes
    def __init__(self, words: _Optional[bytes] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("batch_id", "metric", "spec_fingerprint", "count", "index_sets", "bitmaps", "hashed", "made_unix")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_SETS_FIELD_NUMBER: _ClassVar[int]
    BITMAPS_FIELD_NUMBER: _ClassVar[int]
    HASHED_FIELD_NUMBER: _ClassVar[int]
    MADE_UNIX_FIELD_NUMBER: _ClassVar[int]
    batch_id: bytes
    metric: str
    spec_fingerprint: str
    count: int
    index_sets: IndexSets
    bitmaps: Bitmaps
    hashed: HashedReports
    made_unix: int
    def __init__(self, batch_id: _Optional[bytes] = ..., metric: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., count: _Optional[int] = ..., index_sets: _Optional[_Union[IndexSets, _Mapping]] = ..., bitmaps: _Optional[_Union[Bitmaps, _Mapping]] = ..., hashed: _Optional[_Union[HashedReports, _Mapping]] = ..., made_unix: _Optional[int] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("accepted", "duplicate", "specs_version")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SPECS_VERSION_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicate: bool
    specs_version: str
    def __init__(self, accepted: _Optional[int] = ..., duplicate: bool = ..., specs_version: _Optional[str] = ...) -> None: ...

class UploadBatchesRequest(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[UploadRequest]
    def __init__(self, batches: _Optional[_Iterable[_Union[UploadRequest, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("code", "message", "accepted", "duplicate")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    accepted: int
    duplicate: bool
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., accepted: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class UploadBatchesResponse(_message.Message):
    __slots__ = ("results", "specs_version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SPECS_VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    specs_version: str
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ..., specs_version: _Optional[str] = ...) -> None: ...

class EstimatesRequest(_message.Message):
    __slots__ = ("metric", "window", "group")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    metric: str
    window: str
    group: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metric: _Optional[str] = ..., window: _Optional[str] = ..., group: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupEstimate(_message.Message):
    __slots__ = ("labels", "estimate", "stderr", "lower", "upper")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedScalarFieldContainer[str]
    estimate: float
    stderr: float
    lower: float
    upper: float
    def __init__(self, labels: _Optional[_Iterable[str]] = ..., estimate: _Optional[float] = ..., stderr: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ...) -> None: ...

class CategoryEstimate(_message.Message):
    __slots__ = ("label", "estimate", "stderr", "lower", "upper", "projected")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    PROJECTED_FIELD_NUMBER: _ClassVar[int]
    label: str
    estimate: float
    stderr: float
    lower: float
    upper: float
    projected: float
    def __init__(self, label: _Optional[str] = ..., estimate: _Optional[float] = ..., stderr: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ..., projected: _Optional[float] = ...) -> None: ...

class WindowEstimate(_message.Message):
    __slots__ = ("metric", "window", "start_unix", "end_unix", "n", "mechanism", "epsilon", "spec_fingerprint", "withheld", "reason", "categories", "estimand", "reports_per_device", "period_seconds", "group", "provisional", "periods", "numeric", "mean", "quantiles", "strings")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    ESTIMAND_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PER_DEVICE_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    PERIODS_FIELD_NUMBER: _ClassVar[int]
    NUMERIC_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    QUANTILES_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    window: str
    start_unix: int
    end_unix: int
    n: int
    mechanism: Mechanism
    epsilon: float
    spec_fingerprint: str
    withheld: bool
    reason: str
    categories: _containers.RepeatedCompositeFieldContainer[CategoryEstimate]
    estimand: str
    reports_per_device: int
    period_seconds: int
    group: GroupEstimate
    provisional: bool
    periods: int
    numeric: NumericSpec
    mean: MeanEstimate
    quantiles: _containers.RepeatedCompositeFieldContainer[QuantileEstimate]
    strings: StringsEstimate
    def __init__(self, metric: _Optional[str] = ..., window: _Optional[str] = ..., start_unix: _Optional[int] = ..., end_unix: _Optional[int] = ..., n: _Optional[int] = ..., mechanism: _Optional[_Union[Mechanism, str]] = ..., epsilon: _Optional[float] = ..., spec_fingerprint: _Optional[str] = ..., withheld: bool = ..., reason: _Optional[str] = ..., categories: _Optional[_Iterable[_Union[CategoryEstimate, _Mapping]]] = ..., estimand: _Optional[str] = ..., reports_per_device: _Optional[int] = ..., period_seconds: _Optional[int] = ..., group: _Optional[_Union[GroupEstimate, _Mapping]] = ..., provisional: bool = ..., periods: _Optional[int] = ..., numeric: _Optional[_Union[NumericSpec, _Mapping]] = ..., mean: _Optional[_Union[MeanEstimate, _Mapping]] = ..., quantiles: _Optional[_Iterable[_Union[QuantileEstimate, _Mapping]]] = ..., strings: _Optional[_Union[StringsEstimate, _Mapping]] = ...) -> None: ...

class StringsEstimate(_message.Message):
    __slots__ = ("values", "floor", "candidates", "n")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[DiscoveredValue]
    floor: float
    candidates: int
    n: int
    def __init__(self, values: _Optional[_Iterable[_Union[DiscoveredValue, _Mapping]]] = ..., floor: _Optional[float] = ..., candidates: _Optional[int] = ..., n: _Optional[int] = ...) -> None: ...

class DiscoveredValue(_message.Message):
    __slots__ = ("code", "text", "estimate", "stderr", "lower", "upper")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    code: bytes
    text: str
    estimate: float
    stderr: float
    lower: float
    upper: float
    def __init__(self, code: _Optional[bytes] = ..., text: _Optional[str] = ..., estimate: _Optional[float] = ..., stderr: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ...) -> None: ...

class MeanEstimate(_message.Message):
    __slots__ = ("estimate", "stderr", "lower", "upper")
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    estimate: float
    stderr: float
    lower: float
    upper: float
    def __init__(self, estimate: _Optional[float] = ..., stderr: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ...) -> None: ...

class QuantileEstimate(_message.Message):
    __slots__ = ("q", "estimate", "lower", "upper")
    Q_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    q: float
    estimate: float
    lower: float
    upper: float
    def __init__(self, q: _Optional[float] = ..., estimate: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ...) -> None: ...

class SeriesRequest(_message.Message):
    __slots__ = ("metric", "window", "from_unix", "to_unix", "merged", "group")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    metric: str
    window: str
    from_unix: int
    to_unix: int
    merged: bool
    group: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metric: _Optional[str] = ..., window: _Optional[str] = ..., from_unix: _Optional[int] = ..., to_unix: _Optional[int] = ..., merged: bool = ..., group: _Optional[_Iterable[str]] = ...) -> None: ...

class SeriesResponse(_message.Message):
    __slots__ = ("estimates",)
    ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    estimates: _containers.RepeatedCompositeFieldContainer[WindowEstimate]
    def __init__(self, estimates: _Optional[_Iterable[_Union[WindowEstimate, _Mapping]]] = ...) -> None: ...

class EstimatesResponse(_message.Message):
    __slots__ = ("estimates",)
    ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    estimates: _containers.RepeatedCompositeFieldContainer[WindowEstimate]
    def __init__(self, estimates: _Optional[_Iterable[_Union[WindowEstimate, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("metric", "window", "min_interval_seconds")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    window: str
    min_interval_seconds: float
    def __init__(self, metric: _Optional[str] = ..., window: _Optional[str] = ..., min_interval_seconds: _Optional[float] = ...) -> None: ...
