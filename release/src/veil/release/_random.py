"""Where a release's randomness comes from.

Every function that draws takes ``rng``: a numpy ``Generator``, an integer seed, or None. None
means a fresh generator seeded with 128 bits from the operating system's CSPRNG (``secrets``),
which is what a real release should use. A seed makes a release reproducible, and so it is a
secret exactly as strong as the release: whoever knows it (and the algorithm, which is public)
can replay every random decision. Never publish it, and never put it in a report.
"""

from __future__ import annotations

import secrets

import numpy as np

from ._errors import ReleaseError

__all__ = ["make_rng", "RngLike"]

RngLike = np.random.Generator | int | None


def make_rng(rng: RngLike = None) -> np.random.Generator:
    if rng is None:
        return np.random.default_rng(secrets.randbits(128))
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise ReleaseError(f"rng must be a numpy Generator, a non-negative integer seed or None, not {rng!r}.")
