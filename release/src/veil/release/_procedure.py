"""The general post-randomization procedure of 001 sec. 5, on a table of records.

Step 1: theta from xi (theta_0 for Goals 2-3, theta_* for Goal 1) or given, and the fewest
        cells per block (m_0 = ceil(1/(1 - theta)) for Goal 3, two otherwise).
Step 2: the set C of post-randomized variables: the keys plus any non-key variables whose joint
        distribution with the keys should stay unbiased (``also``). X_C is their cross-
        classification; only its non-empty cells take part.
Step 3: the partition variables X*: a merge of categories per variable of C (see Partition). The
        records of one X*-category form a partition set; nothing ever leaves its partition set.
Step 4: in each partition set, the J cells to protect (frequency 1 and 2; Goal 1: frequency 1)
        form one IFPR block; if J < the fewest cells a block needs, the block is topped up with
        the set's smallest other cells (ties broken at random); if the set has too few non-empty
        cells the release stops and names the set (coarsen the partition). With
        ``split_blocks``, J >= 2 x that minimum are split at random into blocks of near-equal
        size, each at least the minimum (001 sec. 6: smaller blocks add less variance).
        IFPR with theta runs in every block; records outside blocks are untouched, and a
        record that moves takes the C-values of its new cell, keeping every other column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._assess import CorrectMatchTable, correct_match_from_cells, marginal_rows, tvd_of_codes
from ._errors import InfeasibleBlockError, PartitionError, ReleaseError
from ._partition import Partition
from ._random import RngLike, make_rng
from ._risk import block_match_risks, goal_min_block_cells, goal_theta, goal_xi, no_match_probability
from ._table import Table, as_table, combine, encode, require_columns

__all__ = ["PramRelease", "release_pram"]

_TOLERANCE = 1e-12  # float slack when comparing exact risks with xi


@dataclass(frozen=True, eq=False)
class PramRelease:
    """A released table and everything needed to assess it (against the original)."""

    table: Table  # the released records, same columns and order as the original
    original: Table
    goal: int
    xi: float
    theta: float
    min_block_cells: int
    keys: tuple[str, ...]
    post_randomized: tuple[str, ...]  # C: the keys, then the `also` variables
    partition: Partition
    categories: dict[str, np.ndarray]  # each variable of C: its categories
    cell_codes: np.ndarray  # (cells, |C|): each non-empty X_C cell's category codes
    cell_counts: np.ndarray  # T: each cell's original frequency
    record_cell: np.ndarray  # each record's original cell
    released_cell: np.ndarray  # each record's released cell
    cell_partition_set: np.ndarray  # each cell's partition set
    partition_set_labels: tuple[str, ...]
    blocks: tuple[np.ndarray, ...]  # each block's cells
    block_of_cell: np.ndarray = field(repr=False)  # -1 for a cell outside every block

    @property
    def records(self) -> int:
        return int(self.record_cell.size)

    @property
    def records_changed(self) -> int:
        return int(np.count_nonzero(self.record_cell != self.released_cell))

    @property
    def cells_perturbed(self) -> int:
        return int(np.count_nonzero(self.block_of_cell >= 0))

    def released_counts(self) -> np.ndarray:
        """S: each cell's released frequency (IFPR never makes a new cell)."""
        return np.bincount(self.released_cell, minlength=self.cell_counts.size)

    def match_risks(self) -> dict[str, float]:
        """The exact conditional risks R_j(a, t) of this release (001 eqs. 4.3, 4.11), given the
        original frequencies t, and the largest one the goal bounds by xi.

        largest_R1: R_j(1, t) over the goal's cells (Goal 1: the singletons; Goals 2-3: every
        block cell; a cell outside the blocks keeps S_j = t_j >= 2 there, so never a = 1).
        largest_R2: R_j(2, t) over every block cell. largest_unperturbed: 1/t_j for the
        smallest cell outside the blocks (its only a). For a >= 3, R <= 1/a <= 1/3 < xi always.
        largest: what the goal bounds (Goals 1-2: largest_R1; Goal 3: all three)."""
        t = self.cell_counts
        r1_max = r2_max = 0.0
        for cells in self.blocks:
            r1, r2 = block_match_risks(t[cells], self.theta)
            mask = t[cells] == 1 if self.goal == 1 else np.ones(cells.size, dtype=bool)
            if mask.any():
                r1_max = max(r1_max, float(r1[mask].max()))
            r2_max = max(r2_max, float(r2.max()))
        outside = t[self.block_of_cell < 0]
        unperturbed = float(1.0 / outside.min()) if outside.size else 0.0
        largest = max(r1_max, r2_max, unperturbed) if self.goal == 3 else r1_max
        return {
            "largest_R1": r1_max,
            "largest_R2": r2_max,
            "largest_unperturbed": unperturbed,
            "largest": largest,
            "holds": bool(largest <= self.xi + _TOLERANCE),
        }

    def expected_no_match(self) -> dict[str, float]:
        """The mean over the units of originally unique (doubleton) cells of P(S_j = 0 | t)
        (001 eq. 4.9; 0 for a cell outside the blocks)."""
        t = self.cell_counts
        total = {1: 0.0, 2: 0.0}
        for cells in self.blocks:
            p0 = no_match_probability(t[cells], self.theta)
            for k in (1, 2):
                mask = t[cells] == k
                total[k] += float(np.sum(p0[mask] * k))
        out = {}
        for k in (1, 2):
            units = int(np.sum(t[t == k]))
            out[f"tau={k}"] = total[k] / units if units else float("nan")
        return out

    def correct_match(self, max_frequency: int = 2) -> CorrectMatchTable:
        """The empirical P(CM | tau, tau*) of this release (001 sec. 7.1, Table 3)."""
        return correct_match_from_cells(self.record_cell, self.released_cell, max_frequency)

    def expected_correct_match(self) -> CorrectMatchTable:
        """What correct_match() estimates, computed exactly from the original counts: each entry
        is E[sum of the units' correct-match probabilities] / E[number of units] over the
        randomness of IFPR (tau, tau* <= 2 and the margins). These are averages of R_j(a, t),
        so the goal bounds them by xi; one release's empirical table scatters around them.

        For a unit of cell j with K other records landing in c_j (a sum of independent
        Bernoullis): P(S_j = 1, kept) = alpha Pi, P(S_j = 1) = Pi (alpha + (1 - alpha) Sigma_1),
        P(S_j = 2, kept) = alpha Pi Sigma_1, P(S_j = 2) = Pi (alpha Sigma_1 + (1 - alpha) Sigma_2)
        (001 eqs. 4.1-4.2, Pi = P(K = 0)), and E[CM] = alpha E[1/(1 + K)] = alpha int_0^1 E[x^K] dx,
        integrated by 64-point Gauss-Legendre (the integrand is a smooth product)."""
        t_all = self.cell_counts
        theta = self.theta
        num = np.zeros((3, 3))
        den = np.zeros((3, 3))
        nodes, weights = np.polynomial.legendre.leggauss(64)
        x, w = (nodes + 1) / 2, weights / 2
        for cells in self.blocks:
            t = t_all[cells].astype(np.float64)
            m = t.size
            alpha = 1 - theta / t
            other = theta / ((m - 1) * t)  # P(a record of cell i lands in a given other cell)
            beta_o, beta_s = other / (1 - other), (t - theta) / theta
            log_o = t * np.log1p(-other)
            log_pi = log_o.sum() - log_o + (t - 1) * np.log(theta / t)
            s1 = np.sum(t * beta_o) - t * beta_o + (t - 1) * beta_s
            p2 = np.sum(t * beta_o**2) - t * beta_o**2 + (t - 1) * beta_s**2
            s2 = (s1 * s1 - p2) / 2
            pi = np.exp(log_pi)
            q = [alpha * pi, alpha * pi * s1 / 2]
            d = [pi * (alpha + (1 - alpha) * s1), pi * (alpha * s1 + (1 - alpha) * s2)]
            gen_o = t[:, None] * np.log1p(-other[:, None] * (1 - x[None, :]))  # (m, nodes)
            gen = gen_o.sum(axis=0)[None, :] - gen_o + (t - 1)[:, None] * np.log1p(-alpha[:, None] * (1 - x[None, :]))
            cm = alpha * (np.exp(gen) @ w)
            for k in (1, 2):
                sel = t == k
                units = float(np.sum(t[sel]))
                for a in range(2):
                    num[a, k - 1] += float(np.sum(t[sel] * q[a][sel]))
                    den[a, k - 1] += float(np.sum(t[sel] * d[a][sel]))
                num[2, k - 1] += float(np.sum(t[sel] * cm[sel]))
                den[2, k - 1] += units
        outside = t_all[(self.block_of_cell < 0) & (t_all <= 2)]
        for k in (1, 2):  # unperturbed cells of 1 or 2 units (Goal 1 leaves doubletons): S_j = t_j, CM = 1/t_j
            units = float(np.sum(outside[outside == k]))
            num[k - 1, k - 1] += units / k
            den[k - 1, k - 1] += units
            num[2, k - 1] += units / k
            den[2, k - 1] += units
        num[:, 2], den[:, 2] = num[:, :2].sum(axis=1), den[:, :2].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            prob = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
        changed = np.array([theta, theta / 2])
        no_match = np.array(list(self.expected_no_match().values()))
        if self.goal == 1:  # doubletons outside the blocks never change
            units2 = float(np.sum(t_all[t_all == 2]))
            moved = float(np.sum(t_all[(t_all == 2) & (self.block_of_cell >= 0)]))
            changed[1] = theta / 2 * moved / units2 if units2 else np.nan
        return CorrectMatchTable(2, prob, den, changed, no_match)

    def perturbation_variance(self, variable: str) -> dict[str, float]:
        """V(S_D | T) for each category D of a variable of C: the variance IFPR adds to its
        released count, given the original table (001 eq. 6.5 in each block, blocks independent)."""
        if variable not in self.post_randomized:
            return {}
        i = self.post_randomized.index(variable)
        cats = self.categories[variable]
        out = np.zeros(cats.size)
        theta = self.theta
        for cells in self.blocks:
            t = self.cell_counts[cells].astype(np.float64)
            m = t.size
            code = self.cell_codes[cells, i]
            b = np.bincount(code, minlength=cats.size).astype(np.float64)
            inv_a = np.bincount(code, weights=1.0 / t, minlength=cats.size)
            inv_all = float(np.sum(1.0 / t))
            out += 2 * theta * b * (m - b) / (m - 1) - theta**2 / (m - 1) ** 2 * (
                b * b * (inv_all - inv_a) + (m - b) ** 2 * inv_a
            )
        return {c: float(v) for c, v in zip(cats.tolist(), out)}

    def report(self, pairs: bool = True) -> dict[str, Any]:  # a JSON document
        """A JSON-ready account of the release, for the data holder (it describes the original
        table: keep it with the original). The seed is never in it."""
        t = self.cell_counts
        block_sizes = np.array([c.size for c in self.blocks], dtype=np.int64)
        in_blocks = self.block_of_cell[self.record_cell] >= 0
        cm = self.correct_match()
        risks = self.match_risks()
        columns = list(self.post_randomized)
        before = self.cell_codes[self.record_cell]
        after = self.cell_codes[self.released_cell]
        sizes = [self.categories[c].size for c in columns]
        tvd: dict[str, float] = {}
        for i, c in enumerate(columns):
            tvd[c] = tvd_of_codes(before[:, i], after[:, i])
        if pairs:
            for a in range(len(columns)):
                for b in range(a + 1, len(columns)):
                    both = [np.concatenate([before[:, k], after[:, k]]) for k in (a, b)]
                    _, cell = combine(both, [sizes[a], sizes[b]])
                    tvd[f"{columns[a]},{columns[b]}"] = tvd_of_codes(cell[: self.records], cell[self.records :])
        tvd[",".join(columns)] = tvd_of_codes(self.record_cell, self.released_cell)
        marginals = {}
        for i, c in enumerate(columns):
            marginals[c] = marginal_rows(
                self.categories[c],
                np.bincount(before[:, i], minlength=sizes[i]),
                np.bincount(after[:, i], minlength=sizes[i]),
                self.perturbation_variance(c),
            )
        expected = self.expected_no_match()
        return {
            "method": "inverse-frequency post-randomization, the 4-step procedure of Nayak, Zhang & You (sec. 5)",
            "goal": self.goal,
            "xi": self.xi,
            "theta": self.theta,
            "min_block_cells": self.min_block_cells,
            "records": self.records,
            "keys": list(self.keys),
            "post_randomized": columns,
            "partition": self.partition.describe(columns),
            "partition_sets": len(self.partition_set_labels),
            "cells": {
                "non_empty": int(t.size),
                "singleton": int(np.count_nonzero(t == 1)),
                "doubleton": int(np.count_nonzero(t == 2)),
                "units_in_doubletons": int(2 * np.count_nonzero(t == 2)),
            },
            "blocks": {
                "count": len(self.blocks),
                "cells_min": int(block_sizes.min()) if block_sizes.size else 0,
                "cells_max": int(block_sizes.max()) if block_sizes.size else 0,
                "records": int(np.count_nonzero(in_blocks)),
            },
            "cells_perturbed": self.cells_perturbed,
            "records_changed": self.records_changed,
            "guarantee": {"xi": self.xi, **risks},
            "correct_match": cm.as_dict(),
            "expected_correct_match": self.expected_correct_match().as_dict(),
            "expected_no_match": expected,
            "marginals": marginals,
            "total_variation_distance": tvd,
            "seed": "not recorded: a seed replays the release, so keep it secret",
        }


