"""Fixtures of the release tests: the synthetic population and the release of 001 sec. 7."""

from __future__ import annotations

import pytest
from pram_paper import KEYS, PARTITION, XI

from veil.release import PramRelease, release_pram, synthetic_population


@pytest.fixture(scope="session")
def population() -> dict:
    return synthetic_population()  # 60,000 persons, seed 2016


@pytest.fixture(scope="session")
def paper_release(population) -> PramRelease:
    return release_pram(population, KEYS, partition=PARTITION, xi=XI, rng=7)
