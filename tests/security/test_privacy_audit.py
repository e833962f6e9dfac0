"""An empirical audit of local differential privacy, through the SDK's own randomization.

epsilon-LDP says: for any two true values x, x' and every set E of reports,
P(Z in E | X = x) <= e^epsilon P(Z in E | X = x')  (docs/math.md: parity eta(P) <= gamma).
So the audit draws many reports of x and of x' and bounds P(E | x) / P(E | x') from below with
exact (Clopper-Pearson) binomial bounds, Bonferroni-corrected over every event and direction
tested: a lower confidence bound above gamma proves a violation at family-wise level ALPHA.

Which events. Where the design has few outputs (at most FULL_OUTPUTS) every single output is an
event. Where it has too many to estimate one by one (the q-subset design at k = 32 has 2.3e8
outputs, RAPPOR at k = 16 65536), the reports are projected onto the pair of bits (x in Z,
x' in Z), four events. That loses nothing where it matters: for every design here the
likelihood ratio of a report between x and x' depends on those two bits alone (a q-subset report
has probability gamma s or s as it contains the true value or not; a RAPPOR report's bits are
independent and only bits x and x' differ in law, and the redrawn all-zeros / all-ones reports
of admissible RAPPOR have the same probability under every value). The projection is
sufficient for the pair, so the worst ratio over all events, gamma, is attained by the event
"contains x, not x'" (and "contains x', not x" the other way round): the test is sharp. Any
event's ratio is at most e^epsilon under LDP (post-processing), so a projected event whose
ratio is significantly above gamma is a violation whatever the rest of the report does; an
implementation bug that leaks only through other categories would be missed by the projection,
which is why the small designs are audited output by output too.

What each audit asserts, for two true values x != x' of every mechanism at a few (k, epsilon):
- no significant violation: the largest lower confidence bound of any event's ratio is <= gamma;
- sharpness: the two sharp events' ratios are consistent with the design's realized parity
  (a two-sided interval holds it), so the mechanism spends its budget as designed;
- power: had the sharp ratio been larger, by POWER[...] (10% at 10^7 draws, a gross 60% at the
  default run's 5 * 10^4), the lower bound would have exceeded gamma with probability at least
  1 - 10^-6 (a normal approximation of the bound's sampling spread). Deliberately leaky copies
  of the mechanisms are flagged: ratio 1.03 gamma through the kernels at 10^7 draws (default
  run), 1.1 gamma through randomize at 2 * 10^5 (slow: 4 * 10^5 draws of each of four designs
  in pure Python, which 5 * 10^4 cannot tell apart reliably), as is pure-LDP's OUE from before
  its issue #11 fix.

The draws: the SDK's Reporter.report randomizes with ``spec.mechanism.randomize(index, source)``,
the source a veil.mechanism SystemRandomSource (``os.urandom``, the OS CSPRNG), randomize's
default; test_the_sdk_randomizes_through_the_os_csprng checks that on the real path. The audit
calls exactly that bound method, with its default source, on the mechanism the SDK builds from
the aggregator's spec (spec_from_proto), in two processes. The numba batch kernels with the
AES-CTR keystream, proven word for word equal to ``randomize`` (tests/aggregator/test_kernels.py),
carry the default run's 10^7 draws per value; the same 10^7 in pure Python is marked slow.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import multiprocessing
import os
import random
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from veil.aggregator.simulate import AesCtrKeystream, simulate_reports
from veil.aggregator.store import CountsKey
from veil.client import Reporter, spec_from_proto, spec_to_proto
from veil.mechanism import (
    AdmissibleRapporSpec,
    KrrSpec,
    MechanismSpec,
    MetricSpec,
    RapporSpec,
    SubsetSpec,
    SystemRandomSource,
    WordRandomSource,
    _random,
)
from veil.mechanism._specs import ONE64

pytestmark = pytest.mark.starts_first  # a minute or more: 10^7 draws per audit

ALPHA = 1e-6  # family-wise error of each audit: the OS CSPRNG cannot be seeded, so keep it tiny
FULL_OUTPUTS = 128  # designs with at most this many outputs are audited output by output too
DEFAULT_DRAWS = 50_000  # per true value, pure Python, default run
LEAKY_DRAWS = 200_000  # per true value, pure Python, the ten-percent leaks (slow)
FULL_DRAWS = 10_000_000  # per true value: the numba kernels (default run) and pure Python (slow)
POWER = {DEFAULT_DRAWS: 1.60, FULL_DRAWS: 1.10}  # the excess ratio each run must be able to see
POWER_Z = 4.753  # one-sided normal quantile of 1 - 10^-6
WORKERS = 2


@dataclass(frozen=True)
class Case:
    mechanism: str
    k: int
    epsilon: float
    x: int
    other: int  # x'

    @property
    def id(self) -> str:
        return f"{self.mechanism}-k{self.k}-eps{self.epsilon}-{self.x}vs{self.other}"


CASES = [
    Case("warner", 2, 0.5, 0, 1),
    Case("warner", 2, 2.0, 1, 0),
    Case("krr", 6, 1.0, 0, 5),
    Case("krr", 32, 0.5, 3, 31),
    Case("subset", 8, 1.0, 0, 7),  # q = 2, 28 outputs
    Case("subset", 16, 2.0, 15, 0),  # q = 2, 120 outputs
    Case("subset", 32, 0.5, 0, 31),  # q = 12, 2.3e8 outputs: projected
    Case("rappor", 4, 1.0, 0, 3),
    Case("rappor", 16, 0.5, 0, 15),  # projected
    Case("rappor-admissible", 4, 2.0, 3, 0),
    Case("rappor-admissible", 16, 1.0, 5, 10),  # projected
]


def sdk_mechanism(case: Case) -> MechanismSpec:
    """The mechanism object a Reporter holds for this metric: the aggregator's spec on the wire,
    rebuilt by the SDK."""
    metric = MetricSpec.create("audited", [f"c{j}" for j in range(case.k)], case.mechanism, case.epsilon)
    return spec_from_proto(spec_to_proto(metric)).mechanism


# --- deliberately leaky mechanisms: the audit must flag them ------------------------------


class LeakySubset(SubsetSpec):
    """The q-subset design keeping the true value as if gamma were `leak` times larger."""

    leak = 1.10

    @cached_property
    def keep_threshold(self) -> int:
        g, q, k = self.gamma * self.leak, self.q, self.k
        return math.floor(ONE64 * q * g / (q * g + k - q))


class LeakyKrr(KrrSpec):
    leak = 1.10
    keep_threshold = LeakySubset.keep_threshold


class LeakyRappor(RapporSpec):
    """RAPPOR flipping each bit as if gamma were `leak` times larger."""

    leak = 1.10

    @cached_property
    def flip_threshold(self) -> int:
        return math.ceil(ONE64 / (math.sqrt(self.gamma * self.leak) + 1.0))


class LeakyAdmissibleRappor(AdmissibleRapporSpec):
    leak = 1.10
    flip_threshold = LeakyRappor.flip_threshold


class SlightlyLeakySubset(LeakySubset):
    leak = 1.03


class SlightlyLeakyRappor(LeakyRappor):
    leak = 1.03


LEAKY = {
    cls.__name__: cls
    for cls in (LeakySubset, LeakyKrr, LeakyRappor, LeakyAdmissibleRappor, SlightlyLeakySubset, SlightlyLeakyRappor)
}
LEAKY_CASES = [
    ("LeakyKrr", Case("krr", 6, 1.0, 0, 5)),
    ("LeakySubset", Case("subset", 32, 0.5, 0, 31)),
    ("LeakyRappor", Case("rappor", 16, 0.5, 0, 15)),
    ("LeakyAdmissibleRappor", Case("rappor-admissible", 4, 2.0, 3, 0)),
]
SLIGHTLY_LEAKY_CASES = [
    ("SlightlyLeakySubset", Case("subset", 32, 0.5, 0, 31)),
    ("SlightlyLeakyRappor", Case("rappor", 16, 0.5, 0, 15)),
]


def mechanism_of(case: Case, leaky: str | None) -> MechanismSpec:
    return sdk_mechanism(case) if leaky is None else LEAKY[leaky](case.k, case.epsilon)


def is_full(spec: MechanismSpec) -> bool:
    return spec.outputs <= FULL_OUTPUTS


# --- drawing: the SDK's randomize in worker processes, and the batch kernels -----------------


def mask_of(report: Iterable[int]) -> int:
    return sum(1 << j for j in report)


def draw_counts(case: Case, leaky: str | None, value: int, n: int) -> dict[int, int]:
    """n reports of `value` from spec.randomize with its default source (the OS CSPRNG), as
    the SDK calls it: {output bit mask: count} for a small design, else {cell: count} with
    cell = 2 [x in Z] + [x' in Z]."""
    spec = mechanism_of(case, leaky)
    randomize = spec.randomize  # the call Reporter._randomize makes: randomize(index)
    reports = map(randomize, repeat(value, n))
    if is_full(spec):
        return {mask_of(report): count for report, count in Counter(reports).items()}
    x, other = case.x, case.other
    return dict(Counter((x in report) * 2 + (other in report) for report in reports))


def pure_python_counts(
    pool: ProcessPoolExecutor, jobs: list[tuple[Case, str | None]], n: int
) -> dict[tuple[Case, str | None], tuple[Counter, Counter]]:
    """Counts of n draws of x and of x' for every job, spread over the pool in chunks."""
    chunk = max(1, min(n, 250_000))
    futures = []
    for case, leaky in jobs:
        for side, value in enumerate((case.x, case.other)):
            for start in range(0, n, chunk):
                future = pool.submit(draw_counts, case, leaky, value, min(chunk, n - start))
                futures.append(((case, leaky), side, future))
    results: dict = {job: (Counter(), Counter()) for job in jobs}
    for job, side, future in futures:
        results[job][side].update(future.result())
    return results


def kernel_counts(case: Case, leaky: str | None, value: int, n: int, chunk: int = 1 << 20) -> dict[int, int]:
    """As draw_counts, through simulate_reports on a fresh AES-256-CTR keystream."""
    spec = mechanism_of(case, leaky)
    stream = AesCtrKeystream()
    full = is_full(spec)
    counts: Counter = Counter()
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        reports = simulate_reports(spec, np.full(m, value, np.int64), keystream=stream)
        if spec.q is not None:  # (m, q) sorted category indices
            rows = reports.astype(np.int64)
            if full:
                keys = (np.int64(1) << rows).sum(axis=1)  # distinct bits: the sum is the mask
            else:
                keys = (rows == case.x).any(axis=1) * 2 + (rows == case.other).any(axis=1)
        else:  # (m, ceil(k / 8)) little-endian bitmaps
            if full:
                keys = sum(reports[:, i].astype(np.int64) << (8 * i) for i in range(reports.shape[1]))
            else:

                def bit(j: int) -> np.ndarray:
                    return (reports[:, j // 8] >> (j % 8)) & 1  # noqa: B023 (called within this iteration)

                keys = bit(case.x).astype(np.int64) * 2 + bit(case.other)
        found, tallies = np.unique(keys, return_counts=True)
        counts.update(dict(zip(found.tolist(), tallies.tolist())))
    return dict(counts)


# --- the statistics -------------------------------------------------------------------------


def cp_lower(a: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """Clopper-Pearson one-sided lower bound of a binomial proportion at level alpha."""
    a = np.asarray(a, float)
    return np.where(a > 0, stats.beta.ppf(alpha, np.maximum(a, 1), n - a + 1), 0.0)


def cp_upper(a: np.ndarray, n: int, alpha: float) -> np.ndarray:
    a = np.asarray(a, float)
    return np.where(a < n, stats.beta.ppf(1 - alpha, a + 1, np.maximum(n - a, 1)), 1.0)


@dataclass
class Audit:
    label: str
    gamma: float
    parity: float
    draws: int
    events: int
    hypotheses: int
    worst_ratio: float  # the largest point estimate of any event's ratio, either direction
    worst_event: str
    worst_lower: float  # the largest lower confidence bound of any ratio
    sharp: list[tuple[float, float, float]]  # (estimate, lower, upper) of the two sharp ratios
    detectable: float  # the smallest sharp ratio / gamma flagged with probability 1 - 10^-6
    outputs_seen: int

    @property
    def violation(self) -> bool:
        return self.worst_lower > self.gamma

    def __str__(self) -> str:
        (r1, lo1, hi1), (r2, lo2, hi2) = self.sharp
        return (
            f"{self.label}: gamma {self.gamma:.4f}; worst ratio {self.worst_ratio:.4f} ({self.worst_event}), "
            f"its lower bound {self.worst_lower:.4f}; sharp ratios {r1:.4f} [{lo1:.4f}, {hi1:.4f}] and "
            f"{r2:.4f} [{lo2:.4f}, {hi2:.4f}]; detects {100 * (self.detectable - 1):.1f}% excess; "
            f"{self.events} events, {self.hypotheses} hypotheses, {self.draws:,} draws per value"
        )


def cells_of(counts: dict[int, int], case: Case, full: bool) -> Counter:
    if not full:
        return Counter(counts)
    cells: Counter = Counter()
    for mask, count in counts.items():
        cells[(mask >> case.x & 1) * 2 + (mask >> case.other & 1)] += count
    return cells


def audit(
    label: str,
    case: Case,
    spec: MechanismSpec,
    counts_x: dict[int, int],
    counts_other: dict[int, int],
    n: int,
    gamma: float | None = None,
    parity: float | None = None,
    full: bool | None = None,
) -> Audit:
    """The ratio bounds of every event between x and x' (see the module docstring)."""
    gamma = spec.gamma if gamma is None else gamma
    parity = spec.parity if parity is None else parity
    full = is_full(spec) if full is None else full
    assert sum(counts_x.values()) == n and sum(counts_other.values()) == n
    names: list[str] = []
    a: list[int] = []
    b: list[int] = []
    if full:
        for mask in sorted(set(counts_x) | set(counts_other)):
            names.append("Z = {" + ",".join(str(j) for j in range(spec.k) if mask >> j & 1) + "}")
            a.append(counts_x.get(mask, 0))
            b.append(counts_other.get(mask, 0))
    cx, co = cells_of(counts_x, case, full), cells_of(counts_other, case, full)
    cell_names = {0: "neither", 1: "x' not x", 2: "x not x'", 3: "both"}
    for cell in range(4):
        names.append(f"cell {cell_names[cell]}")
        a.append(cx.get(cell, 0))
        b.append(co.get(cell, 0))
    a_, b_ = np.array(a, float), np.array(b, float)
    m = 2 * len(names)  # every event, both directions
    # Lower bound of p_top / p_bottom: each proportion's one-sided bound at ALPHA / (2 m).
    each = ALPHA / (2 * m)
    lower_xy = cp_lower(a_, n, each) / cp_upper(b_, n, each)
    lower_yx = cp_lower(b_, n, each) / cp_upper(a_, n, each)
    with np.errstate(divide="ignore", invalid="ignore"):
        point_xy, point_yx = a_ / b_, b_ / a_
    lowers = np.concatenate([lower_xy, lower_yx])
    points = np.concatenate([point_xy, point_yx])
    labels = [f"{e}, x/x'" for e in names] + [f"{e}, x'/x" for e in names]
    finite = np.isfinite(points)
    worst = int(np.argmax(np.where(finite, points, -np.inf)))
    # The sharp events: "x not x'" (cell 2) for x/x', "x' not x" (cell 1) for x'/x.
    sharp, detectable = [], 0.0
    two_sided = ALPHA / 8  # two sharp ratios, two-sided, two proportions each
    for top, bottom in ((cx.get(2, 0), co.get(2, 0)), (co.get(1, 0), cx.get(1, 0))):
        ratio = top / bottom
        low = float(cp_lower(top, n, two_sided) / cp_upper(bottom, n, two_sided))
        high = float(cp_upper(top, n, two_sided) / cp_lower(bottom, n, two_sided))
        sharp.append((ratio, low, high))
        # The violation bound's distance below the estimate, in log space, and the estimate's
        # own spread: a true ratio of gamma * exp(half + POWER_Z * se) puts the bound above
        # gamma with probability 1 - 10^-6.
        half = math.log(ratio) - math.log(float(cp_lower(top, n, each) / cp_upper(bottom, n, each)))
        se = math.sqrt((n - top) / (n * top) + (n - bottom) / (n * bottom))
        detectable = max(detectable, math.exp(half + POWER_Z * se))
    return Audit(
        label,
        gamma,
        parity,
        n,
        len(names),
        m,
        float(points[worst]),
        labels[worst],
        float(lowers.max()),
        sharp,
        detectable,
        len(names) - 4 if full else 4,
    )


def check_admissible_audit(result: Audit, spec: MechanismSpec, power: float) -> None:
    print(result)
    assert not result.violation, f"LDP violation: {result}"
    for _ratio, low, high in result.sharp:
        assert low <= result.parity <= high, f"the sharp ratio is not the design's: {result}"
    assert result.detectable <= power, f"too little power: {result}"
    if is_full(spec):
        assert result.outputs_seen == spec.outputs, "an output outside the design, or one never drawn"


# --- the audits -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    # spawn: fresh interpreters, nothing inherited from this process's threads (gRPC, numba).
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


@pytest.fixture(scope="module")
def default_draws(pool):
    return pure_python_counts(pool, [(case, None) for case in CASES], DEFAULT_DRAWS)


@pytest.fixture(scope="module")
def leaky_draws(pool):
    return pure_python_counts(pool, [(case, leaky) for leaky, case in LEAKY_CASES], LEAKY_DRAWS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sdk_randomize_passes_the_audit(case, default_draws, tally):
    """5 * 10^4 draws per value through the SDK's randomize: no violation, sharp, gross power."""
    spec = sdk_mechanism(case)
    counts_x, counts_other = default_draws[case, None]
    result = audit(f"sdk {case.id}", case, spec, counts_x, counts_other, DEFAULT_DRAWS)
    tally["privacy audit: SDK randomize draws (default run)"] += 2 * DEFAULT_DRAWS
    check_admissible_audit(result, spec, POWER[DEFAULT_DRAWS])


@pytest.mark.slow
@pytest.mark.parametrize(("leaky", "case"), LEAKY_CASES, ids=[f"{n}-{c.id}" for n, c in LEAKY_CASES])
def test_a_mechanism_leaking_ten_percent_is_flagged(leaky, case, leaky_draws):
    spec = LEAKY[leaky](case.k, case.epsilon)
    assert spec.parity == pytest.approx(1.10 * spec.gamma, rel=1e-9)
    counts_x, counts_other = leaky_draws[case, leaky]
    result = audit(f"{leaky} {case.id}", case, spec, counts_x, counts_other, LEAKY_DRAWS)
    print(result)
    assert result.violation, result


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_batch_kernels_pass_the_audit_at_ten_million(case, tally):
    """10^7 draws per value through the kernels on AES-CTR (randomize word for word)."""
    spec = sdk_mechanism(case)
    counts_x = kernel_counts(case, None, case.x, FULL_DRAWS)
    counts_other = kernel_counts(case, None, case.other, FULL_DRAWS)
    result = audit(f"kernels {case.id}", case, spec, counts_x, counts_other, FULL_DRAWS)
    tally["privacy audit: kernel draws (AES-CTR)"] += 2 * FULL_DRAWS
    check_admissible_audit(result, spec, POWER[FULL_DRAWS])


@pytest.mark.parametrize(("leaky", "case"), SLIGHTLY_LEAKY_CASES, ids=[f"{n}-{c.id}" for n, c in SLIGHTLY_LEAKY_CASES])
def test_a_mechanism_leaking_three_percent_is_flagged_at_ten_million(leaky, case):
    spec = LEAKY[leaky](case.k, case.epsilon)
    counts_x = kernel_counts(case, leaky, case.x, FULL_DRAWS)
    counts_other = kernel_counts(case, leaky, case.other, FULL_DRAWS)
    result = audit(f"kernels {leaky} {case.id}", case, spec, counts_x, counts_other, FULL_DRAWS)
    print(result)
    assert result.violation, result


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sdk_randomize_passes_the_audit_at_ten_million(case, pool, tally):
    spec = sdk_mechanism(case)
    counts_x, counts_other = pure_python_counts(pool, [(case, None)], FULL_DRAWS)[case, None]
    result = audit(f"sdk {case.id}", case, spec, counts_x, counts_other, FULL_DRAWS)
    tally["privacy audit: SDK randomize draws (slow)"] += 2 * FULL_DRAWS
    check_admissible_audit(result, spec, POWER[FULL_DRAWS])


# --- pure-LDP's OUE: the audit catches its issue #11 ------------------------------------------


def load_ue_client() -> type:
    """pure-ldp's UEClient. Importing pure_ldp.frequency_oracles imports every oracle, one of
    which needs scikit-learn (not a pure-ldp dependency); the unary encoding module is loaded
    from its file where that fails, as bench/bench_randomize.py does."""
    pytest.importorskip("pure_ldp")
    try:
        from pure_ldp.frequency_oracles.unary_encoding import UEClient

        return UEClient
    except ModuleNotFoundError as missing:
        if missing.name != "sklearn":
            raise
    import pure_ldp

    path = Path(pure_ldp.__file__).parent / "frequency_oracles" / "unary_encoding" / "ue_client.py"
    spec = importlib.util.spec_from_file_location("_audit_pure_ldp_ue_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UEClient


def pre_fix_oue(ue_client: type) -> type:
    class PreFixUEClient(ue_client):
        """UEClient._perturb as pure-LDP shipped it before fc622e3 (issue #11, found by
        Arcolezi and Gambs' LDP auditing, arXiv:2309.01597): every bit, the user's own included,
        is drawn as 1 with probability q, and then the user's bit is set to 1 with probability p
        but never cleared. So the user's bit is 1 with probability p + (1 - p) q instead of p,
        and the report "bit x set, bit x' clear" has ratio
        (p + (1 - p) q)(1 - q) / (q (1 - p)(1 - q)) = 1 + 1/q = e^epsilon + 2 at OUE's p = 1/2,
        q = 1 / (e^epsilon + 1). The fix clears the user's bit before the draw with p."""

        def _perturb(self, index):
            bits = np.random.choice([1, 0], size=self.d, p=[self.q, 1 - self.q])
            if random.random() < self.p:
                bits[index] = 1
            return bits

    return PreFixUEClient


def oue_counts(client, value: int, case: Case, n: int) -> dict[int, int]:
    """Cells of n reports: pure-ldp's items are 1..d (its default index_mapper is item - 1)."""
    counts: Counter = Counter()
    for _ in range(n):
        bits = client.privatise(value + 1)
        counts[int(bits[case.x]) * 2 + int(bits[case.other])] += 1
    return dict(counts)


OUE_DRAWS = 30_000


@pytest.mark.parametrize("epsilon", [0.5, 1.0])
@pytest.mark.parametrize("version", ["installed", "before-issue-11-fix"])
def test_pure_ldp_oue(version, epsilon):
    ue_client = load_ue_client()
    client_class = ue_client if version == "installed" else pre_fix_oue(ue_client)
    client = client_class(epsilon, 8, use_oue=True)
    case = Case("oue", 8, epsilon, 2, 6)
    # pure-ldp draws from numpy's and random's global generators: seeded here, and put back.
    saved = np.random.get_state(), random.getstate()
    np.random.seed(11)
    random.seed(11)
    try:
        counts_x = oue_counts(client, case.x, case, OUE_DRAWS)
        counts_other = oue_counts(client, case.other, case, OUE_DRAWS)
    finally:
        np.random.set_state(saved[0])
        random.setstate(saved[1])
    gamma = math.exp(epsilon)
    probe = KrrSpec(8, epsilon)  # any spec: the projected audit only needs k
    result = audit(
        f"pure-ldp OUE {version} eps={epsilon}",
        case,
        probe,
        counts_x,
        counts_other,
        OUE_DRAWS,
        gamma=gamma,
        parity=gamma,
        full=False,
    )
    print(result)
    if version == "installed":
        # pure-ldp 1.2.0 has the fix: OUE's "bit x set, bit x' clear" has ratio exactly e^epsilon.
        assert not result.violation, result
        assert all(low <= gamma <= high for _, low, high in result.sharp), result
    else:
        assert result.violation, result
        assert result.worst_ratio == pytest.approx(gamma + 2, rel=0.1)


# --- the SDK's default random source ------------------------------------------------------------


class Recorder:
    """Wraps a function and counts the calls made from one thread."""

    def __init__(self, function: Callable, thread: int, replacement: Callable | None = None) -> None:
        self.function, self.thread, self.replacement, self.calls = function, thread, replacement, 0

    def __call__(self, *args):
        if threading.get_ident() == self.thread:
            self.calls += 1
            if self.replacement is not None:
                return self.replacement(*args)
        return self.function(*args)


def store_counts(aggregator, name: str):
    metric = aggregator.config.metric(name)
    mechanism = metric.spec.mechanism
    key = CountsKey(name, metric.spec.fingerprint, "total", 0)
    return aggregator.store.read(key, mechanism.weight_law().weights, mechanism.k)


def reporter_for(aggregator) -> Reporter:
    # Every SDK default that touches randomization: no random_source, memoize on.
    reporter = Reporter(f"127.0.0.1:{aggregator.grpc_port}", tls=False, schedule_delay_ms=20)
    assert reporter.wait_for_specs(10)
    return reporter


def test_the_sdk_randomizes_through_the_os_csprng(start_frozen_aggregator, monkeypatch):
    """Reporter.report -> mechanism.randomize(index) with a SystemRandomSource (the default
    source, or one passed as such) -> os.urandom, checked on the calls report() makes: with
    every thread's block of OS words forgotten first, each report reads a fresh block from the
    OS on the calling thread."""
    aggregator = start_frozen_aggregator()
    thread = threading.get_ident()
    try:
        with reporter_for(aggregator) as reporter:
            for name, metric in reporter.metrics.items():
                kind = type(metric.mechanism)
                assert isinstance(inspect.signature(kind.randomize).parameters["source"].default, SystemRandomSource)
                original = kind.randomize
                seen: list[tuple[tuple, dict, tuple]] = []

                def spy(self, *args, _original=original, _seen=seen, **kwargs):
                    result = _original(self, *args, **kwargs)
                    _seen.append((args, kwargs, result))
                    return result

                sizes: list[int] = []
                urandom = Recorder(os.urandom, thread, lambda n, _real=os.urandom: sizes.append(n) or _real(n))  # noqa: B023 (used within this iteration)
                with monkeypatch.context() as patch:
                    patch.setattr(kind, "randomize", spy)
                    patch.setattr(os, "urandom", urandom)
                    _random._forget_blocks()
                    before = store_counts(aggregator, name)
                    reporter.report(name, metric.labels[1])
                assert len(seen) == 1 and seen[0][0][0] == 1 and not seen[0][1], seen
                assert all(isinstance(source, SystemRandomSource) for source in seen[0][0][1:]), seen  # or the default
                report = seen[0][2]
                assert 4 * _random._BLOCK_WORDS in sizes, (name, sizes)  # a block of words from the OS
                assert reporter.force_flush(10)
                after = store_counts(aggregator, name)
                assert after.total == before.total + 1
                assert (after.totals - before.totals).tolist() == [int(j in report) for j in range(metric.k)]
    finally:
        _random._forget_blocks()


def test_the_sdk_report_is_determined_by_the_os_words_alone(start_frozen_aggregator, monkeypatch):
    """With os.urandom answering fixed bytes, every report the SDK sends is the one randomize
    makes from the same words: no other source of randomness takes part."""
    aggregator = start_frozen_aggregator()
    thread = threading.get_ident()
    try:
        for seed in (1, 2):
            block = random.Random(seed).randbytes(4 * _random._BLOCK_WORDS)
            words = array("I", block) * 64  # the blocks a report reads, one after another
            with reporter_for(aggregator) as reporter:
                for name, metric in reporter.metrics.items():
                    expected = metric.mechanism.randomize(1, WordRandomSource(words))
                    with monkeypatch.context() as patch:
                        patch.setattr(os, "urandom", Recorder(os.urandom, thread, lambda n, _b=block: _b[:n]))
                        _random._forget_blocks()
                        before = store_counts(aggregator, name)
                        reporter.report(name, 1)
                    _random._forget_blocks()  # the fixed words stay in no block
                    assert reporter.force_flush(10)
                    delta = store_counts(aggregator, name).totals - before.totals
                    assert delta.tolist() == [int(j in expected) for j in range(metric.k)], (name, seed)
    finally:
        _random._forget_blocks()
