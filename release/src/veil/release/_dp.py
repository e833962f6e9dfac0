"""epsilon-DP PRAM that keeps the most information (paper 004).

A categorical variable with S categories and marginal p is post-randomized with keep-
probabilities q = (q_1..q_S): a record of category k keeps it with probability q_k, else moves
to one of the other S - 1 categories, uniformly. With a = e^epsilon and n = S - 1, the release is
epsilon-differentially private exactly when, for every k != k' (004 eq. 10),

    n q_k <= a (1 - q_k'),    1 - q_k <= a n q_k',    and (S >= 3)  1 - q_k <= a (1 - q_k'),

i.e. when the transition matrix's parity is at most a. Among these q, 004 maximises the mutual
information I(X; Z), a convex function of q (004 sec. 3.1), so the optimum is at a vertex of the
polytope (Proposition 1):

- S = 2 (004 sec. 3.2.2): q_1 = q_2 = a/(1 + a) (or 1/(1 + a), as good); closed form.
- symmetric q (sec. 3.2.3): q = v_a = a/(a + n) or v_-a = 1/(1 + a n), whichever has more
  information under p (v_a for a uniform p); closed form.
- general S: every vertex has at most four distinct values. The constraints bind only the two
  largest and the two smallest coordinates (and the smallest against the largest), so a
  coordinate strictly between the second smallest and the second largest is free: at a vertex
  there is none. A vertex is therefore, up to order, (m, L x j, U x (S - 2 - j), M); for each j
  the values solve a linear program in at most four unknowns whose vertices are enumerated
  exactly. When S >= 4 and epsilon <= log((S + sqrt(S(S - 4)) - 2)/2), these are exactly
  Proposition 2's five families (v_a, v_-a, v_min, v_max); the tests check that.
  Which category gets which value matters (p is not symmetric): for S <= 10 every distinct
  assignment of every vertex is tried (the global optimum); above, the assignments that give
  the values in the order of p (either direction, the one or two lone extreme values anywhere),
  then pairwise swaps until none improves. On every S <= 9 tried this found the global optimum.

The q returned are pulled towards the uniform centre 1/S by 1e-12 of their distance, so that no
rounding can put a ratio above e^epsilon; ``parity(q) <= e^epsilon`` holds in floating point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ReleaseError, TableError
from ._random import RngLike, make_rng
from ._table import Table, as_table, encode, require_columns

__all__ = [
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
]

_SHRINK = 1e-12
_GAIN = 1e-10  # relative: a smaller gain in information is rounding, not a better design
_EXHAUSTIVE_UP_TO = 10


def _check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"epsilon must be a finite number above 0, not {epsilon!r}.")
    return epsilon


def _check_q(q: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(q, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 1 or not np.all((arr >= 0) & (arr <= 1)):
        raise ReleaseError("keep-probabilities must be a non-empty vector of numbers in [0, 1].")
    return arr


def _check_p(p: Sequence[float] | np.ndarray, size: int | None = None) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or (size is not None and arr.size != size):
        raise ReleaseError(f"the marginal p must be a vector of {size or 'one or more'} entries.")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or arr.sum() <= 0:
        raise ReleaseError("the marginal p must be non-negative with a positive total.")
    return arr / arr.sum()


def dp_pram_matrix(q: Sequence[float] | np.ndarray) -> np.ndarray:
    """P[i, j] = P(Z = i | X = j): q_j on the diagonal, (1 - q_j)/(S - 1) off it (columns sum to 1)."""
    q = _check_q(q)
    s = q.size
    if s == 1:
        return np.ones((1, 1))
    p = np.broadcast_to((1.0 - q) / (s - 1), (s, s)).copy()
    p[np.diag_indices(s)] = q
    return p


def dp_parity(q: Sequence[float] | np.ndarray) -> float:
    """The largest ratio P(Z = z | X = x) / P(Z = z | X = x') (inf when a zero meets a non-zero):
    the release is epsilon-DP exactly when this is at most e^epsilon."""
    p = dp_pram_matrix(q)
    high, low = p.max(axis=1), p.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(high == 0, 1.0, high / low)
    return float(ratio.max())


def satisfies_dp(q: Sequence[float] | np.ndarray, epsilon: float) -> bool:
    return dp_parity(q) <= math.exp(_check_epsilon(epsilon))


def _mi(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """I(X; Z) in nats for each row of q (shape (..., S)), X ~ p."""
    s = p.size
    if s == 1:
        return np.zeros(q.shape[:-1])
    n = s - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(q > 0, q * np.log(q), 0.0)
        move = np.where(q < 1, (1 - q) * np.log((1 - q) / n), 0.0)
        total = np.sum(p * (1 - q), axis=-1, keepdims=True)
        m = p * (s * q - 1) / n + total / n
        m = np.clip(m, 0.0, None)
        h_z = np.sum(np.where(m > 0, m * np.log(m), 0.0), axis=-1)
    return np.sum(p * (keep + move), axis=-1) - h_z


def mutual_information(q: Sequence[float] | np.ndarray, p: Sequence[float] | np.ndarray) -> float:
    """I(X; Z) in nats when X ~ p is released with keep-probabilities q (004 sec. 3.1)."""
    q = _check_q(q)
    return float(_mi(q, _check_p(p, q.size)))


def _levels(s: int, epsilon: float) -> dict[str, float]:
    a, n = math.exp(epsilon), s - 1
    return {"v_a": a / (a + n), "v_-a": 1.0 / (1.0 + a * n), "v_min": 1.0 / (a * (a + n)), "v_max": a / (1.0 / a + n)}


def binary_keep_probability(epsilon: float) -> float:
    """S = 2: the optimal q_1 = q_2 = e^eps / (1 + e^eps) (004 sec. 3.2.1-3.2.2; 1 - that is as good)."""
    a = math.exp(_check_epsilon(epsilon))
    return a / (1.0 + a)


def symmetric_keep_probability(s: int, epsilon: float, p: Sequence[float] | np.ndarray | None = None) -> float:
    """The best common q for all S categories (004 sec. 3.2.3): an end of
    [e^-eps / (S - 1 + e^-eps), e^eps / (S - 1 + e^eps)], the one with more information under
    p (uniform when None); ties (S = 2) go to the upper end, which keeps more records."""
    epsilon = _check_epsilon(epsilon)
    if s < 2:
        raise ReleaseError(f"a variable needs at least two categories, not {s!r}.")
    lv = _levels(s, epsilon)
    prob = np.full(s, 1.0 / s) if p is None else _check_p(p, s)
    hi, lo = lv["v_a"], lv["v_-a"]
    return hi if _mi(np.full(s, hi), prob) >= _mi(np.full(s, lo), prob) - 1e-15 else lo


def proposition2_applies(s: int, epsilon: float) -> bool:
    """004 Proposition 2's condition: S >= 4 and epsilon <= log(S + sqrt(S(S - 4)) - 2) - log 2."""
    epsilon = _check_epsilon(epsilon)
    return s >= 4 and epsilon <= math.log(s + math.sqrt(s * (s - 4)) - 2) - math.log(2)


def proposition2_vertices(s: int, epsilon: float) -> np.ndarray:
    """Proposition 2's vertices, up to order (each row sorted ascending): all v_a; all v_-a;
    i v_a's and S - i v_-a's for 2 <= i <= S - 2; v_min with S - 1 v_a's; v_max with S - 1 v_-a's."""
    if not proposition2_applies(s, epsilon):
        raise ReleaseError(f"Proposition 2 does not apply to S = {s}, epsilon = {epsilon!r}.")
    lv = _levels(s, epsilon)
    rows = [np.full(s, lv["v_a"]), np.full(s, lv["v_-a"])]
    for i in range(2, s - 1):
        rows.append(np.array([lv["v_-a"]] * (s - i) + [lv["v_a"]] * i))
    rows.append(np.array([lv["v_min"]] + [lv["v_a"]] * (s - 1)))
    rows.append(np.array([lv["v_-a"]] * (s - 1) + [lv["v_max"]]))
    return np.sort(np.array(rows), axis=1)


def vertex_candidates(s: int, epsilon: float) -> np.ndarray:
    """Every vertex of the DP polytope, up to order (rows sorted ascending), for S >= 2."""
    epsilon = _check_epsilon(epsilon)
    if s < 2:
        raise ReleaseError(f"a variable needs at least two categories, not {s!r}.")
    a, n = math.exp(epsilon), s - 1
    found: dict[tuple[float, ...], np.ndarray] = {}
    for j in range(s - 1):
        counts = [1, j, s - 2 - j, 1]
        groups = [g for g in range(4) if counts[g]]
        d = len(groups)
        index = np.repeat(np.arange(d), [counts[g] for g in groups])  # sorted position -> unknown
        top, second, bottom, next_ = index[-1], index[-2], index[0], index[1]
        rows, rhs = [], []

        def add(coefs: Sequence[tuple[int, float]], bound: float) -> None:
            r = np.zeros(d)  # noqa: B023 (add runs within this iteration)
            for v, c in coefs:
                r[v] += c
            rows.append(r)  # noqa: B023 (add runs within this iteration)
            rhs.append(bound)  # noqa: B023 (add runs within this iteration)

        add([(top, n), (second, a)], a)  # n q_max + a q_second <= a
        add([(second, n), (top, a)], a)
        add([(bottom, -1), (next_, -a * n)], -1)  # q_min + a n q_next >= 1
        add([(next_, -1), (bottom, -a * n)], -1)
        if s >= 3:
            add([(bottom, -1), (top, a)], a - 1)  # 1 - q_min <= a (1 - q_max)
        for v in range(d - 1):
            add([(v, 1), (v + 1, -1)], 0)  # sorted
        add([(0, -1)], 0)
        add([(d - 1, 1)], 1)
        mat, vec = np.array(rows), np.array(rhs)
        combos = np.array(list(itertools.combinations(range(len(rows)), d)))
        sub = mat[combos]
        ok = np.abs(np.linalg.det(sub)) > 1e-12
        sol = np.linalg.solve(sub[ok], vec[combos[ok]][..., None])[..., 0]
        feasible = np.all(sol @ mat.T <= vec + 1e-10, axis=1)
        for y in sol[feasible]:
            vertex = np.clip(y[index], 0.0, 1.0)
            found.setdefault(tuple(np.round(vertex, 10)), vertex)
    return np.array(sorted(found.values(), key=lambda v: tuple(v)))


def _distinct(vertex: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a sorted vertex (within 1e-10) and their counts."""
    values, counts = [vertex[0]], [1]
    for x in vertex[1:]:
        if abs(x - values[-1]) <= 1e-10:
            counts[-1] += 1
        else:
            values.append(x)
            counts.append(1)
    return np.array(values), np.array(counts)


def _all_assignments(values: np.ndarray, counts: np.ndarray, s: int) -> np.ndarray:
    """Every distinct arrangement of the multiset (values with counts) over s positions."""
    out = []

    def place(g: int, free: tuple[int, ...], q: np.ndarray) -> None:
        if g == len(values) - 1:
            q = q.copy()
            q[list(free)] = values[g]
            out.append(q)
            return
        for chosen in itertools.combinations(free, int(counts[g])):
            q2 = q.copy()
            q2[list(chosen)] = values[g]
            place(g + 1, tuple(i for i in free if i not in chosen), q2)

    place(0, tuple(range(s)), np.empty(s))
    return np.array(out)


def _ordered_assignments(values: np.ndarray, counts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Values given in the order of p (``order`` = categories by p), both directions; a lone
    smallest or largest value may sit at any category."""
    s = order.size
    out = []
    for direction in (order, order[::-1]):
        lone_lo = counts[0] == 1 and len(values) > 1
        lone_hi = counts[-1] == 1 and len(values) > 1
        lo_spots = range(s) if lone_lo else [None]
        for i in lo_spots:
            hi_spots = range(s) if lone_hi else [None]
            for k in hi_spots:
                if i is not None and i == k:
                    continue
                rest = [c for c in direction if c != i and c != k]
                q = np.empty(s)
                start, g0, g1 = 0, 1 if lone_lo else 0, len(values) - (1 if lone_hi else 0)
                if lone_lo:
                    q[i] = values[0]
                if lone_hi:
                    q[k] = values[-1]
                for g in range(g0, g1):
                    q[rest[start : start + counts[g]]] = values[g]
                    start += counts[g]
                out.append(q)
    return np.array(out)


def _swap_search(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Swap pairs of categories' keep-probabilities while that adds information."""
    best = float(_mi(q, p))
    s = q.size
    pairs = np.array([(i, k) for i in range(s) for k in range(i + 1, s)])
    for _ in range(10 * s):
        differ = q[pairs[:, 0]] != q[pairs[:, 1]]
        if not differ.any():
            break
        cand = np.repeat(q[None, :], int(differ.sum()), axis=0)
        rows = np.arange(cand.shape[0])
        i, k = pairs[differ, 0], pairs[differ, 1]
        cand[rows, i], cand[rows, k] = q[k], q[i]
        values = _mi(cand, p)
        top = int(np.argmax(values))
        if values[top] <= best + _GAIN * max(best, 1e-3):
            break
        q, best = cand[top], float(values[top])
    return q


@dataclass(frozen=True, eq=False)
class DpPramDesign:
    """Keep-probabilities for one variable, and how they were found."""

    q: np.ndarray
    epsilon: float
    p: np.ndarray  # the marginal the information was maximised for
    mutual_information: float  # nats
    search: str  # "binary", "symmetric", "exhaustive" or "ordered+swaps"
    exact: bool  # True: the global optimum of 004's program (7)

    @property
    def parity(self) -> float:
        return dp_parity(self.q)

    def levels(self) -> dict[str, int]:
        """How many categories take each of Proposition 2's values (or another value)."""
        named = _levels(self.q.size, self.epsilon) if self.q.size >= 2 else {}
        out: dict[str, int] = {}
        for x in self.q.tolist():
            name = next((k for k, v in named.items() if abs(v - x) <= 1e-9), f"{x:.6g}")
            out[name] = out.get(name, 0) + 1
        return out


def _shrink(q: np.ndarray) -> np.ndarray:
    return q + _SHRINK * (1.0 / q.size - q)


def dp_pram_design(
    p: Sequence[float] | np.ndarray, epsilon: float, *, exhaustive_up_to: int = _EXHAUSTIVE_UP_TO
) -> DpPramDesign:
    """The keep-probabilities maximising I(X; Z) under epsilon-DP for X ~ p (004 program 7).

    p may be probabilities or counts (it is normalised). Closed forms for S = 2 and for a
    uniform p (all v_a); otherwise the vertices' assignments are searched (exhaustively up to
    ``exhaustive_up_to`` categories)."""
    epsilon = _check_epsilon(epsilon)
    prob = _check_p(p)
    s = prob.size
    if s == 1:
        return DpPramDesign(np.ones(1), epsilon, prob, 0.0, "single category", True)
    if s == 2:
        v = binary_keep_probability(epsilon)
        q = _shrink(np.array([v, v]))
        return DpPramDesign(q, epsilon, prob, float(_mi(q, prob)), "binary", True)
    if np.allclose(prob, 1.0 / s, rtol=0, atol=1e-12):
        q = _shrink(np.full(s, symmetric_keep_probability(s, epsilon, prob)))
        return DpPramDesign(q, epsilon, prob, float(_mi(q, prob)), "symmetric", True)
    vertices = vertex_candidates(s, epsilon)
    exhaustive = s <= exhaustive_up_to
    order = np.argsort(prob, kind="stable")
    # Start from k-RR (all v_a); another vertex must beat it by more than rounding, so that
    # ties (e.g. a category of p = 0 taking v_min) keep the familiar design.
    best_q = np.full(s, _levels(s, epsilon)["v_a"])
    best = float(_mi(best_q, prob))
    for vertex in vertices:
        values, counts = _distinct(vertex)
        cand = _all_assignments(values, counts, s) if exhaustive else _ordered_assignments(values, counts, order)
        mi = _mi(cand, prob)
        top = int(np.argmax(mi))
        if mi[top] > best + _GAIN * max(best, 1e-3):
            best_q, best = cand[top], float(mi[top])
    if not exhaustive:
        best_q = _swap_search(best_q, prob)
    q = _shrink(best_q)
    return DpPramDesign(
        q, epsilon, prob, float(_mi(q, prob)), "exhaustive" if exhaustive else "ordered+swaps", exhaustive
    )


def dp_pram(codes: np.ndarray, q: Sequence[float] | np.ndarray, rng: RngLike = None) -> np.ndarray:
    """Release category codes 0..S-1: keep code k with probability q_k, else a uniform other code."""
    q = _check_q(q)
    x = np.asarray(codes, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= q.size):
        raise ReleaseError(f"codes must lie in 0..{q.size - 1}.")
    if q.size == 1:
        return x.copy()
    gen = make_rng(rng)
    out = x.copy()
    moves = gen.random(x.size) >= q[x]
    drawn = gen.integers(0, q.size - 1, size=int(moves.sum()))
    out[moves] = drawn + (drawn >= x[moves])
    return out


def dp_pram_mle(
    released_counts: Sequence[float] | np.ndarray,
    q: Sequence[float] | np.ndarray,
    *,
    tol: float = 1e-12,
    max_iter: int = 100_000,
) -> np.ndarray:
    """The maximum-likelihood estimate of p from the released category counts (004 sec. 4).

    The released counts are multinomial with probabilities P p. When the unbiased estimate
    P^-1 (counts / N) is a distribution it is the MLE (it fits the counts exactly); otherwise
    EM (p <- p * P' (c / (P p)) / N, which never leaves the simplex) runs to convergence."""
    q = _check_q(q)
    c = np.asarray(released_counts, dtype=np.float64)
    if c.shape != q.shape or np.any(c < 0) or c.sum() <= 0:
        raise ReleaseError("the released counts must be non-negative, one per category, not all zero.")
    total = c.sum()
    mat = dp_pram_matrix(q)
    try:
        direct = np.linalg.solve(mat, c / total)
    except np.linalg.LinAlgError:
        direct = None
    if direct is not None and np.all(direct >= -1e-15):
        direct = np.clip(direct, 0.0, None)
        return direct / direct.sum()
    p = np.full(q.size, 1.0 / q.size)
    for _ in range(max_iter):
        fitted = mat @ p
        ratio = np.divide(c, fitted, out=np.zeros_like(c), where=fitted > 0)
        nxt = p * (mat.T @ ratio) / total
        if np.max(np.abs(nxt - p)) < tol:
            return nxt / nxt.sum()
        p = nxt
    return p / p.sum()


@dataclass(frozen=True, eq=False)
class DpPramRelease:
    """A table whose columns were each released by epsilon-DP PRAM."""

    table: Table
    original: Table
    columns: tuple[str, ...]
    categories: dict[str, np.ndarray]
    designs: dict[str, DpPramDesign]
    prior: str

    def report(self) -> dict[str, Any]:  # a JSON document
        cols = {}
        for c in self.columns:
            cats, design = self.categories[c], self.designs[c]
            index = {v: i for i, v in enumerate(cats.tolist())}
            before = np.bincount([index[v] for v in self.original[c].tolist()], minlength=cats.size)
            after = np.bincount([index[v] for v in self.table[c].tolist()], minlength=cats.size)
            n = int(before.sum())
            mle = dp_pram_mle(after, design.q)
            cols[c] = {
                "categories": cats.tolist(),
                "epsilon": design.epsilon,
                "keep_probability": design.q.tolist(),
                "levels": design.levels(),
                "search": design.search,
                "exact_optimum": design.exact,
                "mutual_information_nats": design.mutual_information,
                "parity": design.parity,
                "e_epsilon": math.exp(design.epsilon),
                "original": before.tolist(),
                "released": after.tolist(),
                "mle": (mle * n).tolist(),
                "sampling_sd": np.sqrt(n * (before / n) * (1 - before / n)).tolist(),
                "records_changed": int(np.count_nonzero(self.original[c] != self.table[c])),
            }
        return {
            "method": "epsilon-DP PRAM maximising mutual information (paper 004)",
            "prior": self.prior,
            "columns": cols,
            "epsilon_per_record": sum(self.designs[c].epsilon for c in self.columns),
            "seed": "not recorded: a seed replays the release, so keep it secret",
        }


def release_dp_pram(
    table: Mapping[str, Sequence[object] | np.ndarray],
    columns: Sequence[str],
    epsilon: float,
    *,
    domain: Mapping[str, Sequence[str]] | None = None,
    prior: str = "data",
    rng: RngLike = None,
) -> DpPramRelease:
    """Release each of ``columns`` by epsilon-DP PRAM, independently (a record's released values
    are then (len(columns) * epsilon)-DP together).

    domain: each column's categories (default: the values present; a public list is better,
    since the list of present values is itself not protected). prior: the marginal q is
    optimised for, "data" (the original column's shares, as 004 does; this choice reads the
    data outside the DP guarantee) or "uniform" (k-RR, which reads nothing).
    """
    tab = as_table(table)
    epsilon = _check_epsilon(epsilon)
    columns = tuple(dict.fromkeys(columns))
    if not columns:
        raise ReleaseError("name at least one column to release.")
    require_columns(tab, columns)
    if prior not in ("data", "uniform"):
        raise ReleaseError(f"prior must be 'data' or 'uniform', not {prior!r}.")
    domain = dict(domain or {})
    for name in domain:
        if name not in columns:
            raise ReleaseError(f"the domain names column {name!r}, which is not released.")
    gen = make_rng(rng)
    out = {name: col.copy() for name, col in tab.items()}
    categories, designs = {}, {}
    for c in columns:
        if c in domain:
            cats = np.array([str(v) for v in dict.fromkeys(domain[c])])
            if cats.size == 0:
                raise ReleaseError(f"the domain of column {c!r} is empty.")
            index = {v: i for i, v in enumerate(cats.tolist())}
            bad = next((v for v in tab[c].tolist() if v not in index), None)
            if bad is not None:
                raise TableError(f"column {c!r} holds the value {bad!r}, which is not in its domain.")
            codes = np.array([index[v] for v in tab[c].tolist()], dtype=np.int64)
        else:
            cats, codes = encode(tab[c])
        counts = np.bincount(codes, minlength=cats.size)
        design = dp_pram_design(counts if prior == "data" else np.ones(cats.size), epsilon)
        out[c] = cats[dp_pram(codes, design.q, gen)]
        categories[c], designs[c] = cats, design
    return DpPramRelease(out, tab, columns, categories, designs, prior)
