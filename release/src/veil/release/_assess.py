"""How a released table compares with the original: correct matches, marginals, distances.

All of these read only the two tables (records aligned by row), so they check any release,
not just veil's.

The empirical correct-match probabilities follow 001 sec. 7.1. For a record (unit), tau is the
frequency of its true key cell in the original table and tau* the number of released records in
that cell. An intruder who knows the unit's key values picks one of the tau* matching released
records at random, so the unit is correctly matched with probability 1/tau* if its own record
kept its key values and 0 otherwise. P(CM | tau, tau*) averages that over the units with the
given tau and tau*; P(CM | tau) averages over every unit with that tau (a unit with no match
counts 0); P(CM | tau*) averages over the units with tau <= max_frequency and that tau*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._errors import TableError
from ._table import as_table, combine, encode, require_columns

__all__ = [
    "CorrectMatchTable",
    "correct_match_table",
    "correct_match_from_cells",
    "marginal_table",
    "marginal_rows",
    "total_variation_distance",
    "tvd_of_codes",
]


@dataclass(frozen=True, eq=False)
class CorrectMatchTable:
    """P(CM | tau, tau*) for tau, tau* in 1..K, with margins (001 Table 3).

    ``probability[a, t]`` is P(CM | tau* = a + 1, tau = t + 1) for a, t < K; column K (the last)
    is the margin P(CM | tau* = a + 1) over tau <= K; row K is P(CM | tau = t + 1) over every
    tau*; [K, K] is P(CM | tau <= K); nan where no unit qualifies. ``units`` counts the units
    behind each entry (expected counts, as floats, in an expected table). ``changed[t]`` and
    ``no_match[t]`` are the shares of units with tau = t + 1 whose key cell changed, and whose
    true cell is empty in the released table.
    """

    max_frequency: int
    probability: np.ndarray
    units: np.ndarray
    changed: np.ndarray
    no_match: np.ndarray

    def largest(self) -> float:
        """The largest entry, margins included."""
        return float(np.nanmax(self.probability))

    def as_dict(self) -> dict[str, object]:
        k = self.max_frequency

        def num(x: float) -> float | None:
            return None if np.isnan(x) else round(float(x), 6)

        rows = []
        for a in range(k + 1):
            row: dict[str, object] = {"tau_star": a + 1 if a < k else "any"}
            for t in range(k):
                row[f"tau={t + 1}"] = num(self.probability[a, t])
            row[f"tau<={k}"] = num(self.probability[a, k])
            row["units"] = [int(u) if self.units.dtype.kind in "iu" else round(float(u), 1) for u in self.units[a]]
            rows.append(row)
        return {
            "rows": rows,
            "changed": {f"tau={t + 1}": num(self.changed[t]) for t in range(k)},
            "no_match": {f"tau={t + 1}": num(self.no_match[t]) for t in range(k)},
        }

    def format(self) -> str:
        k = self.max_frequency
        head = ["", *(f"tau={t + 1}" for t in range(k)), f"tau<={k}"]
        lines = [head]
        for a in range(k + 1):
            label = f"tau*={a + 1}" if a < k else "any tau*"
            lines.append([label, *("-" if np.isnan(x) else f"{x:.4f}" for x in self.probability[a])])
        widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
        return "\n".join(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in lines
        )


def correct_match_from_cells(
    original_cell: np.ndarray, released_cell: np.ndarray, max_frequency: int = 2
) -> CorrectMatchTable:
    """The table from each record's original and released key cell (integer ids in one space)."""
    orig = np.asarray(original_cell, dtype=np.int64)
    rel = np.asarray(released_cell, dtype=np.int64)
    if orig.shape != rel.shape or orig.ndim != 1:
        raise TableError("the original and released cells must be two arrays of one length.")
    if max_frequency < 1:
        raise TableError("max_frequency must be at least 1.")
    k = int(max_frequency)
    size = int(max(orig.max(initial=-1), rel.max(initial=-1))) + 1
    t = np.bincount(orig, minlength=size)
    s = np.bincount(rel, minlength=size)
    tau, tau_star = t[orig], s[orig]
    kept = orig == rel
    cm = np.zeros(orig.size)
    cm[kept] = 1.0 / tau_star[kept]  # tau* >= 1 here: the record itself is in its cell

    prob = np.full((k + 1, k + 1), np.nan)
    units = np.zeros((k + 1, k + 1), dtype=np.int64)
    small = tau <= k

    def put(a: int, b: int, mask: np.ndarray) -> None:
        units[a, b] = int(mask.sum())
        if units[a, b]:
            prob[a, b] = float(cm[mask].mean())

    for a in range(k):
        for b in range(k):
            put(a, b, (tau == b + 1) & (tau_star == a + 1))
        put(a, k, small & (tau_star == a + 1))
    for b in range(k):
        put(k, b, tau == b + 1)
    put(k, k, small)
    changed = np.array([np.mean(~kept[tau == b + 1]) if np.any(tau == b + 1) else np.nan for b in range(k)])
    no_match = np.array([np.mean(tau_star[tau == b + 1] == 0) if np.any(tau == b + 1) else np.nan for b in range(k)])
    return CorrectMatchTable(k, prob, units, changed, no_match)


