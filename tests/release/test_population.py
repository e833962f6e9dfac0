"""The synthetic population of docs/release-example.md and the tests."""

from __future__ import annotations

import numpy as np
import pytest

from veil.release import ReleaseError, synthetic_population

KEYS = ["age", "sex", "race", "marital", "area"]


def test_shape_skew_and_reproducibility(population):
    assert list(population) == ["sex", "age", "race", "marital", "area", "education", "work", "smoker", "insured"]
    assert all(col.size == 60_000 for col in population.values())
    assert np.unique(population["age"]).size == 91 and np.unique(population["area"]).size == 44
    assert set(population["smoker"]) == set(population["insured"]) == {"0", "1"}
    codes = np.stack([np.unique(population[k], return_inverse=True)[1] for k in KEYS], axis=1)
    _, counts = np.unique(codes, axis=0, return_counts=True)
    # Like 001's data (59,033 persons: 25,406 non-empty cells, 13,662 singletons, 4,777 doubletons).
    assert 20_000 < counts.size < 32_000 and np.sum(counts == 1) > 10_000 and np.sum(counts == 2) > 3_000
    assert np.count_nonzero(population["race"] == "Alaska Native") == 1
    children = population["age"].astype(int) < 15
    assert set(population["marital"][children]) == {"never married"}
    again = synthetic_population()
    assert all(np.array_equal(again[c], population[c]) for c in population)
    other = synthetic_population(rng=1)
    assert not np.array_equal(other["age"], population["age"])


def test_size_is_checked():
    assert synthetic_population(500)["sex"].size == 500
    with pytest.raises(ReleaseError, match="records must be a positive whole number"):
        synthetic_population(0)