def _form_blocks(
    t: np.ndarray,
    cell_set: np.ndarray,
    n_sets: int,
    goal: int,
    min_cells: int,
    split: bool,
    gen: np.random.Generator,
    labels: Sequence[str],
) -> list[np.ndarray]:
    protect = t == 1 if goal == 1 else t <= 2
    order = np.argsort(cell_set, kind="stable")
    bounds = np.searchsorted(cell_set[order], np.arange(n_sets + 1))
    blocks: list[np.ndarray] = []
    short: list[tuple[int, int, int]] = []
    for s in range(n_sets):
        cells = order[bounds[s] : bounds[s + 1]]
        sensitive = cells[protect[cells]]
        j = sensitive.size
        if j == 0:
            continue
        if j >= min_cells:
            if split and j >= 2 * min_cells:
                blocks.extend(np.sort(part) for part in np.array_split(gen.permutation(sensitive), j // min_cells))
            else:
                blocks.append(np.sort(sensitive))
            continue
        others = cells[~protect[cells]]
        need = min_cells - j
        if others.size < need:
            short.append((s, j, cells.size))
            continue
        pick = np.lexsort((gen.random(others.size), t[others]))[:need]  # smallest first, ties at random
        blocks.append(np.sort(np.concatenate([sensitive, others[pick]])))
    if short:
        s, j, non_empty = short[0]
        what = "singleton" if goal == 1 else "singleton or doubleton"
        rest = len(short) - 1
        more = f" ({rest} more set{'s' if rest > 1 else ''} too)" if rest else ""
        raise InfeasibleBlockError(
            f"partition set {labels[s]} has {j} {what} cell(s) but only {non_empty} non-empty cell(s), fewer than the "
            f"{min_cells} a block needs{more}: merge more categories of a partition variable."
        )
    return blocks


def release_pram(
    table: Mapping[str, Sequence[object] | np.ndarray],
    keys: Sequence[str],
    *,
    also: Sequence[str] = (),
    partition: str | Partition | Mapping[str, object] | None = None,
    xi: float | None = None,
    theta: float | None = None,
    goal: int = 3,
    split_blocks: bool = False,
    rng: RngLike = None,
) -> PramRelease:
    """Release ``table`` with identification risk at most xi (001 sec. 5).

    keys: the key variables an intruder may know. also: non-key variables to post-randomize
    jointly with them. partition: X* (text or mapping, see Partition). Give xi (Goal 1:
    0 < xi < 1; Goals 2-3: 1/3 < xi < 1) or theta (0 < theta < 1), not both. rng: a numpy
    Generator, a seed (a secret: it replays the release) or None for a CSPRNG-seeded one.
    """
    tab = as_table(table)
    keys = tuple(keys)
    if not keys:
        raise ReleaseError("at least one key variable is needed.")
    require_columns(tab, keys, "key column")
    require_columns(tab, list(also), "column")
    c_vars = tuple(dict.fromkeys([*keys, *also]))
    part = Partition.of(partition)
    for var in part.variables:
        if var not in c_vars:
            raise PartitionError(
                f"partition: variable {var!r} is not post-randomized (the keys and the "
                f"also-variables are: {', '.join(c_vars)})."
            )
    if (xi is None) == (theta is None):
        raise ReleaseError("give exactly one of xi and theta.")
    if goal not in (1, 2, 3):
        raise ReleaseError(f"goal must be 1, 2 or 3, not {goal!r}.")
    if xi is not None:
        theta = goal_theta(goal, xi)
        xi = float(xi)
    else:
        assert theta is not None  # exactly one of the two (above)
        xi = goal_xi(goal, theta)  # checks theta
        theta = float(theta)
    min_cells = goal_min_block_cells(goal, theta)
    gen = make_rng(rng)

    categories, codes = {}, []
    for var in c_vars:
        categories[var], code = encode(tab[var])
        codes.append(code)
    cell_codes, record_cell = combine(codes, [categories[v].size for v in c_vars])
    t = np.bincount(record_cell)

    group_cols, group_labels = [], []
    for i, var in enumerate(c_vars):
        group_of, labels = part.resolve(var, categories[var])
        group_cols.append(group_of[cell_codes[:, i]])
        group_labels.append(labels)
    set_codes, cell_set = combine(group_cols, [len(labels) for labels in group_labels])
    named = [i for i, var in enumerate(c_vars) if var in part.variables]
    set_labels = tuple(
        "(" + ", ".join(f"{c_vars[i]}={group_labels[i][row[i]]}" for i in named) + ")" if named else "(all records)"
        for row in set_codes
    )

    blocks = _form_blocks(t, cell_set, len(set_labels), goal, min_cells, split_blocks, gen, set_labels)
    block_of_cell = np.full(t.size, -1, dtype=np.int64)
    for b, cells in enumerate(blocks):
        block_of_cell[cells] = b

    released_cell = record_cell.copy()
    if blocks:
        flat = np.concatenate(blocks)
        size = np.array([c.size for c in blocks], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(size)[:-1]])
        position = np.full(t.size, -1, dtype=np.int64)
        position[flat] = np.arange(flat.size) - np.repeat(start, size)
        records = np.flatnonzero(block_of_cell[record_cell] >= 0)
        cell = record_cell[records]
        moves = gen.random(records.size) < theta / t[cell]
        movers, cell = records[moves], cell[moves]
        block = block_of_cell[cell]
        drawn = gen.integers(0, size[block] - 1)
        drawn += drawn >= position[cell]  # skip the record's own cell
        released_cell[movers] = flat[start[block] + drawn]

    out = {name: col.copy() for name, col in tab.items()}
    moved = np.flatnonzero(released_cell != record_cell)
    for i, var in enumerate(c_vars):
        out[var][moved] = categories[var][cell_codes[released_cell[moved], i]]

    return PramRelease(
        table=out,
        original=tab,
        goal=goal,
        xi=xi,
        theta=theta,
        min_block_cells=min_cells,
        keys=keys,
        post_randomized=c_vars,
        partition=part,
        categories=categories,
        cell_codes=cell_codes,
        cell_counts=t,
        record_cell=record_cell,
        released_cell=released_cell,
        cell_partition_set=cell_set,
        partition_set_labels=set_labels,
        blocks=tuple(blocks),
        block_of_cell=block_of_cell,
    )
