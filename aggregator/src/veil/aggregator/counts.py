"""Sufficient statistics of a metric's reports: integer counters, never floats.

Every design Veil supports is a mixture of t-subset designs (see veil.mechanism._law), and its
estimators need, per report weight t (number of categories in a report), n_t = number of
reports of weight t and V_j^(t) = number of those containing category j. A q-subset design has
one weight (q); RAPPOR has 0..k; admissible RAPPOR 1..k-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from veil.mechanism import MechanismError, MechanismSpec

__all__ = ["Counts", "PERIOD_NOT_SAID"]

# A period index standing for "some period not said": a batch written without its period
# (BatchWrite.period None), or a bucket kept from before stores recorded periods. A bucket
# holding it may have reports of any period it spans.
PERIOD_NOT_SAID = -1


@dataclass(eq=False)
class Counts:
    """n[r] reports of weight weights[r]; v[r, j] of them contain category j; as read from a
    store, the reporting periods (period indexes) whose reports they hold."""

    weights: tuple[int, ...]
    n: np.ndarray  # int64, shape (len(weights),)
    v: np.ndarray  # int64, shape (len(weights), k)
    # The periods with data (PERIOD_NOT_SAID among them where some went unsaid); empty for
    # counts not read from a store (a batch's: its period is BatchWrite.period).
    periods: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.n = np.asarray(self.n, dtype=np.int64)
        self.v = np.asarray(self.v, dtype=np.int64)
        if self.n.shape != (len(self.weights),) or self.v.ndim != 2 or self.v.shape[0] != len(self.weights):
            raise MechanismError("Counts need one n and one row of V per report weight.")

    @classmethod
    def zeros(cls, spec: MechanismSpec) -> Counts:
        weights = spec.weight_law().weights
        return cls(weights, np.zeros(len(weights), np.int64), np.zeros((len(weights), spec.k), np.int64))

    @property
    def k(self) -> int:
        return self.v.shape[1]

    @property
    def total(self) -> int:
        """Number of reports, n."""
        return sum(self.n.tolist())  # a few weights: Python's sum of a list beats a numpy reduction

    @property
    def totals(self) -> np.ndarray:
        """V_j: number of reports containing category j, whatever their weight."""
        return self.v.sum(axis=0)

    def row_of_weight(self) -> np.ndarray:
        """For t = 0..k, the row holding weight t, or -1 where reports of that weight are invalid."""
        rows = np.full(self.k + 1, -1, dtype=np.int64)
        rows[list(self.weights)] = np.arange(len(self.weights))
        return rows

    @classmethod
    def summed(cls, parts: Sequence[Counts]) -> Counts:
        """The counts of several parts of one design added (a group of batches, a bucket's shards)."""
        return cls(
            parts[0].weights,
            sum((p.n for p in parts[1:]), parts[0].n.copy()),
            sum((p.v for p in parts[1:]), parts[0].v.copy()),
            frozenset().union(*(p.periods for p in parts)),
        )

    def add(self, other: Counts) -> None:
        if other.weights != self.weights or other.k != self.k:
            raise MechanismError("Counts of different designs cannot be added.")
        self.n += other.n
        self.v += other.v
        self.periods |= other.periods

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Counts):
            return NotImplemented
        # Equal as counters: the periods say where the counts came from, and are compared apart.
        return self.weights == other.weights and np.array_equal(self.n, other.n) and np.array_equal(self.v, other.v)
