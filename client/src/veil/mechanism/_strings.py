"""Strings metrics: finding the frequent values of an open dictionary (docs/math.md 10).

A string becomes a 6-byte (``CODE_BYTES``) **code** (``string_code``): itself when its UTF-8 bytes
number 6 or fewer (zero-padded, so it reads back as text), otherwise the byte 0xFF and 5 bytes of
its SHA-256 (0xFF is never a byte of UTF-8 text, so a hashed code never equals a short string's).

The aggregator finds the frequent codes by prefix extension (PEM; Wang et al., TDSC 2019) in
``ROUNDS`` = 7 rounds: round r (0..5) estimates the shares of the (r+1)-byte prefixes that extend
the prefixes that survived round r-1 by one byte; round 6 (``ROUNDS - 1``) re-estimates the
survivors' full codes from devices that took no part in choosing them, so its intervals are those
of a declared category. Each device answers one round, fixed by its secret (a round hears about
n/7 devices), so a device's answer is one report and nothing composes.

A round's report is **local hashing** (Wang et al., USENIX Security 2017, "OLH"): the device
draws a hash h from a pairwise-independent family over byte strings, h(u) = (c + sum_i a_i u_i)
mod P with P = 2^31 - 1 and a_0..a_5, c uniform in [0, P), and sends h's seven coefficients with
its prefix's bucket h(u) mod g randomized by k-ary randomized response over the g buckets. The
report is ``REPORT_WORDS`` = 8 words, 32 bytes, at every epsilon, and it does not depend on the
round's candidates: the aggregator counts, for each candidate, the reports whose bucket is the
candidate's under the report's hash (``HashedSpec.support``).

Privacy: given the hash (drawn independently of the value), the bucket is k-RR over g buckets,
whose likelihood ratio is gamma; so is the report's.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

from ._epsilon import check_epsilon
from ._errors import MechanismError
from ._law import LinearEstimator, WeightLaw
from ._random import RandomSource, SystemRandomSource
from ._specs import ONE64, KrrSpec, MechanismSpec, Report

__all__ = [
    "CODE_BYTES",
    "ROUNDS",
    "MODULUS",
    "REPORT_WORDS",
    "REPORT_BYTES",
    "HASHED",
    "DEFAULT_SURVIVORS",
    "HashedSpec",
    "StringsRound",
    "string_code",
    "code_text",
    "round_name",
    "buckets_for",
    "prefix_hash",
]

CODE_BYTES = 6
ROUNDS = CODE_BYTES + 1  # a byte per round, then the verification round
MODULUS = 2**31 - 1  # prime: a nonzero byte difference times a uniform coefficient is uniform
REPORT_WORDS = CODE_BYTES + 2  # a_0..a_5, c, the reported bucket
REPORT_BYTES = 4 * REPORT_WORDS  # each a little-endian uint32 (HashedReports)
HASHED = "hashed"
DEFAULT_SURVIVORS = 32  # the prefixes a round passes on, unless the aggregator's config says otherwise
_HASH_PREFIX = b"veil.strings.v1\x00"
_MAX_BUCKETS = 1 << 16
_SYSTEM = SystemRandomSource()


def string_code(value: str | bytes) -> bytes:
    """The CODE_BYTES-byte code of a string (its UTF-8 bytes) or of raw bytes: the bytes
    themselves, zero-padded, when there are at most CODE_BYTES of them; else 0xFF and the first
    CODE_BYTES - 1 bytes of SHA-256("veil.strings.v1" 0x00 bytes). Collisions: a value and the
    same value with trailing zero bytes share a code; two longer values share one with
    probability 2^-40."""
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    else:
        raise MechanismError(f"A strings metric takes a str or bytes, not {type(value).__name__}.")
    if len(data) <= CODE_BYTES:
        return data.ljust(CODE_BYTES, b"\x00")
    return b"\xff" + hashlib.sha256(_HASH_PREFIX + data).digest()[: CODE_BYTES - 1]


def code_text(code: bytes) -> str:
    """How a code (or a prefix of one) is shown: a short value as its text (its bytes up to the
    zero padding, as UTF-8 with undecodable bytes escaped), a hashed one as ``#`` and hex."""
    if code[:1] == b"\xff":
        return "#" + code[1:].hex()
    return code.rstrip(b"\x00").decode("utf-8", errors="backslashreplace")


def round_name(metric: str, round_index: int) -> str:
    """The wire name of a strings metric's round: ``<metric>.r<round>``."""
    return f"{metric}.r{round_index}"


