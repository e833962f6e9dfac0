"""Discovery of a strings metric's frequent values, simulated end to end on the server's code
(docs/math.md 10; issue 28, item 4).

A population of n devices holds values drawn from Zipf(1.1) over 2^64 values. A value is a
string of more than 6 bytes (2^64 values cannot be shorter), so its code is the byte 0xFF and 40
bits of its hash (docs/protocol.md 10): the first EXPLICIT ranks get random 40-bit hashes (fresh
each simulation), and a device drawn beyond them gets a fresh random one of its own (the value at
rank EXPLICIT has a share of about 2e-8: it never matters). Each device answers one round,
uniform over the seven (as the HMAC rule of docs/protocol.md 10 assigns them, without regard to
values), so round r hears from a multinomial seventh of the devices, whose values are
independent draws from the law. Every code starts with 0xFF, so round 0 finds that byte and the
hash's bytes are found in rounds 1-5.

A round's reports are drawn exactly as veil.mechanism.HashedSpec.randomize_prefix draws them,
vectorized: each device gets a row of uint32 words and the row is read as WordRandomSource
reads it (a_0..a_5 and c by Lemire's below(P), one word each; keep = bits64 < T, two words; the
other bucket by below(g - 1), one word). Where Lemire's rule would reject a word (a chance of
about 2^-31 per draw) the row is handed to randomize_prefix itself, so every report equals
randomize_prefix's on the same words (tests/aggregator/test_discovery.py checks that).

The server's part is the aggregator's code, timed on one core (CPU time of this thread):
veil.aggregator.discovery.count_hashed (the numba kernel), veil.aggregator.estimate.estimate,
next_round (the 32 survivors) for rounds 0-5 and discovered() for round 6.

Measured per cell (n, epsilon), over S simulations:
- recall: the share of the true top 20 found (and per rank);
- precision: (a) the share of reported values that are real values with a true share of at least
  half the floor; (b) for transparency the strict share of reported values in the top 20
  (ranks 20 and 21 differ by less than one standard error of any epsilon-4 oracle at n = 10^6,
  so no method can make the reported set the top 20 exactly); (c) the share of each
  simulation's 20 largest reported values that are in the true top 20;
- coverage: for each rank found, the share of its 95% (selective) intervals holding its true
  share (the law's); the minimum over ranks found in at least 20 simulations and the pooled;
- the detection floor: detection_floor's against the measured one (z times the spread of the
  round-8 estimates of candidates whose true share is zero), and how often such a candidate
  cleared the floor;
- per round, the measured chance that a value's prefix survives against survival_chances';
- server time for all rounds and the report's bytes.

Usage:  .venv/bin/python bench/bench_discovery.py [--quick] [--sims S] [--large-sims S] [--summarize] [--update-docs]
Writes bench/results/discovery.json (--quick: bench/results/quick/discovery.json) after each
cell, and keeps the simulations in bench/results/quick/discovery-runs/ (not committed), which
--summarize reads instead of simulating; --update-docs puts the tables into bench/README.md and
docs/math.md 10, each between its markers. Seeded: the same command gives the same numbers (the
times aside).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom
from veil_testing.benchlib import (
    QUICK_RESULTS_DIR,
    RESULTS_DIR,
    machine_info,
    progress,
    replace_marked,
    write_results,
)

from veil.aggregator.counts import Counts
from veil.aggregator.discovery import (
    DEFAULT_SURVIVORS,
    FALSE_REPORT_RATE,
    count_hashed,
    detection_floor,
    discovered,
    first_round,
    next_round,
)
from veil.aggregator.estimate import estimate
from veil.mechanism import (
    CODE_BYTES,
    MODULUS,
    REPORT_WORDS,
    ROUNDS,
    HashedSpec,
    MetricSpec,
    StringsRound,
    WordRandomSource,
    buckets_for,
    epsilon_to_gamma,
)

SEED = 20261127
EXPONENT = 1.1
VALUES = 2.0**64  # the dictionary's size
HASH_BITS = 8 * (CODE_BYTES - 1)  # a long value's code: the marker 0xFF, then these bits of its hash
MARKER = np.uint64(0xFF << HASH_BITS)
EXPLICIT = 1_000_000  # ranks with a code of their own; the rest drawn fresh
TOP = 20  # the top whose recall is measured
TRACK = 60  # ranks whose rounds, estimates and intervals are recorded
ROW_WORDS = 16  # words per report row: 10 at most without a rejection, 6 to spare
METRIC = "crash_signature"
SURVIVAL_RANKS = (1, 10, 15, 18, 20, 22, 25, 30, 40)  # ranks whose survival is computed and measured
MIN_APPEARANCES = 20  # a rank's coverage is reported when it was found this often
CELLS = ((1_000_000, 4.0), (1_000_000, 2.0), (10_000_000, 4.0))
RUNS_DIR = QUICK_RESULTS_DIR / "discovery-runs"
ROOT = Path(__file__).resolve().parent.parent
MATH_DOC, README = ROOT / "docs" / "math.md", ROOT / "bench" / "README.md"
TABLE_MARKS = ("<!-- bench/bench_discovery.py: begin -->", "<!-- bench/bench_discovery.py: end -->")
SURVIVAL_MARKS = (
    "<!-- bench/bench_discovery.py survival: begin -->",
    "<!-- bench/bench_discovery.py survival: end -->",
)

_ONE32 = np.uint64(1 << 32)
_LOW32 = np.uint64(0xFFFFFFFF)


# --- the population --------------------------------------------------------------------------


class Zipf:
    """Zipf(EXPONENT) over VALUES values: shares of the first EXPLICIT ranks and their cumulative
    sums; the mass beyond them by the midpoint rule (sum_(j > M) j^-s ~ int_(M + 1/2)^(N + 1/2)),
    whose error is far below the shares that matter."""

    def __init__(self, explicit: int = EXPLICIT, exponent: float = EXPONENT) -> None:
        weights = np.arange(1, explicit + 1, dtype=np.float64) ** -exponent
        tail = ((explicit + 0.5) ** (1 - exponent) - (VALUES + 0.5) ** (1 - exponent)) / (exponent - 1)
        total = math.fsum(weights.tolist()) + tail
        self.shares = weights / total
        self.cumulative = np.cumsum(self.shares)
        self.tail = tail / total

    def draw(self, rng: np.random.Generator, codes: np.ndarray, count: int) -> np.ndarray:
        """``count`` devices' codes (uint64, the code's CODE_BYTES bytes the low ones, byte 0 the
        most significant)."""
        ranks = np.searchsorted(self.cumulative, rng.random(count), side="right")
        fresh = ranks >= codes.size
        out = codes[np.minimum(ranks, codes.size - 1)]
        out[fresh] = long_codes(rng, int(fresh.sum()))
        return out


def long_codes(rng: np.random.Generator, count: int) -> np.ndarray:
    """Codes of values longer than CODE_BYTES: 0xFF and a random hash each."""
    return rng.integers(0, 1 << HASH_BITS, count, dtype=np.uint64, endpoint=False) | MARKER


def prefix_bytes(codes: np.ndarray, length: int) -> np.ndarray:
    """(devices, length) uint8: the first ``length`` bytes of each code."""
    return codes.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - CODE_BYTES : 8 - CODE_BYTES + length]


def to_bytes(code: int) -> bytes:
    return int(code).to_bytes(CODE_BYTES, "big")


# --- the device's report, vectorized ---------------------------------------------------------


def draw_reports(spec: HashedSpec, prefixes: np.ndarray, words: np.ndarray) -> np.ndarray:
    """The reports (uint32, one row of REPORT_WORDS per device) that randomize_prefix makes of
    each row of ``prefixes`` (uint8) from the row of ``words`` (uint32, ROW_WORDS a row) read as a
    WordRandomSource: the same report, word for word (module docstring)."""
    g = spec.buckets
    w = words.astype(np.uint64)
    product = w[:, : CODE_BYTES + 1] * np.uint64(MODULUS)
    coefficients = (product >> np.uint64(32)).astype(np.int64)
    rejected = ((product & _LOW32) < np.uint64((1 << 32) % MODULUS)).any(axis=1)
    h = coefficients[:, CODE_BYTES].copy()
    for i in range(prefixes.shape[1]):
        h += coefficients[:, i] * prefixes[:, i].astype(np.int64)  # below 2^43 in all: exact
    true_bucket = (h % MODULUS) & (g - 1)
    after = CODE_BYTES + 1  # the words after the coefficients: keep's two, then the other bucket's
    keep = ((w[:, after] << np.uint64(32)) | w[:, after + 1]) < np.uint64(spec.keep_threshold)
    other_product = w[:, after + 2] * np.uint64(g - 1)
    other = (other_product >> np.uint64(32)).astype(np.int64)
    rejected |= ~keep & ((other_product & _LOW32) < np.uint64((1 << 32) % (g - 1)))
    reports = np.empty((prefixes.shape[0], REPORT_WORDS), np.uint32)
    reports[:, : CODE_BYTES + 1] = coefficients
    reports[:, CODE_BYTES + 1] = np.where(keep, true_bucket, other + (other >= true_bucket))
    for i in np.flatnonzero(rejected):  # Lemire's rule draws again: the scalar code has the words
        reports[i] = spec.randomize_prefix(prefixes[i].tobytes(), WordRandomSource(words[i].tolist()))
    return reports


# --- one simulation --------------------------------------------------------------------------


def simulate(zipf: Zipf, n: int, epsilon: float, rng: np.random.Generator) -> dict[str, Any]:
    """One population of n devices through the seven rounds; what was found and what it cost."""
    buckets = buckets_for(epsilon_to_gamma(epsilon))
    codes = long_codes(rng, zipf.shares.size)
    sizes = rng.multinomial(n, [1.0 / ROUNDS] * ROUNDS)
    tracked = [to_bytes(c) for c in codes[:TRACK]]
    strings = first_round(METRIC, buckets)
    reached = np.zeros(TRACK, np.int64)  # rounds whose candidates held each tracked rank's prefix
    result: dict[str, Any] = {
        "found": [],
        "nulls": [],
        "floor": None,
        "n_verification": int(sizes[-1]),
        "k": [],
        "round_seconds": [],
    }
    for r in range(ROUNDS):
        spec = MetricSpec.strings_round(strings, epsilon)
        candidates = set(strings.candidates)
        reached += [strings.prefix_of(code) in candidates for code in tracked]
        devices = zipf.draw(rng, codes, int(sizes[r]))
        words = rng.integers(0, 1 << 32, (devices.size, ROW_WORDS), dtype=np.uint32)
        reports = draw_reports(spec.mechanism, prefix_bytes(devices, strings.prefix_bytes), words)
        start = time.thread_time()
        counts = Counts.zeros(spec.mechanism)
        if count_hashed(spec, reports, counts) != -1:
            raise AssertionError("a simulated report was refused")
        found = estimate(spec.mechanism, counts)
        following = next_round(spec, found, DEFAULT_SURVIVORS) if r < ROUNDS - 1 else None
        discovery = discovered(spec, found) if r == ROUNDS - 1 else None
        result["round_seconds"].append(time.thread_time() - start)
        result["k"].append(spec.k)
        if discovery is not None:
            result["floor"] = discovery.floor
            for value in discovery.values:
                rank = _rank(codes, value.code)
                share = float(zipf.shares[rank]) if rank >= 0 else 0.0
                result["found"].append((rank, share, value.estimate, value.lower, value.upper, value.stderr))
            for i, code in enumerate(strings.candidates):
                if _rank(codes, code) < 0:  # no explicit value: a share of zero up to 2e-8
                    result["nulls"].append(float(found.estimate[i]))
        elif following is None:
            break  # nothing above zero to extend: nothing found
        else:
            strings = following
    result["reached"] = reached.tolist()
    result["seconds"] = sum(result["round_seconds"])
    return result


def _rank(codes: np.ndarray, code: bytes) -> int:
    hits = np.flatnonzero(codes == np.uint64(int.from_bytes(code, "big")))
    return int(hits[0]) if hits.size else -1


# --- the chance of surviving a round, computed -------------------------------------------------


def survival_chances(
    zipf: Zipf, n: int, epsilon: float, values: int = 200, points: int = 401, keep: int = DEFAULT_SURVIVORS
) -> np.ndarray:
    """(ROUNDS - 1, values): the chance that the prefix of each of the ``values`` most frequent
    values is among the ``keep`` survivors of round r given that it is one of its candidates.

    Round 0: every code starts with 0xFF, whose candidate holds every device: it survives surely,
    with keep - 1 first bytes nobody holds. From round 1 on, a value's estimate X must exceed all
    but fewer than ``keep`` of the others': P = E_X[P(fewer than keep others > X)], the count of
    others above x a Poisson-binomial over the other values (each a candidate with the chance it
    survived the rounds before) plus binomials over the null candidates (256 x keep, less the
    values there). Every estimate is normal with its share's design variance over n / ROUNDS
    reports (docs/math.md 10.5). In round 1 the 256 extensions of 0xFF also carry the rest of
    the mass (the values beyond these), in lumps: mean rest / 256 and variance
    sum_j s_j^2 (1/256)(1 - 1/256), added to each one's; the 256 (keep - 1) extensions of the
    other first bytes carry nothing. Later rounds ignore the rest, and two of these values
    sharing a prefix (which helps both)."""
    spec = MetricSpec.strings_round(first_round(METRIC, buckets_for(epsilon_to_gamma(epsilon))), epsilon)
    _, _, a, b = spec.mechanism.estimator.moments(spec.mechanism.weight_law())
    reports = n / ROUNDS
    top = zipf.shares[:values]
    present = np.ones(values)
    chances = np.ones((ROUNDS - 1, values))  # round 0's: 1
    steps = np.linspace(-8.0, 8.0, points)
    density = np.exp(-0.5 * steps**2)
    density /= density.sum()
    empty_sd = math.sqrt(b / reports)  # a prefix nobody holds
    for r in range(1, ROUNDS - 1):
        first = r == 1
        spread = (1.0 - float(top.sum())) / 256 if first else 0.0
        lumps = float((zipf.shares[values:] ** 2).sum()) * 255 / 256**2 if first else 0.0
        # null candidates: those carrying the spread (round 1: the other extensions of 0xFF), and the empty
        spread_nulls = round(256 - present.sum()) if first else 0
        empty_nulls = round(256 * (keep - 1) if first else 256 * keep - present.sum())
        shares = top + spread
        sds = np.sqrt((b + (a - b) * shares - shares**2) / reports + lumps)
        spread_sd = math.sqrt((b + (a - b) * spread - spread**2) / reports + lumps)
        for i in range(values):
            grid = shares[i] + sds[i] * steps
            others = np.arange(values) != i
            above = present[others] * ndtr((shares[others][None, :] - grid[:, None]) / sds[others][None, :])
            count = np.zeros((points, keep + 1))  # P(j values above x) for j < keep; the last: >= keep
            count[:, 0] = 1.0
            for q in above.T:
                moved = count * q[:, None]
                count *= 1.0 - q[:, None]
                count[:, 1:] += moved[:, :-1]
                count[:, -1] += moved[:, -1]
            # P(j nulls above x), j < keep: the two binomials' sum (in logs: scipy's pmf overflows
            # at p near 0)
            j = np.arange(keep)
            empty = np.exp(binom.logpmf(j, empty_nulls, ndtr(-grid / empty_sd)[:, None]))
            spread_above = np.exp(binom.logpmf(j, spread_nulls, ndtr((spread - grid) / spread_sd)[:, None]))
            null_count = np.stack([np.convolve(x, y)[:keep] for x, y in zip(spread_above, empty)])
            fewer = np.cumsum(null_count, axis=1)  # P(nulls above x <= m)
            chance = sum(count[:, m] * fewer[:, keep - m - 1] for m in range(keep))
            chances[r, i] = float(chance @ density)
        present = present * chances[r]
    return chances


# --- a cell: S simulations ---------------------------------------------------------------------


def cell(zipf: Zipf, n: int, epsilon: float, sims: int, seed: int, command: str = "") -> dict[str, Any]:
    """S simulations of (n, epsilon) and their summary (module docstring). The simulations
    themselves go to RUNS_DIR (not committed), so that --summarize can summarize them again."""
    runs = []
    started = time.perf_counter()
    for s in range(sims):
        runs.append(simulate(zipf, n, epsilon, np.random.default_rng([seed, s])))
        if s % 10 == 9 or s == sims - 1:
            progress(f"n = {n:,}, epsilon {epsilon:g}: {s + 1}/{sims} ({time.perf_counter() - started:.0f} s)")
    write_results(_runs_file(n, epsilon), {"n": n, "epsilon": epsilon, "seed": seed, "command": command, "runs": runs})
    return summarize(zipf, n, epsilon, runs)


def _runs_file(n: int, epsilon: float) -> Path:
    return RUNS_DIR / f"n{n}-eps{epsilon:g}.json"


def summarize(zipf: Zipf, n: int, epsilon: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    sims = len(runs)
    floors = np.array([r["floor"] if r["floor"] is not None else math.nan for r in runs])
    found = [f for r in runs for f in r["found"]]
    found_ranks = [{rank for rank, *_ in r["found"] if rank >= 0} for r in runs]
    per_rank = np.array([[rank in ranks for rank in range(TRACK)] for ranks in found_ranks], dtype=np.float64)
    half_floor = {id(r): (r["floor"] or math.inf) / 2 for r in runs}
    real = sum(1 for r in runs for rank, share, *_ in r["found"] if rank >= 0 and share >= half_floor[id(r)])
    strict = sum(1 for f in found if 0 <= f[0] < TOP)
    listed = [f for r in runs for f in r["found"][:TOP]]  # each simulation's TOP largest estimates
    listed_strict = sum(1 for f in listed if 0 <= f[0] < TOP)
    covered: dict[int, list[bool]] = {}
    for rank, share, _, lower, upper, _ in found:
        if rank >= 0:
            covered.setdefault(rank, []).append(lower <= share <= upper)
    often = {rank: float(np.mean(c)) for rank, c in covered.items() if len(c) >= MIN_APPEARANCES}
    worst = min(often, key=lambda rank: often[rank]) if often else None
    pooled = [c for cs in covered.values() for c in cs]
    nulls = np.array([x for r in runs for x in r["nulls"]])
    spec0 = MetricSpec.strings_round(first_round(METRIC, buckets_for(epsilon_to_gamma(epsilon))), epsilon)
    k = DEFAULT_SURVIVORS
    z = NormalDist().inv_cdf(1.0 - FALSE_REPORT_RATE / k)
    _, _, a, b = spec0.mechanism.estimator.moments(spec0.mechanism.weight_law())
    n_verification = np.array([r["n_verification"] for r in runs], np.float64)
    computed = float(np.nanmean(floors))
    reached = np.array([r["reached"] for r in runs])  # (sims, TRACK): rounds each rank was a candidate in
    chances = survival_chances(zipf, n, epsilon)
    top = zipf.shares[:TOP]
    verified = [NormalDist().cdf(x) for x in (top - computed) / np.sqrt((b + (a - b) * top - top**2) / (n / ROUNDS))]
    survival = []
    for rank in SURVIVAL_RANKS:
        i = rank - 1
        share = float(zipf.shares[i])
        sd = math.sqrt((b + (a - b) * share - share**2) / (n / ROUNDS))
        survival.append(
            {
                "rank": rank,
                "share": share,
                "measured_per_round": [
                    float(np.mean(reached[reached[:, i] >= r + 1, i] >= r + 2))
                    if (reached[:, i] >= r + 1).any()
                    else None
                    for r in range(ROUNDS - 1)
                ],
                "computed_per_round": chances[:, i].tolist(),
                "measured_all_rounds": float(np.mean(reached[:, i] == ROUNDS)),
                "computed_all_rounds": float(chances[:, i].prod()),
                "measured_found": float(per_rank[:, i].mean()),
                "computed_found": float(chances[:, i].prod()) * NormalDist().cdf((share - computed) / sd),
            }
        )
    seconds = np.array([r["seconds"] for r in runs])
    return {
        "n": n,
        "epsilon": epsilon,
        "buckets": spec0.mechanism.buckets,
        "simulations": sims,
        "recall_top20": float(per_rank[:, :TOP].mean()),
        "recall_top20_min_per_simulation": float(per_rank[:, :TOP].mean(axis=1).min()),
        # survival_chances' through the rounds before the verification, times the chance of clearing the floor
        "recall_top20_computed": float(np.mean(chances[:, :TOP].prod(axis=0) * verified)),
        # the same had every top-20 value reached the verification: what the floor alone costs
        "recall_top20_floor_alone": float(np.mean(verified)),
        "found_by_rank": [round(float(x), 4) for x in per_rank.mean(axis=0)],
        "reported_per_simulation": len(found) / sims,
        "precision_real_above_half_floor": real / len(found) if found else None,
        "precision_strict_top20": strict / len(found) if found else None,
        "precision_largest20_in_top20": listed_strict / len(listed) if listed else None,
        "coverage_pooled": float(np.mean(pooled)) if pooled else None,
        "coverage_intervals": len(pooled),
        "coverage_min": often[worst] if worst is not None else None,
        "coverage_min_rank": worst + 1 if worst is not None else None,
        "coverage_min_appearances": len(covered[worst]) if worst is not None else None,
        "coverage_ranks_reported": len(often),
        "floor_computed": computed,
        "floor_computed_at_n_over_rounds": detection_floor(verification_spec(epsilon), round(n / ROUNDS)),
        "floor_measured": z * float(nulls.std()) if nulls.size > 1 else None,
        "null_candidates": int(nulls.size),
        "null_mean": float(nulls.mean()) if nulls.size else None,
        "null_above_floor": float(np.mean(nulls > computed)) if nulls.size else None,
        "null_above_floor_nominal": FALSE_REPORT_RATE / k,
        "reports_verification_mean": float(n_verification.mean()),
        "survival": survival,
        "server_seconds_median": float(np.median(seconds)),
        "server_seconds_max": float(seconds.max()),
        "server_seconds_mean": float(seconds.mean()),
        "report_bytes": 4 * REPORT_WORDS,
    }


def verification_spec(epsilon: float) -> MetricSpec:
    """A verification round of DEFAULT_SURVIVORS codes (its floor depends on k, g and epsilon)."""
    parents = tuple(i.to_bytes(CODE_BYTES, "big") for i in range(DEFAULT_SURVIVORS))
    return MetricSpec.strings_round(
        StringsRound(METRIC, ROUNDS - 1, buckets_for(epsilon_to_gamma(epsilon)), parents), epsilon
    )


# --- output --------------------------------------------------------------------------------------


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def table(cells: list[dict[str, Any]]) -> str:
    lines = [
        "| n | eps | g | sims | recall top 20 (computed) | precision (a) | precision (b) | precision (c) | reported "
        "| coverage pooled "
        "| coverage min (rank, times) | floor computed | floor measured (codes) | null above floor "
        "| server s median / max | report |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        worst = (
            f"{_pct(c['coverage_min'])} (#{c['coverage_min_rank']}, {c['coverage_min_appearances']})"
            if c["coverage_min"] is not None
            else "-"
        )
        lines.append(
            f"| {c['n']:,} | {c['epsilon']:g} | {c['buckets']} | {c['simulations']} "
            f"| {_pct(c['recall_top20'])} ({_pct(c['recall_top20_computed'])}) | "
            f"{_pct(c['precision_real_above_half_floor'])} | {_pct(c['precision_strict_top20'])} | "
            f"{_pct(c['precision_largest20_in_top20'])} | "
            f"{c['reported_per_simulation']:.1f} | {_pct(c['coverage_pooled'])} | {worst} | "
            f"{_pct(c['floor_computed'], 3)} | {_pct(c['floor_measured'], 3)} ({c['null_candidates']:,}) | "
            f"{_pct(c['null_above_floor'], 2)} | "
            f"{c['server_seconds_median']:.2f} / {c['server_seconds_max']:.2f} | {c['report_bytes']} B |"
        )
    return "\n".join(lines)


def survival_table(c: dict[str, Any]) -> str:
    """Per rank: its share, the chance of surviving each round measured / computed, of reaching
    the verification round and of being found."""
    lines = [
        f"n = {c['n']:,}, epsilon {c['epsilon']:g}, {c['simulations']} simulations; per round: measured / computed.",
        "",
        "| rank | share | "
        + " | ".join(f"round {r}" for r in range(ROUNDS - 1))
        + " | reaches the verification | found |",
        "|---:|---:|" + "---:|" * (ROUNDS - 1) + "---:|---:|",
    ]
    for row in c["survival"]:
        rounds = [
            f"{'-' if m is None else f'{m:.2f}'} / {x:.2f}"
            for m, x in zip(row["measured_per_round"], row["computed_per_round"])
        ]
        lines.append(
            f"| {row['rank']} | {100 * row['share']:.3f}% | "
            + " | ".join(rounds)
            + f" | {row['measured_all_rounds']:.3f} / {row['computed_all_rounds']:.3f} "
            f"| {row['measured_found']:.3f} / {row['computed_found']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: n = 10^5, 3 simulations, into results/quick/"
    )
    parser.add_argument("--sims", type=int, default=200, help="simulations per cell at n = 10^6 (default 200)")
    parser.add_argument("--large-sims", type=int, default=50, help="simulations at n = 10^7 (default 50)")
    parser.add_argument("--output", type=Path, help="the results file (default bench/results/discovery.json)")
    parser.add_argument(
        "--update-docs", action="store_true", help="put the tables into bench/README.md and docs/math.md 10"
    )
    parser.add_argument(
        "--summarize", action="store_true", help="summarize the simulations kept from the last run again (no new ones)"
    )
    parser.add_argument(
        "--cells", nargs="+", metavar="N:EPSILON", help="these cells only (e.g. 10000000:4), with their simulations"
    )
    args = parser.parse_args(argv)
    grid = [(int(n), float(e)) for n, e in (c.split(":") for c in args.cells)] if args.cells else list(CELLS)
    if args.quick:
        cells = [(100_000, 4.0, 3)]
    else:
        cells = [(n, e, args.large_sims if n > 1_000_000 else args.sims) for n, e in grid]
    output = args.output or (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR) / "discovery.json"
    zipf = Zipf()
    started = time.perf_counter()
    _warm_up()
    # Summarizing again keeps the simulating run's machine; each cell keeps the command that simulated it.
    ran = json.loads(output.read_text()) if args.summarize and output.exists() else {}
    command = " ".join(["bench/bench_discovery.py", *(sys.argv[1:] if argv is None else argv)])
    done: list[dict[str, Any]] = []
    for n, epsilon, sims in cells:
        if args.summarize:
            kept = json.loads(_runs_file(n, epsilon).read_text())
            done.append(
                {**summarize(zipf, n, epsilon, kept["runs"]), "command": kept.get("command", ran.get("command"))}
            )
        else:
            seed = SEED + CELLS.index((n, epsilon)) if (n, epsilon) in CELLS else SEED + n + round(100 * epsilon)
            done.append({**cell(zipf, n, epsilon, sims, seed, command), "command": command})
        write_results(
            output,
            {
                "what": "strings metrics: discovery of Zipf(1.1) values over 2^64 by seven rounds of hashed "
                "reports (bench/bench_discovery.py)",
                "command": command,
                "population": {"law": f"Zipf({EXPONENT}) over 2^64 values", "explicit_ranks": EXPLICIT},
                "survivors": DEFAULT_SURVIVORS,
                "seed": SEED,
                "machine": ran.get("machine") or machine_info(("numpy", "numba")),
                "cells": done,
                "seconds": round(time.perf_counter() - started, 1),
            },
        )
    text = table(done)
    print(text)
    if args.update_docs:
        replace_marked(README, *TABLE_MARKS, text)
        replace_marked(MATH_DOC, *SURVIVAL_MARKS, survival_table(done[0]))
        replace_marked(MATH_DOC, *TABLE_MARKS, text)
    return 0


def _warm_up() -> None:
    """Compile the kernel before any clock runs (numba's cache may be cold)."""
    spec = MetricSpec.strings_round(first_round(METRIC, 16), 4.0)
    counts = Counts.zeros(spec.mechanism)
    count_hashed(spec, np.zeros((1, REPORT_WORDS), np.uint32), counts)


if __name__ == "__main__":
    raise SystemExit(main())
