"""A synthetic person-level population for examples and tests (no download, fully seeded).

Its shape follows the data of 001 sec. 7 (a state's person-level public-use microdata sample):
five key variables, sex (2), single-year age 0-90 (91; 90 stands for 90 and over), race (9, two
dominant, a few very rare, one with a single member), marital status (5, driven by age and sex) and area (44 areas of
uneven size, each with its own age and race mix), so that their 364,000-odd cross-classified
cells are mostly empty and, of the non-empty ones, about half are singletons. Non-key columns:
education (8 levels, driven by age), class of worker (5), and two binary attributes for masking,
smoker and insured (0/1), which depend on sex, age and each other.
"""

from __future__ import annotations

import numpy as np

from ._errors import ReleaseError
from ._random import RngLike, make_rng
from ._table import Table

__all__ = ["synthetic_population", "RACES", "MARITAL", "AREAS", "EDUCATION", "WORK"]

RACES = (
    "White",
    "Black",
    "American Indian",
    "Alaska Native",
    "AIAN other",
    "Asian",
    "Pacific Islander",
    "Other",
    "Two or more",
)
_RACE_SHARES = np.array([0.6302, 0.2581, 0.0016, 0.00002, 0.0007, 0.0586, 0.0004, 0.0228, 0.0275])
MARITAL = ("married", "widowed", "divorced", "separated", "never married")
AREAS = tuple(f"{1100 + i:05d}" for i in range(1, 45))
EDUCATION = ("none-6", "7-12", "high school", "some college", "associate", "bachelor", "master", "doctorate")
WORK = ("not working", "private", "government", "self-employed", "unpaid family")
AGES = np.arange(91)

# Marital status by age band (shares of married, widowed, divorced, separated, never married).
_MARITAL_BANDS = [
    (0, 14, [0.0, 0.0, 0.0, 0.0, 1.0]),
    (15, 19, [0.015, 0.0, 0.002, 0.003, 0.98]),
    (20, 24, [0.14, 0.001, 0.012, 0.007, 0.84]),
    (25, 34, [0.45, 0.003, 0.06, 0.02, 0.467]),
    (35, 44, [0.60, 0.01, 0.12, 0.03, 0.24]),
    (45, 54, [0.60, 0.03, 0.17, 0.03, 0.17]),
    (55, 64, [0.60, 0.07, 0.18, 0.02, 0.13]),
    (65, 74, [0.56, 0.19, 0.15, 0.01, 0.09]),
    (75, 90, [0.38, 0.45, 0.09, 0.01, 0.07]),
]


def _draw(rng: np.random.Generator, probabilities: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One categorical draw per record, record i from the row probabilities[rows[i]]."""
    cdf = np.cumsum(probabilities, axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random(rows.size)
    out = np.empty(rows.size, dtype=np.int64)
    for r in np.unique(rows):
        sel = rows == r
        out[sel] = np.minimum(np.searchsorted(cdf[r], u[sel], side="right"), probabilities.shape[1] - 1)
    return out


def synthetic_population(records: int = 60_000, rng: RngLike = 2016) -> Table:
    """A seeded synthetic population table of ``records`` persons (default 60,000, seed 2016).

    Columns: sex, age, race, marital, area (the five key variables), education, work, smoker,
    insured; every value is text, as read from a CSV file.
    """
    if not isinstance(records, (int, np.integer)) or records < 1:
        raise ReleaseError(f"records must be a positive whole number, not {records!r}.")
    gen = make_rng(rng)
    n = int(records)

    # Areas of uneven size; each has its own age tilt and race mix.
    areas = len(AREAS)
    area_size = gen.gamma(2.5, size=areas)
    area = gen.choice(areas, size=n, p=area_size / area_size.sum())
    tilt = gen.normal(0.0, 0.5, size=areas)  # > 0: older areas (retirement), < 0: younger (college towns)
    race_mix = gen.dirichlet(_RACE_SHARES * 40 + 1e-3, size=areas)
    race_mix[:, 3] = _RACE_SHARES[3]  # keep the rarest group rare everywhere

    sex = (gen.random(n) < 0.515).astype(np.int64)  # 1 = female

    base = np.where(AGES < 20, 1.0, np.where(AGES < 60, 1.08, np.exp(-(AGES - 60) / 14.0)))
    base[90] = base[89:].sum() * 2.0  # 90 and over
    age_weights = base[None, :] * np.exp(tilt[:, None] * (AGES[None, :] - 40) / 40.0)
    age = _draw(gen, age_weights, area)
    age = np.where((sex == 1) & (age >= 75) & (gen.random(n) < 0.15), np.minimum(age + 3, 90), age)

    race = _draw(gen, race_mix, area)
    race[race == 3] = 0
    race[gen.integers(n)] = 3  # exactly one Alaska Native, like 001's data: unique by race alone

    band = np.zeros(AGES.size, dtype=np.int64)
    shares = np.zeros((2 * len(_MARITAL_BANDS), len(MARITAL)))
    for b, (lo, hi, p) in enumerate(_MARITAL_BANDS):
        band[lo : hi + 1] = b
        shares[2 * b] = p
        female = np.array(p)
        female[1] *= 1.6  # women are widowed more often
        shares[2 * b + 1] = female / female.sum()
    marital = _draw(gen, shares, 2 * band[age] + sex)

    edu_by_age = np.array(
        [
            [0.70, 0.30, 0, 0, 0, 0, 0, 0],  # under 15
            [0.02, 0.50, 0.33, 0.15, 0, 0, 0, 0],  # 15-21
            [0.03, 0.08, 0.27, 0.21, 0.08, 0.21, 0.10, 0.02],  # 22-64
            [0.06, 0.13, 0.33, 0.17, 0.06, 0.14, 0.09, 0.02],  # 65 and over
        ]
    )
    edu_band = np.select([age < 15, age < 22, age < 65], [0, 1, 2], 3)
    education = _draw(gen, edu_by_age, edu_band)

    work_by_age = np.array(
        [
            [1.0, 0, 0, 0, 0],
            [0.45, 0.40, 0.05, 0.04, 0.06],
            [0.25, 0.52, 0.14, 0.08, 0.01],
            [0.80, 0.10, 0.03, 0.07, 0.0],
        ]
    )
    work = _draw(gen, work_by_age, np.select([age < 16, age < 22, age < 65], [0, 1, 2], 3))

    adult = age >= 18
    smoke_p = np.where(adult, np.where(sex == 1, 0.12, 0.17) * np.where(age < 65, 1.2, 0.6), 0.01)
    smoker = (gen.random(n) < smoke_p).astype(np.int64)
    insure_p = np.where(age >= 65, 0.98, np.where(work == 1, 0.93, np.where(work == 2, 0.97, 0.86)))
    insure_p = insure_p - 0.06 * smoker  # smokers are insured a little less often
    insured = (gen.random(n) < insure_p).astype(np.int64)

    return {
        "sex": np.where(sex == 1, "F", "M"),
        "age": AGES.astype(str)[age],
        "race": np.array(RACES)[race],
        "marital": np.array(MARITAL)[marital],
        "area": np.array(AREAS)[area],
        "education": np.array(EDUCATION)[education],
        "work": np.array(WORK)[work],
        "smoker": smoker.astype(str),
        "insured": insured.astype(str),
    }