def buckets_for(epsilon_gamma: float) -> int:
    """g, the number of hash buckets for gamma = e^epsilon: the power of two nearest gamma + 1
    (OLH's optimum; the variance is flat around it, and a power of two makes the bucket a mask
    of the hash), from 2 to 2^16."""
    target = epsilon_gamma + 1.0
    g = 2
    while g < _MAX_BUCKETS and abs(math.log2(2 * g) - math.log2(target)) < abs(math.log2(g) - math.log2(target)):
        g *= 2
    return g


def prefix_hash(coefficients: Sequence[int], prefix: bytes) -> int:
    """h(u) = (c + sum_i a_i u_i) mod P over the prefix's bytes u_i (a_0..a_5 then c)."""
    total = coefficients[CODE_BYTES]
    for a, byte in zip(coefficients, prefix):
        total = (total + a * byte) % MODULUS
    return total


def _check_buckets(g: object) -> int:
    """g, checked: a power of two from 2 to 2^16 (the bucket is a mask of the hash)."""
    if isinstance(g, bool) or not isinstance(g, int) or g < 2 or g > _MAX_BUCKETS or g & (g - 1):
        raise MechanismError(f"A strings round hashes into a power of two from 2 to 2^16 buckets, not {g!r}.")
    return g


def _check_code(value: bytes, length: int, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != length:
        raise MechanismError(f"{what} must be {length} bytes.")
    return bytes(value)


@dataclass(frozen=True)
class StringsRound:
    """One round of a strings metric: which prefixes its candidates extend, and its hash."""

    metric: str
    round: int  # 0 .. ROUNDS-1; the last verifies
    buckets: int  # g
    parents: tuple[bytes, ...]  # the prefixes that survived the round before (round 0: one empty)
    rounds: int = ROUNDS

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise MechanismError("A strings round needs its metric's name.")
        if self.rounds != ROUNDS or not isinstance(self.round, int) or not 0 <= self.round < ROUNDS:
            raise MechanismError(
                f"A strings metric has rounds 0 to {ROUNDS - 1} of {ROUNDS}, not {self.round!r} of {self.rounds!r}."
            )
        _check_buckets(self.buckets)
        parents = tuple(bytes(p) for p in self.parents)
        length = self.parent_bytes
        if not parents or len(set(parents)) != len(parents) or any(len(p) != length for p in parents):
            raise MechanismError(f"Round {self.round} needs distinct parent prefixes of {length} bytes.")
        if self.round == 0 and parents != (b"",):
            raise MechanismError("Round 0 extends the empty prefix alone.")
        object.__setattr__(self, "parents", tuple(sorted(parents)))

    @property
    def verification(self) -> bool:
        return self.round == ROUNDS - 1

    @property
    def prefix_bytes(self) -> int:
        """The length of the prefixes this round estimates (and a device hashes)."""
        return CODE_BYTES if self.verification else self.round + 1

    @property
    def parent_bytes(self) -> int:
        return CODE_BYTES if self.verification else self.round

    @cached_property
    def candidates(self) -> tuple[bytes, ...]:
        """The prefixes this round estimates, in order: each parent extended by every byte (the
        verification round: the parents themselves)."""
        if self.verification:
            return self.parents
        return tuple(parent + bytes((b,)) for parent in self.parents for b in range(256))

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """The candidates as category labels (lowercase hex); never sent, derived from parents."""
        return tuple(c.hex() for c in self.candidates)

    def canonical(self) -> dict[str, object]:
        return {
            "buckets": self.buckets,
            "metric": self.metric,
            "parents": [p.hex() for p in self.parents],
            "round": self.round,
            "rounds": self.rounds,
        }

    def prefix_of(self, code: bytes) -> bytes:
        """The prefix of a code this round's device hashes."""
        return _check_code(code, CODE_BYTES, "A code")[: self.prefix_bytes]


@dataclass(frozen=True)
class HashedSpec(MechanismSpec):
    """Local hashing over a round's k candidates into ``buckets`` buckets (module docstring).

    A report holds a candidate c when its bucket is c's under its hash. From a device whose
    prefix is c that happens with p = gamma / (gamma + g - 1) (the bucket was kept); from any
    other device with b = P(h(u) = h(c) mod g) p + (1 - P(...)) (1 - p) / (g - 1), which is 1/g
    up to the hash's rounding (P is not a multiple of g; ``other_probability``). Reports have no
    fixed weight: their counts keep one row (weight 0 stands for any)."""

    buckets: int = 2

    name: ClassVar[str] = HASHED
    admissible: ClassVar[bool] = True
    # Its value in veil.wire.v1.Mechanism. Not in MECHANISMS: a hashed design is never declared,
    # only derived for a strings metric's rounds, and its reports are not sets of categories.
    proto: ClassVar[int] = 6

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise MechanismError(f"A hashed round estimates at least one candidate, not {self.k!r}.")
        _check_buckets(self.buckets)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def canonical(self) -> dict[str, object]:
        return {"mechanism": self.name, "k": self.k, "epsilon": self.epsilon}

    @cached_property
    def bucket_design(self) -> KrrSpec:
        """k-RR over the g buckets: how the bucket of the device's prefix is sent."""
        return KrrSpec(self.buckets, self.epsilon)

    @property
    def keep_threshold(self) -> int:
        """floor(2^64 gamma / (gamma + g - 1)): k-RR's keep threshold over the g buckets."""
        return self.bucket_design.keep_threshold

    @property
    def keep_probability(self) -> float:
        return self.keep_threshold / ONE64

    @cached_property
    def other_probability(self) -> float:
        """b: the chance a report holds a candidate that is not the device's prefix. h(u) and
        h(c) are independent and uniform on [0, P) (c uniform; their difference a nonzero
        multiple of a uniform coefficient), and of the residues mod g, g - 1 hold m = (P + 1) / g
        values of [0, P) and the last m - 1."""
        g, p = self.buckets, Fraction(self.keep_threshold, ONE64)
        m = (MODULUS + 1) // g
        same = Fraction((g - 1) * m * m + (m - 1) ** 2, MODULUS * MODULUS)
        return float(same * p + (1 - same) * (1 - p) / (g - 1))

    @property
    def outputs(self) -> int:
        return int(MODULUS ** (CODE_BYTES + 1)) * self.buckets

    @property
    def parity(self) -> float:
        return self.bucket_design.parity  # given the hash, the report is the bucket's k-RR

    def randomize(self, value: int, source: RandomSource = _SYSTEM) -> Report:
        raise MechanismError("A hashed report randomizes a prefix, not a category: use randomize_prefix.")

    def randomize_prefix(self, prefix: bytes, source: RandomSource = _SYSTEM) -> tuple[int, ...]:
        """The report of a device whose prefix is ``prefix``: a_0..a_5 and c, each below(P) in that
        order, then the bucket h(prefix) mod g through k-RR over g: keep = bernoulli(T); when
        not kept, o = below(g - 1) and the bucket sent is o, or o + 1 from the true one up."""
        if not isinstance(prefix, (bytes, bytearray)) or len(prefix) > CODE_BYTES:
            raise MechanismError(f"A prefix is at most {CODE_BYTES} bytes.")
        coefficients = [source.below(MODULUS) for _ in range(CODE_BYTES + 1)]
        (bucket,) = self.bucket_design.randomize(prefix_hash(coefficients, bytes(prefix)) & (self.buckets - 1), source)
        return (*coefficients, bucket)

    def support(self, report: Sequence[int], candidates: Sequence[bytes]) -> list[int]:
        """The candidates (indices) a report holds: those hashing to its bucket."""
        mask = self.buckets - 1
        return [i for i, c in enumerate(candidates) if prefix_hash(report, c) & mask == report[CODE_BYTES + 1]]

    def check_report(self, report: Sequence[int]) -> str | None:
        """Why a report is malformed (a coefficient not below P, a bucket not below g), or None."""
        if len(report) != REPORT_WORDS:
            return f"a report has {REPORT_WORDS} words, not {len(report)}"
        if any(not 0 <= a < MODULUS for a in report[: CODE_BYTES + 1]):
            return f"a hash coefficient is not below {MODULUS}"
        if not 0 <= report[-1] < self.buckets:
            return f"bucket {report[-1]} is not below {self.buckets}"
        return None

    def probability(self, report: Report, value: int) -> Fraction:
        raise MechanismError("A hashed design's reports are not sets of categories.")

    def output_space(self) -> Iterator[Report]:
        raise MechanismError("A hashed design's reports are not sets of categories.")

    def _ideal_keep(self) -> float:
        return self.gamma / (self.gamma + self.buckets - 1)

    def _build_weight_law(self) -> WeightLaw:
        return WeightLaw((0,), (1.0,), (self._ideal_keep(),), (self.other_probability,))

    def _build_estimators(self) -> dict[str, LinearEstimator]:
        # pi_c = (V_c / n - b) / (p - b): unbiased since E[V_c / n] = b + (p - b) pi_c.
        p, b = self._ideal_keep(), self.other_probability
        return {"minimax": LinearEstimator("minimax", (0,), (1.0 / (p - b),), (-b / (p - b),))}
