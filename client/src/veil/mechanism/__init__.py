"""veil.mechanism: the mathematics of on-device randomization (standard library only).

Specs for every mechanism Veil supports and the registry of their wire shapes (MECHANISMS,
register: how each travels and is drawn, read by the SDK and the aggregator alike), one-report
randomization from an injected random source (the OS CSPRNG by default), exact transition
matrices for small k, the privacy calculus, the exact risk of each mechanism's minimax
estimator, and numeric metrics (a number's category in each part, the mean part's exact
variance). The SDK embeds this package; the aggregator's estimators read their coefficients
from it.
"""

from ._epsilon import EPSILON_RANGE, check_epsilon, epsilon_to_gamma, gamma_to_epsilon
from ._errors import MechanismError
from ._law import PROJECTION_NOTE, LinearEstimator, WeightLaw
from ._metric import DEFAULT_MECHANISM, DEFAULT_PERIOD, MAX_PERIOD, MetricSpec, parse_duration, spec_for
from ._numeric import (
    DEFAULT_MEAN_SHARE,
    DISTRIBUTION,
    MAX_LEVELS,
    MEAN,
    PARTS,
    NumericSpec,
    checked_number,
    mean_levels,
    mean_variance,
    number_text,
    numeric_parts,
    part_name,
    worst_mean_variance,
)
from ._privacy import (
    is_admissible,
    parity,
    posterior_bounds,
    rho_gamma,
    row_parity,
    transition_matrix,
)
from ._random import RandomSource, SeededRandomSource, SystemRandomSource, WordRandomSource
from ._rappor import AdmissibleRapporSpec, RapporSpec
from ._specs import KrrSpec, MechanismSpec, SubsetSpec, WarnerSpec, minimax_q, subset_gain, subset_objective
from ._strings import (
    CODE_BYTES,
    DEFAULT_SURVIVORS,
    HASHED,
    MODULUS,
    REPORT_WORDS,
    ROUNDS,
    HashedSpec,
    StringsRound,
    buckets_for,
    code_text,
    prefix_hash,
    round_name,
    string_code,
)
from ._wire import (
    BITMAPS,
    INDEX_SETS,
    MECHANISMS,
    SAMPLERS,
    WireShape,
    encoding,
    encodings,
    max_report_bytes,
    register,
    report_bytes,
    wire_shape,
    wire_shape_of,
)

__all__ = [
    "MechanismError",
    "MechanismSpec",
    "SubsetSpec",
    "KrrSpec",
    "WarnerSpec",
    "RapporSpec",
    "AdmissibleRapporSpec",
    "MetricSpec",
    "NumericSpec",
    "MEAN",
    "DISTRIBUTION",
    "PARTS",
    "MAX_LEVELS",
    "part_name",
    "mean_levels",
    "mean_variance",
    "worst_mean_variance",
    "checked_number",
    "number_text",
    "numeric_parts",
    "DEFAULT_MEAN_SHARE",
    "HashedSpec",
    "StringsRound",
    "HASHED",
    "DEFAULT_SURVIVORS",
    "CODE_BYTES",
    "ROUNDS",
    "MODULUS",
    "REPORT_WORDS",
    "string_code",
    "code_text",
    "round_name",
    "buckets_for",
    "prefix_hash",
    "MECHANISMS",
    "WireShape",
    "register",
    "wire_shape",
    "wire_shape_of",
    "SAMPLERS",
    "INDEX_SETS",
    "BITMAPS",
    "encodings",
    "encoding",
    "report_bytes",
    "max_report_bytes",
    "DEFAULT_MECHANISM",
    "DEFAULT_PERIOD",
    "MAX_PERIOD",
    "spec_for",
    "parse_duration",
    "minimax_q",
    "subset_objective",
    "subset_gain",
    "LinearEstimator",
    "PROJECTION_NOTE",
    "WeightLaw",
    "RandomSource",
    "SystemRandomSource",
    "SeededRandomSource",
    "WordRandomSource",
    "EPSILON_RANGE",
    "check_epsilon",
    "epsilon_to_gamma",
    "gamma_to_epsilon",
    "posterior_bounds",
    "rho_gamma",
    "row_parity",
    "parity",
    "is_admissible",
    "transition_matrix",
]
