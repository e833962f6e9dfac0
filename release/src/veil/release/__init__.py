"""veil.release: release microdata you already hold, so no one can be re-identified (numpy).

Three methods, each with the formulas to check it on your own data:

- Post-randomization with guaranteed identification-risk control (Nayak, Zhang & You; papers
  001 and 000 sec. 5): inverse-frequency PRAM (IFPR) in blocks of rare key cells, the risk
  calculus psi / h / theta_0 / theta_* / m_0, the 4-step procedure on a table, the variance it
  adds, and the empirical correct-match probabilities of a release.
- epsilon-DP PRAM (paper 004): keep-probabilities that maximise the mutual information between
  true and released values under epsilon-differential privacy, and the MLE of the distribution.
- Warner masking of binary attributes (paper 002): unbiased proportions, variances, covariances
  and correlations, with the response population drawn with or without replacement.

Randomness: every release takes ``rng`` (a numpy Generator, a seed, or None for a fresh
generator seeded from the OS CSPRNG). A seed replays the release: treat it as a secret.
"""

from ._assess import (
    CorrectMatchTable,
    correct_match_from_cells,
    correct_match_table,
    marginal_table,
    total_variation_distance,
)
from ._dp import (
    DpPramDesign,
    DpPramRelease,
    binary_keep_probability,
    dp_parity,
    dp_pram,
    dp_pram_design,
    dp_pram_matrix,
    dp_pram_mle,
    mutual_information,
    proposition2_applies,
    proposition2_vertices,
    release_dp_pram,
    satisfies_dp,
    symmetric_keep_probability,
    vertex_candidates,
)
from ._errors import InfeasibleBlockError, PartitionError, ReleaseError, TableError
from ._example import synthetic_population
from ._ifpr import ifpr, ifpr_covariance, ifpr_matrix, ifpr_sample, ifpr_subset_variance, ifpr_total_variance
from ._partition import KEEP, Partition
from ._procedure import PramRelease, release_pram
from ._random import make_rng
from ._risk import (
    block_match_risks,
    goal_min_block_cells,
    goal_theta,
    goal_xi,
    h,
    min_block_size,
    no_match_bounds,
    no_match_probability,
    psi,
    theta_star,
    theta_zero,
)
from ._table import Table, as_table, read_csv, write_csv
from ._warner import (
    Masking,
    MaskRelease,
    masked_correlation,
    masked_covariance,
    masked_joint,
    masked_variance,
    masking_variance,
    release_mask,
    warner_covariance,
    warner_estimator_correlation,
    warner_mask,
    warner_proportion,
    warner_variance,
)

__all__ = [
    "ReleaseError",
    "TableError",
    "PartitionError",
    "InfeasibleBlockError",
    "Table",
    "as_table",
    "read_csv",
    "write_csv",
    "make_rng",
    "psi",
    "h",
    "theta_star",
    "theta_zero",
    "min_block_size",
    "goal_theta",
    "goal_xi",
    "goal_min_block_cells",
    "block_match_risks",
    "no_match_probability",
    "no_match_bounds",
    "ifpr",
    "ifpr_matrix",
    "ifpr_sample",
    "ifpr_covariance",
    "ifpr_total_variance",
    "ifpr_subset_variance",
    "Partition",
    "KEEP",
    "PramRelease",
    "release_pram",
    "CorrectMatchTable",
    "correct_match_table",
    "correct_match_from_cells",
    "marginal_table",
    "total_variation_distance",
    "dp_pram_matrix",
    "dp_parity",
    "satisfies_dp",
    "mutual_information",
    "binary_keep_probability",
    "symmetric_keep_probability",
    "proposition2_applies",
    "proposition2_vertices",
    "vertex_candidates",
    "DpPramDesign",
    "dp_pram_design",
    "dp_pram",
    "dp_pram_mle",
    "DpPramRelease",
    "release_dp_pram",
    "Masking",
    "warner_mask",
    "warner_proportion",
    "warner_variance",
    "warner_covariance",
    "warner_estimator_correlation",
    "masked_joint",
    "masked_covariance",
    "masked_variance",
    "masked_correlation",
    "masking_variance",
    "MaskRelease",
    "release_mask",
    "synthetic_population",
]