def _cells(
    original: Mapping[str, np.ndarray], released: Mapping[str, np.ndarray], columns: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    orig, rel = as_table(original), as_table(released)
    require_columns(orig, columns)
    require_columns(rel, columns, "released column")
    n = orig[columns[0]].size
    if rel[columns[0]].size != n:
        raise TableError(f"the released table has {rel[columns[0]].size} records, the original {n}.")
    codes, sizes = [], []
    for c in columns:
        cats, code = encode(np.concatenate([orig[c], rel[c]]))
        codes.append(code)
        sizes.append(cats.size)
    _, cell = combine(codes, sizes)
    return cell[:n], cell[n:]


def correct_match_table(
    original: Mapping[str, np.ndarray],
    released: Mapping[str, np.ndarray],
    columns: Sequence[str],
    max_frequency: int = 2,
) -> CorrectMatchTable:
    """Empirical P(CM | tau, tau*) of a release, matching on ``columns`` (001 sec. 7.1)."""
    if not columns:
        raise TableError("the correct-match table needs at least one key column.")
    return correct_match_from_cells(*_cells(original, released, list(columns)), max_frequency)


def marginal_table(
    original: Mapping[str, np.ndarray],
    released: Mapping[str, np.ndarray],
    column: str,
    perturbation_variance: Mapping[str, float] | None = None,
) -> list[dict[str, object]]:
    """One variable's categories before and after, as 001's Tables 4-5: counts, shares, the
    difference original - released, and the sampling SD sqrt(n p (1 - p)) of a count under
    simple random sampling with replacement, p the original share. Given the perturbation
    variance of each released count (conditional on the original table), its SD too."""
    orig, rel = as_table(original), as_table(released)
    require_columns(orig, [column])
    require_columns(rel, [column], "released column")
    n = orig[column].size
    if rel[column].size != n:
        raise TableError(f"the released table has {rel[column].size} records, the original {n}.")
    cats, code = encode(np.concatenate([orig[column], rel[column]]))
    return marginal_rows(
        cats,
        np.bincount(code[:n], minlength=cats.size),
        np.bincount(code[n:], minlength=cats.size),
        perturbation_variance,
    )


def marginal_rows(
    categories: np.ndarray,
    before: np.ndarray,
    after: np.ndarray,
    perturbation_variance: Mapping[str, float] | None = None,
) -> list[dict[str, object]]:
    """marginal_table's rows from the counts of each category before and after."""
    n = int(np.sum(before))
    rows = []
    for c, b, a in zip(np.asarray(categories).tolist(), np.asarray(before).tolist(), np.asarray(after).tolist()):
        share = b / n
        row: dict[str, object] = {
            "category": c,
            "original": int(b),
            "original_share": share,
            "released": int(a),
            "released_share": a / n,
            "difference": int(b - a),
            "sampling_sd": float(np.sqrt(n * share * (1 - share))),
        }
        if perturbation_variance is not None:
            row["perturbation_sd"] = float(np.sqrt(max(perturbation_variance.get(c, 0.0), 0.0)))
        rows.append(row)
    return rows


def total_variation_distance(
    original: Mapping[str, np.ndarray], released: Mapping[str, np.ndarray], columns: Sequence[str]
) -> float:
    """TVD = (1/2n) sum over the cells of ``columns`` of |f_i - f~_i| (001 eq. 7.1)."""
    return tvd_of_codes(*_cells(original, released, list(columns)))


def tvd_of_codes(before: np.ndarray, after: np.ndarray) -> float:
    """TVD of two aligned arrays of cell ids (one id space)."""
    size = int(max(before.max(initial=-1), after.max(initial=-1))) + 1
    return float(
        np.abs(np.bincount(before, minlength=size) - np.bincount(after, minlength=size)).sum() / (2 * before.size)
    )
