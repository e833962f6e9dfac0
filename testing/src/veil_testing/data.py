"""Data generators of the statistical tests and the benchmarks."""

from __future__ import annotations

import numpy as np

__all__ = ["zipf_shares"]


def zipf_shares(k: int, exponent: float = 1.1, rng: np.random.Generator | None = None) -> np.ndarray:
    """A Zipf law over k categories: shares proportional to 1/(j+1)**exponent, as skewed as real
    telemetry often is. With rng, permuted by it, so the heaviest category is at a random index
    and an off-by-one anywhere shows."""
    shares = 1.0 / np.arange(1, k + 1) ** exponent
    shares /= shares.sum()
    return shares if rng is None else rng.permutation(shares)
