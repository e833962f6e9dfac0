"""Fixtures of the release tests: the synthetic population and the release of 001 sec. 7."""

from __future__ import annotations

import pytest

from veil.release import PramRelease, release_pram, synthetic_population

KEYS = ["age", "sex", "race", "marital", "area"]
# 001 sec. 7's partition: sex kept, seven age groups, race White / Black / other.
PARTITION = "sex;age=0-17,18-24,25-34,35-44,45-54,55-64,65-;race=White,Black,*"
XI = 0.395


@pytest.fixture(scope="session")
def population() -> dict:
    return synthetic_population()  # 60,000 persons, seed 2016


@pytest.fixture(scope="session")
def paper_release(population) -> PramRelease:
    return release_pram(population, KEYS, partition=PARTITION, xi=XI, rng=7)
