"""Strings metrics on the device's side (docs/protocol.md 10, docs/math.md 10): a string's code and
how it is shown, a round's candidates, and the hashed report: its probabilities exactly, its
parity, the order in which it reads random words, what it supports, and its frequencies."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import pytest

from veil.mechanism import (
    CODE_BYTES,
    MODULUS,
    REPORT_BYTES,
    REPORT_WORDS,
    ROUNDS,
    HashedSpec,
    MechanismError,
    MetricSpec,
    SeededRandomSource,
    StringsRound,
    WordRandomSource,
    buckets_for,
    code_text,
    epsilon_to_gamma,
    prefix_hash,
    round_name,
    string_code,
)

ONE64 = 1 << 64
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)


# --- codes -------------------------------------------------------------------------------------


def test_the_wire_revision_5_sizes():
    # A code is 6 bytes: rounds 0-5 extend a byte each, round 6 verifies; a report is a_0..a_5, c, bucket.
    assert (CODE_BYTES, ROUNDS, REPORT_WORDS, REPORT_BYTES) == (6, 7, 8, 32)


def test_a_short_string_is_its_own_code_zero_padded():
    assert string_code("SIGBUS") == b"SIGBUS"
    assert string_code("SEGV") == b"SEGV" + bytes(CODE_BYTES - 4)
    assert string_code("") == bytes(CODE_BYTES)
    assert string_code("123456") == b"123456"
    assert string_code("é") == "é".encode() + bytes(CODE_BYTES - 2)
    assert string_code(b"\x01\x02") == b"\x01\x02" + bytes(CODE_BYTES - 2)
    assert string_code(bytearray(b"ab")) == string_code("ab") == string_code(b"ab")


def test_a_long_string_is_0xff_and_five_bytes_of_its_sha256():
    value = "NullPointerException at Foo.bar"
    digest = hashlib.sha256(b"veil.strings.v1\x00" + value.encode()).digest()
    assert string_code(value) == b"\xff" + digest[:5]
    assert string_code("1234567") == b"\xff" + hashlib.sha256(b"veil.strings.v1\x001234567").digest()[:5]
    assert string_code("SIGSEGV")[0] == 0xFF  # 7 bytes: one too many to be its own code
    assert string_code(value.encode()) == string_code(value)


def test_code_collisions_are_the_documented_ones():
    # A value and the same value with trailing zero bytes share a code ...
    assert string_code(b"ab") == string_code(b"ab\x00") == string_code(b"ab" + bytes(CODE_BYTES - 2))
    # ... but not once the zeros make it longer than CODE_BYTES (it is hashed then).
    assert string_code(b"ab" + bytes(CODE_BYTES - 1)) != string_code(b"ab")
    # A hashed code starts with 0xFF, which no UTF-8 text has, so it never equals a short string's.
    assert string_code("x" * (CODE_BYTES + 1))[0] == 0xFF
    assert all(string_code(chr(c))[0] != 0xFF for c in range(1, 0x800))
    assert len({string_code(f"value number {i}") for i in range(2000)}) == 2000


@pytest.mark.parametrize("value", [1, 1.5, None, ["a"]])
def test_only_text_and_bytes_have_codes(value):
    with pytest.raises(MechanismError):
        string_code(value)


def test_code_text_shows_short_codes_as_text_and_hashed_ones_as_hex():
    assert code_text(string_code("SIGBUS")) == "SIGBUS"
    assert code_text(string_code("é")) == "é"
    assert code_text(string_code("")) == ""
    long = string_code("a long crash signature")
    assert code_text(long) == "#" + long[1:].hex()
    assert code_text(b"\xc3\x28ab" + bytes(CODE_BYTES - 4)) == "\\xc3(ab"  # undecodable bytes escaped
    assert code_text(b"SIG") == "SIG"  # a prefix of a code reads the same way
    assert code_text(b"a\x00b" + bytes(CODE_BYTES - 3)) == "a\x00b"  # only the trailing zeros are padding


def test_round_names_and_buckets():
    assert round_name("crash_signature", 0) == "crash_signature.r0"
    assert round_name("m", ROUNDS - 1) == "m.r6"
    # g: the power of two nearest gamma + 1 on a log scale, from 2 to 2^16.
    for epsilon in (0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0):
        target = epsilon_to_gamma(epsilon) + 1.0
        g = buckets_for(epsilon_to_gamma(epsilon))
        candidates = [1 << i for i in range(1, 17)]
        assert g == min(candidates, key=lambda c: (abs(math.log2(c) - math.log2(target)), c))
    assert buckets_for(epsilon_to_gamma(4.0)) == 64
    assert buckets_for(epsilon_to_gamma(2.0)) == 8
    assert buckets_for(1.0001) == 2
    assert buckets_for(math.exp(20)) == 1 << 16


def test_prefix_hash_is_the_linear_form_mod_p():
    coefficients = [MODULUS - 1 - 7 * i for i in range(CODE_BYTES)] + [MODULUS - 2]
    for prefix in (b"", b"\x00", b"\xff", b"ab", bytes(range(256 - CODE_BYTES, 256))):
        expected = (coefficients[CODE_BYTES] + sum(a * u for a, u in zip(coefficients, prefix))) % MODULUS
        assert prefix_hash(coefficients, prefix) == expected


# --- rounds --------------------------------------------------------------------------------------


def test_round_0_extends_the_empty_prefix_by_every_byte():
    first = StringsRound("m", 0, 64, (b"",))
    assert first.candidates == tuple(bytes((b,)) for b in range(256))
    assert (first.prefix_bytes, first.parent_bytes, first.verification) == (1, 0, False)
    assert first.labels[:3] == ("00", "01", "02")


def test_candidate_i_256_plus_b_is_parent_i_and_byte_b_parents_sorted():
    strings = StringsRound("m", 3, 16, (b"zzz", b"abc", b"ab\x00"))
    assert strings.parents == (b"ab\x00", b"abc", b"zzz")
    assert len(strings.candidates) == 3 * 256
    for i, parent in enumerate(strings.parents):
        for b in (0, 1, 97, 255):
            assert strings.candidates[i * 256 + b] == parent + bytes((b,))
    assert strings.prefix_of(b"abcdef") == b"abcd"
    assert strings.labels[256 + 0x64] == b"abcd".hex()


def test_the_verification_round_estimates_its_parents_themselves():
    codes = (b"SIGBUS", string_code("a long one"))
    strings = StringsRound("m", ROUNDS - 1, 8, codes)
    assert strings.verification and strings.prefix_bytes == strings.parent_bytes == CODE_BYTES
    assert strings.candidates == tuple(sorted(codes))
    assert strings.prefix_of(codes[0]) == codes[0]
    assert strings.canonical() == {
        "buckets": 8,
        "metric": "m",
        "parents": [c.hex() for c in sorted(codes)],
        "round": ROUNDS - 1,
        "rounds": ROUNDS,
    }


@pytest.mark.parametrize(
    ("metric", "round_index", "buckets", "parents"),
    [
        ("", 0, 64, (b"",)),
        ("m", -1, 64, (b"",)),
        ("m", ROUNDS, 64, (b"",)),
        ("m", 0, 48, (b"",)),  # not a power of two
        ("m", 0, 1, (b"",)),
        ("m", 0, 1 << 17, (b"",)),
        ("m", 0, True, (b"",)),
        ("m", 0, 64, (b"a",)),  # round 0 extends the empty prefix alone
        ("m", 2, 64, ()),  # no parents
        ("m", 2, 64, (b"ab", b"ab")),  # duplicates
        ("m", 2, 64, (b"ab", b"abc")),  # a wrong length
        ("m", ROUNDS - 1, 64, (b"12345",)),  # the verification round's parents are full codes
        ("m", ROUNDS - 1, 64, (b"1234567",)),
        ("m", ROUNDS - 1, 64, (b"12345678",)),  # a revision-4 code
    ],
)
def test_a_malformed_round_is_refused(metric, round_index, buckets, parents):
    with pytest.raises(MechanismError):
        StringsRound(metric, round_index, buckets, parents)


@pytest.mark.parametrize("rounds", [9, ROUNDS - 1, ROUNDS + 1, 0])  # 9: a revision-4 aggregator's
def test_a_round_with_another_number_of_rounds_is_refused(rounds):
    with pytest.raises(MechanismError):
        StringsRound("m", 0, 64, (b"",), rounds=rounds)


def test_a_round_spec_is_hashed_over_its_candidates():
    strings = StringsRound("crash_signature", 1, 64, (b"S", b"N"))
    spec = MetricSpec.strings_round(strings, 4.0)
    assert spec.name == "crash_signature.r1"
    assert spec.k == 512 and spec.labels == strings.labels
    assert isinstance(spec.mechanism, HashedSpec) and spec.mechanism.buckets == 64
    canonical = spec.canonical()
    assert canonical["labels"] == [] and canonical["strings"] == strings.canonical()


# --- the hashed design ---------------------------------------------------------------------------


def spec_at(epsilon: float, k: int = 256) -> HashedSpec:
    return HashedSpec(k, epsilon, buckets_for(epsilon_to_gamma(epsilon)))


@pytest.mark.parametrize(("k", "buckets"), [(0, 64), (True, 64), (4, 3), (4, 1), (4, 1 << 17), (4, False)])
def test_a_malformed_hashed_design_is_refused(k, buckets):
    with pytest.raises(MechanismError):
        HashedSpec(k, 1.0, buckets)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_keep_and_other_probabilities_are_exact(epsilon):
    spec = spec_at(epsilon)
    g, gamma = spec.buckets, Fraction(spec.gamma)
    assert spec.keep_threshold == math.floor(ONE64 * gamma / (gamma + g - 1))
    # b from its definition: (h(u), h(c)) uniform on [0, P)^2, so same = sum_r (#{x < P : x = r mod g} / P)^2,
    # each count the length of a range (P = 2^31 - 1 is 1 below a multiple of g: residue g - 1 is short).
    same = Fraction(sum(len(range(r, MODULUS, g)) ** 2 for r in range(g)), MODULUS**2)
    p = Fraction(spec.keep_threshold, ONE64)
    assert spec.other_probability == float(same * p + (1 - same) * (1 - p) / (g - 1))
    assert abs(spec.other_probability - 1 / g) < 1e-9  # 1/g up to the hash's rounding
    assert spec.keep_probability == spec.keep_threshold / ONE64


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_parity_is_at_most_gamma(epsilon):
    spec = spec_at(epsilon)
    t, g = spec.keep_threshold, spec.buckets
    # Given the hash, the bucket is k-RR over g: kept with T / 2^64, each other with (1 - T / 2^64) / (g - 1).
    assert spec.parity == float(Fraction(t * (g - 1), ONE64 - t))
    assert Fraction(t * (g - 1), ONE64 - t) <= Fraction(spec.gamma)
    assert spec.gamma / spec.parity - 1 < 1e-12


def test_the_estimator_is_unbiased_with_the_design_moments():
    spec = spec_at(4.0)
    p, b = spec.gamma / (spec.gamma + spec.buckets - 1), spec.other_probability
    one_true, one_other, a, b2 = spec.estimator.moments(spec.weight_law())
    assert one_true == pytest.approx(1.0, abs=1e-12) and one_other == pytest.approx(0.0, abs=1e-12)
    assert a == pytest.approx((p * (1 - b) ** 2 + (1 - p) * b**2) / (p - b) ** 2, rel=1e-12)
    assert b2 == pytest.approx(b * (1 - b) / (p - b) ** 2, rel=1e-12)


def test_randomize_prefix_reads_the_words_in_the_documented_order():
    spec = spec_at(4.0)  # g = 64
    g = spec.buckets
    coefficient_words = [0x9E3779B9 * (i + 1) % (1 << 32) for i in range(CODE_BYTES + 1)]
    coefficients = [w * MODULUS >> 32 for w in coefficient_words]  # below(P), no word rejected here
    prefix = b"SIG"
    true_bucket = prefix_hash(coefficients, prefix) & (g - 1)
    # Kept: bits64 from the next two words (high first) below T.
    kept = WordRandomSource([*coefficient_words, 0, 0, 0xFFFFFFFF])
    assert spec.randomize_prefix(prefix, kept) == (*coefficients, true_bucket)
    assert kept.position == CODE_BYTES + 3
    # Not kept: one more word, o = below(g - 1), sent as o or o + 1 from the true bucket up.
    for other_word in (1, 0x80000000, 0xFFFFFFFF):
        source = WordRandomSource([*coefficient_words, 0xFFFFFFFF, 0xFFFFFFFF, other_word])
        other = other_word * (g - 1) >> 32
        expected = other + (other >= true_bucket)
        assert spec.randomize_prefix(prefix, source) == (*coefficients, expected)
        assert source.position == CODE_BYTES + 4 and expected != true_bucket
    # Word 0 is one Lemire's rule rejects for below(63) ((0 x 63) mod 2^32 < 2^32 mod 63): the next word decides.
    source = WordRandomSource([*coefficient_words, 0xFFFFFFFF, 0xFFFFFFFF, 0, 0xFFFFFFFF])
    other = 0xFFFFFFFF * (g - 1) >> 32
    assert spec.randomize_prefix(prefix, source)[-1] == other + (other >= true_bucket)
    assert source.position == CODE_BYTES + 5
    # The keep decision is bits64 < T exactly: T - 1 keeps, T does not.
    t = spec.keep_threshold
    edge = [*coefficient_words, (t - 1) >> 32, (t - 1) & 0xFFFFFFFF]
    assert spec.randomize_prefix(prefix, WordRandomSource(edge))[-1] == true_bucket
    edge = [*coefficient_words, t >> 32, t & 0xFFFFFFFF, 5]
    assert spec.randomize_prefix(prefix, WordRandomSource(edge))[-1] != true_bucket


def test_randomize_prefix_takes_a_prefix_and_randomize_is_refused():
    spec = spec_at(1.0)
    with pytest.raises(MechanismError):
        spec.randomize_prefix(bytes(CODE_BYTES + 1), SeededRandomSource(1))
    with pytest.raises(MechanismError):
        spec.randomize_prefix("abc", SeededRandomSource(1))  # type: ignore[arg-type]
    with pytest.raises(MechanismError):
        spec.randomize(0, SeededRandomSource(1))
    with pytest.raises(MechanismError):
        spec.probability((0,), 0)
    with pytest.raises(MechanismError):
        next(iter(spec.output_space()))


def test_support_is_the_candidates_hashing_to_the_bucket():
    spec = spec_at(2.0)  # g = 8: many candidates share a bucket
    source = SeededRandomSource(7)
    candidates = [bytes((a, b)) for a in (3, 200) for b in range(256)]
    for _ in range(30):
        report = spec.randomize_prefix(b"\x03\x07", source)
        a, c, bucket = report[:CODE_BYTES], report[CODE_BYTES], report[CODE_BYTES + 1]
        brute = [
            i
            for i, cand in enumerate(candidates)
            if (c + sum(a[j] * cand[j] for j in range(len(cand)))) % MODULUS % spec.buckets == bucket
        ]
        assert spec.support(report, candidates) == brute
        assert len(report) == REPORT_WORDS and spec.check_report(report) is None


def test_check_report_names_what_is_wrong():
    spec = spec_at(4.0)
    good = [1] * (CODE_BYTES + 1) + [63]
    assert spec.check_report(good) is None
    assert "words" in spec.check_report(good[:-1])
    assert "words" in spec.check_report([1] * 9 + [63])  # a revision-4 report: 10 words
    assert "coefficient" in spec.check_report([MODULUS] + good[1:])
    assert "coefficient" in spec.check_report(good[:CODE_BYTES] + [-1, 0])
    assert "bucket 64" in spec.check_report(good[: CODE_BYTES + 1] + [64])


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_reports_hold_the_true_prefix_with_p_and_another_with_b(epsilon):
    """Over many seeded draws, the share of reports holding the device's own prefix and the
    share holding one other prefix match p and b within 4.5 binomial standard deviations."""
    spec = spec_at(epsilon, k=512)
    draws = 40_000
    source = SeededRandomSource(20261127)
    mine, other = b"\x05\x11", b"\x05\x12"  # they differ in one byte: the hash's weakest case
    holds_mine = holds_other = 0
    for _ in range(draws):
        report = spec.randomize_prefix(mine, source)
        held = spec.support(report, [mine, other])
        holds_mine += 0 in held
        holds_other += 1 in held
    p = spec.keep_threshold / ONE64
    b = spec.other_probability
    assert abs(holds_mine / draws - p) <= 4.5 * math.sqrt(p * (1 - p) / draws)
    assert abs(holds_other / draws - b) <= 4.5 * math.sqrt(b * (1 - b) / draws)
