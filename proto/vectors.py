"""Write the wire contract's test vectors (docs/protocol.md) from the Python implementation.

    python proto/vectors.py           # rewrite proto/veil/wire/v1/vectors/*.json
    python proto/vectors.py --check   # exit 1, naming the files, when they have drifted

Every other implementation (client/js) reads these files and must reproduce them: fingerprints
of specs, thresholds, reports from given random words, encoded uploads (one batch, and several
in an UploadBatchesRequest), memo keys, numeric values' categories and rounding thresholds,
strings' codes, devices' rounds, hashed reports, what they hold and their memo keys, and
estimates from counts. Needs the aggregator extra (numpy) for the estimates.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import random
import sys
from pathlib import Path

from google.protobuf import json_format

from veil.aggregator.counts import Counts
from veil.aggregator.estimate import estimate
from veil.client import encode_batch, encode_batches
from veil.client._memo import (
    alpha_message,
    device_round,
    memo_key,
    round_message,
    rounding_alpha,
    strings_memo_key,
    strings_memo_message,
)
from veil.mechanism import (
    CODE_BYTES,
    DISTRIBUTION,
    HASHED,
    MEAN,
    MODULUS,
    ROUNDS,
    MetricSpec,
    NumericSpec,
    StringsRound,
    WordRandomSource,
    buckets_for,
    code_text,
    encoding,
    epsilon_to_gamma,
    mean_levels,
    string_code,
)
from veil.wire.v1 import veil_pb2

OUT = Path(__file__).resolve().parent / "veil" / "wire" / "v1" / "vectors"

# Epsilons whose Python repr exercises every branch of the float spelling (docs/protocol.md).
_AWKWARD_EPSILONS = (
    1.0,
    0.1,
    0.30000000000000004,
    1 / 3,
    2.5,
    0.0001,
    0.00012345678901234567,
    7.0,
    19.999999999999996,
    20.0,
    1e-4 * 3,
)
_MECHANISMS = ("subset", "krr", "warner", "rappor", "rappor-admissible")


def _spec(mechanism: str, k: int, epsilon: float, **rule) -> MetricSpec:
    labels = [f"c{j}" for j in range(k)]
    return MetricSpec.create("m", labels, mechanism, epsilon, **rule)


def _canonical_text(canonical: dict) -> str:
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _spec_json(spec: MetricSpec) -> dict:
    """The spec as the vectors state it (the canonical fields; labels in full)."""
    return spec.canonical()


def fingerprints() -> list[dict]:
    cases = []
    for epsilon in _AWKWARD_EPSILONS:
        cases.append(_spec("subset", 4, epsilon))
    cases.append(
        MetricSpec.create(
            "navigateur",
            [
                "Firefox",
                "Chrome",
                "Safari",
                '\u00e9dge "beta"',
                "tab\there",
                "\u2603 snow",
                "line\nbreak",
                "back\\slash",
                "\u0001ctl",
            ],
            "rappor-admissible",
            1.5,
            period=3600,
            reports_per_period=3,
        )
    )
    cases.append(
        MetricSpec.create(
            "yes_no",
            ["no", "yes"],
            "warner",
            0.5,
            period=1,
            reports_per_period=4294967295,
            period_budget=2.0,
            lifetime_budget=10.0,
        )
    )
    cases.append(MetricSpec.create("big", [str(j) for j in range(300)], "krr", 3.0, period=31622400))
    cases += [MetricSpec.numeric_part(numeric, "subset", 2.0) for numeric in _NUMERIC_PARTS]
    cases += [MetricSpec.strings_round(strings, epsilon, **rule) for strings, epsilon, rule in _STRINGS_ROUNDS]
    out = []
    for spec in cases:
        out.append(
            {
                "spec": _spec_json(spec),
                "canonical_json": _canonical_text(spec.canonical()),
                "fingerprint": spec.fingerprint,
            }
        )
    return out


def _thresholds(spec: MetricSpec) -> dict:
    m = spec.mechanism
    row = {"gamma": repr(m.gamma), "gamma_hex": m.gamma.hex()}
    if m.q is not None:
        row.update(q=m.q, keep_threshold=str(m.keep_threshold))
    else:
        row.update(q=0, flip_threshold=str(m.flip_threshold))
    return row


def thresholds() -> list[dict]:
    out = []
    for mechanism in _MECHANISMS:
        for k in (2,) if mechanism == "warner" else (2, 3, 10, 64, 1024):
            for epsilon in _AWKWARD_EPSILONS:
                spec = _spec(mechanism, k, epsilon)
                out.append({"mechanism": mechanism, "k": k, "epsilon": epsilon, **_thresholds(spec)})
    return out


def _draw_words(threshold: int, hit: bool) -> list[int]:
    """Two words whose 64-bit draw lies just below (hit) or at (miss) a threshold."""
    draw = threshold - 1 if hit else threshold
    return [draw >> 32, draw & 0xFFFFFFFF]


def _randomize_case(spec: MetricSpec, value: int, words: list[int], note: str) -> dict:
    source = WordRandomSource(words)
    report = spec.mechanism.randomize(value, source)
    return {
        "note": note,
        "mechanism": spec.mechanism.name,
        "k": spec.k,
        "epsilon": spec.mechanism.epsilon,
        "value": value,
        "words": words[: source.position],
        "report": list(report),
    }


def randomize() -> list[dict]:
    rng = random.Random(19)
    out = []
    for mechanism in _MECHANISMS:
        for k in (2,) if mechanism == "warner" else (2, 3, 10, 37):
            for epsilon in (0.1, 1.0, 1 / 3, 5.0):
                spec = _spec(mechanism, k, epsilon)
                for value in sorted({0, k - 1, k // 2}):
                    words = [rng.getrandbits(32) for _ in range(4 * k + 64)]
                    out.append(_randomize_case(spec, value, words, "random words"))
    # Thresholds at their edges: a draw of T - 1 keeps (or flips), a draw of T does not.
    for mechanism, k in (("subset", 10), ("krr", 5), ("warner", 2)):
        spec = _spec(mechanism, k, 1.0)
        t = spec.mechanism.keep_threshold
        for hit in (True, False):
            words = _draw_words(t, hit) + [rng.getrandbits(32) for _ in range(4 * k)]
            out.append(_randomize_case(spec, 1, words, f"keep draw {'T - 1' if hit else 'T'}"))
    # below(n) rejects a word w when (w * n) mod 2**32 < (2**32 - n) mod n: words 0 are rejected
    # for every n that is not a power of two.
    spec = _spec("subset", 7, 1.0)
    words = _draw_words(spec.mechanism.keep_threshold, True) + [0, 0] + [rng.getrandbits(32) for _ in range(40)]
    out.append(_randomize_case(spec, 3, words, "below() rejects words 0"))
    # Admissible RAPPOR redraws all-zeros and all-ones reports: k = 2, true value 0; the first
    # draw gives all zeros (bit 0 flipped, bit 1 not) or all ones (bit 1 flipped, bit 0 not),
    # the second flips neither.
    spec = _spec("rappor-admissible", 2, 1.0)
    t = spec.mechanism.flip_threshold
    words = _draw_words(t, True) + _draw_words(t, False) + _draw_words(t, False) + _draw_words(t, False)
    out.append(_randomize_case(spec, 0, words, "all-zeros report redrawn"))
    words = _draw_words(t, False) + _draw_words(t, True) + _draw_words(t, False) + _draw_words(t, False)
    out.append(_randomize_case(spec, 0, words, "all-ones report redrawn"))
    # Basic RAPPOR sends the all-zeros report as it is.
    spec = _spec("rappor", 2, 1.0)
    words = _draw_words(spec.mechanism.flip_threshold, True) + _draw_words(spec.mechanism.flip_threshold, False)
    out.append(_randomize_case(spec, 0, words, "rappor sends all zeros"))
    return out


def encodings() -> list[dict]:
    rng = random.Random(1919)
    out = []
    batch_id = bytes(range(16))
    for (mechanism, k, epsilon), made_unix in zip(
        (
            ("subset", 10, 1.0),
            ("krr", 32, 1.0),
            ("krr", 40, 2.0),
            ("subset", 300, 4.0),
            ("subset", 1024, 1.0),
            ("warner", 2, 1.0),
            ("rappor", 9, 2.0),
            ("rappor-admissible", 17, 1.0),
        ),
        # 0: not said (revision 1); else a slot start (revision 2): a day's, an hour's, past 2^31, past 2^33.
        (0, 1_700_006_400, 1_700_002_800, 0, 2_147_483_648, 8_589_974_400, 1_700_006_400, 86400),
        strict=True,
    ):
        spec = _spec(mechanism, k, epsilon)
        words = [rng.getrandbits(32) for _ in range(20000)]
        source = WordRandomSource(words)
        reports = [spec.mechanism.randomize(v % k, source) for v in range(3)]
        out.append(_upload_case(spec, reports, batch_id, made_unix))
    # Strings rounds' reports (HashedReports): 32 bytes each, whatever the round.
    for (strings, epsilon, rule), made_unix in zip(_STRINGS_ROUNDS[:3], (1_700_006_400, 0, 86400), strict=True):
        spec = MetricSpec.strings_round(strings, epsilon, **rule)
        source = WordRandomSource([rng.getrandbits(32) for _ in range(200)])
        reports = [_hashed_report(spec, code, source) for code in _CODES[:3]]
        out.append(_upload_case(spec, reports, batch_id, made_unix))
    return out


def _upload_case(spec: MetricSpec, reports: list[tuple[int, ...]], batch_id: bytes, made_unix: int) -> dict:
    body = encode_batch(spec, reports, batch_id, made_unix)
    message = veil_pb2.UploadRequest.FromString(body)
    assert message.SerializeToString() == body, "as protoc's writers write it"
    return {
        "spec": _spec_json(spec),
        "fingerprint": spec.fingerprint,
        "encoding": HASHED if spec.strings is not None else encoding(spec.mechanism),
        "batch_id": batch_id.hex(),
        "made_unix": made_unix,
        "reports": [list(r) for r in reports],
        "upload_hex": body.hex(),
        "upload_json": json.loads(json_format.MessageToJson(message)),
    }


def upload_batches() -> list[dict]:
    """UploadBatchesRequests: each batch as in encodings.json, the request their bytes in order."""
    rng = random.Random(2929)
    out = []
    for shapes in (
        (("subset", 10, 1.0), ("rappor", 9, 2.0), ("krr", 40, 2.0)),
        (("warner", 2, 1.0),),
        ((HASHED, 0, 4.0), ("krr", 3, 1.0)),
    ):
        batches = []
        for i, (mechanism, k, epsilon) in enumerate(shapes):
            source = WordRandomSource([rng.getrandbits(32) for _ in range(20000)])
            if mechanism == HASHED:
                spec = MetricSpec.strings_round(
                    StringsRound(f"metric{i}", 0, buckets_for(epsilon_to_gamma(epsilon)), (b"",)), epsilon
                )
                reports = [_hashed_report(spec, code, source) for code in _CODES[: 1 + i]]
            else:
                spec = MetricSpec.create(f"metric{i}", [f"c{j}" for j in range(k)], mechanism, epsilon)
                reports = [spec.mechanism.randomize(v % k, source) for v in range(1 + i)]
            batches.append(_upload_case(spec, reports, bytes([16 * i + j for j in range(16)]), 1_700_006_400))
        uploads = [bytes.fromhex(b["upload_hex"]) for b in batches]
        body = encode_batches(uploads)
        # Each batch under 128 bytes here, so its length is one varint byte.
        assert body == b"".join(b"\x0a" + bytes([len(u)]) + u for u in uploads), "each batch's bytes, as they were"
        message = veil_pb2.UploadBatchesRequest.FromString(body)
        out.append(
            {
                "batches": batches,
                "request_hex": body.hex(),
                "request_json": json.loads(json_format.MessageToJson(message)),
            }
        )
    return out


def memo_keys() -> list[dict]:
    """Memo keys (docs/protocol.md section 6): lengths are bytes of UTF-8, not characters."""
    secret = bytes(range(32))
    cases = (
        ("browser", "0123456789abcdef0123456789abcdef", 3),
        ("navigateur-préféré", "fedcba9876543210fedcba9876543210", 0),
        ("😀", "00000000000000000000000000000000", 4_294_967_295),
        ("", "", 7),
    )
    return [
        {
            "secret": secret.hex(),
            "metric": metric,
            "fingerprint": fingerprint,
            "category": index,
            "message_hex": (
                b"veil.memo.v1\x00"
                + len(metric.encode()).to_bytes(4, "little")
                + metric.encode()
                + len(fingerprint.encode()).to_bytes(4, "little")
                + fingerprint.encode()
                + index.to_bytes(4, "little")
            ).hex(),
            "key": memo_key(secret, metric, fingerprint, index).hex(),
        }
        for metric, fingerprint, index in cases
    ]


# Numeric parts whose canonical numbers exercise the float spelling (exponents, fractions).
_NUMERIC_PARTS = (
    NumericSpec("load_ms", MEAN, 0.0, 10000.0, (), mean_levels(2.0)),
    NumericSpec("load_ms", DISTRIBUTION, 0.0, 10000.0, (100.0, 250.0, 500.0, 1000.0, 2500.0)),
    NumericSpec("temp", MEAN, -40.5, 1e-05, (), 17),
    NumericSpec("tiny", DISTRIBUTION, 1e-07, 1.5e16, (2.5e-05, 0.1, 0.30000000000000004, 7e15)),
    NumericSpec("bits", MEAN, 0.0, 1.0, (), 2),
)


def numeric_values() -> list[dict]:
    """A number's category in a numeric part, for given rounding thresholds (section 9): clipped
    values, exact points and boundaries, ties (f equal to alpha rounds down), both range ends."""
    out = []
    alphas = (0.0, 0.5, 0.25, 1 - 2**-53, 0.7071067811865476)
    for numeric in _NUMERIC_PARTS:
        low, high = numeric.low, numeric.high
        values = [
            low - abs(low) - 1.0,
            low,
            high,
            high + abs(high) + 1.0,
            (low + high) / 2,
            low + (high - low) / 3,
            -0.0,
        ]
        values += list(numeric.boundaries) + list(numeric.points if numeric.part == MEAN else ())
        values += [b - abs(b) * 1e-15 for b in numeric.boundaries]
        cases = [(value, alphas[i % len(alphas)]) for i, value in enumerate(values)]
        if numeric.part == MEAN:  # the fraction f equal to alpha: rounds down
            step = (high - low) / (numeric.levels - 1)
            cases += [(low + step * 0.5, 0.5), (low + step * 0.25, 0.25)]
        for value, alpha in cases:
            clipped, was_clipped = numeric.clip(value)
            out.append(
                {
                    "numeric": numeric.canonical(),
                    "value": value,
                    "alpha": alpha,
                    "clipped_value": clipped,
                    "clipped": was_clipped,
                    "category": numeric.category(clipped, alpha),
                }
            )
    return out


def numeric_alphas() -> list[dict]:
    """Rounding thresholds from a device secret (section 9)."""
    secret = bytes(range(32))
    cases = (
        ("load_ms.mean", "0123456789abcdef0123456789abcdef"),
        ("température.mean", "fedcba9876543210fedcba9876543210"),
        ("😀.mean", ""),
    )
    return [
        {
            "secret": secret.hex(),
            "metric": metric,
            "fingerprint": fingerprint,
            "message_hex": alpha_message(metric, fingerprint).hex(),
            "alpha": rounding_alpha(secret, metric, fingerprint),
            "alpha_53": int(rounding_alpha(secret, metric, fingerprint) * 2**53),
        }
        for metric, fingerprint in cases
    ]


# --- strings metrics (docs/protocol.md section 10) --------------------------------------------

# Strings, and raw bytes (as bytes): empty, short, exactly 6 bytes, longer (hashed), non-ASCII
# text, trailing and inner zero bytes, 0xff, bytes that are not UTF-8.
_STRING_VALUES: tuple[str | bytes, ...] = (
    "",
    "a",
    "SIGBUS",
    "SIGSEGV",
    "SIGABRT!",
    "SIGSEGV at 0x0",
    "NullPointerException in com.example.Main.run",
    "é",
    "ñandú",
    "😀😀",
    "日本語",
    "crash 💥",
    "a\x00",
    "ab\x00c",
    '\t\n"\\',
    b"",
    b"\x00",
    b"\x00" * 6,
    b"\x00" * 7,
    b"\xff",
    b"\xff" * 6,
    b"\xfe\xfd\x80",
    b"\xc3",
    b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
)
_CODES = tuple(string_code(value) for value in _STRING_VALUES[1:7])

# Rounds (with epsilon and reporting rule) whose specs the vectors state: round 0, a middle round,
# the verification round; buckets as buckets_for chooses them and at the extremes.
_STRINGS_ROUNDS: tuple[tuple[StringsRound, float, dict], ...] = (
    (StringsRound("crash_signature", 0, buckets_for(epsilon_to_gamma(4.0)), (b"",)), 4.0, {}),
    (
        StringsRound("crash_signature", 3, buckets_for(epsilon_to_gamma(1.0)), (b"SIG", b"Nul", b"\xff\x10\x00")),
        1.0,
        {"period": 3600, "reports_per_period": 2},
    ),
    (
        StringsRound("signature-de-plantage", ROUNDS - 1, 2, (string_code("SIGSEGV"), string_code("é"), _CODES[4])),
        0.5,
        {},
    ),
    (StringsRound("😀", 1, 65536, (b"S", b"\x00", b"\xff")), 11.0, {"period_budget": 22.0}),
    (StringsRound("m", 0, 4, (b"",)), 0.30000000000000004, {}),
)


def strings_codes() -> list[dict]:
    """A string's (or raw bytes') code and how it is shown."""
    out = []
    for value in _STRING_VALUES:
        code = string_code(value)
        row: dict[str, object] = {"string": value} if isinstance(value, str) else {"bytes_hex": value.hex()}
        if isinstance(value, str):
            row["utf8_hex"] = value.encode().hex()
        out.append({**row, "code": code.hex(), "shown": code_text(code)})
    return out


def strings_rounds() -> list[dict]:
    """Devices' rounds: every round for one metric (over secrets), and non-ASCII metric names."""
    secrets_ = [bytes(range(32))] + [hashlib.sha256(b"device %d" % i).digest() for i in range(200)]
    cases: list[tuple[bytes, str]] = []
    seen: set[int] = set()
    for secret in secrets_:
        r = device_round(secret, "crash_signature")
        if r not in seen:
            seen.add(r)
            cases.append((secret, "crash_signature"))
    assert seen == set(range(ROUNDS)), "a secret for every round"
    cases += [
        (secrets_[0], metric) for metric in ("signature-de-plantage", "géant", "😀", "日本語のメトリック", "m", "")
    ]
    cases += [(secrets_[i], "crash_signature") for i in (17, 18, 19)]
    out = []
    for secret, metric in cases:
        message = round_message(metric)
        x = int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "little")
        out.append(
            {
                "secret": secret.hex(),
                "metric": metric,
                "message_hex": message.hex(),
                "x": str(x),
                "round": device_round(secret, metric),
            }
        )
    return out


def _round_json(spec: MetricSpec) -> dict:
    """A round's spec as the vectors state it: its canonical fields, fingerprint, and what the
    randomization reads from it."""
    return {
        "spec": _spec_json(spec),
        "fingerprint": spec.fingerprint,
        "buckets": spec.mechanism.buckets,
        "keep_threshold": str(spec.mechanism.keep_threshold),
    }


def _hashed_report(spec: MetricSpec, code: bytes, source: WordRandomSource) -> tuple[int, ...]:
    assert spec.strings is not None
    return spec.mechanism.randomize_prefix(spec.strings.prefix_of(code), source)


# A word w that below(2^31 - 1) rejects besides 0: (w * P) mod 2^32 = 1 < (2^32 - P) mod P = 2.
_REJECTED_BY_BELOW_P = pow(MODULUS, -1, 1 << 32)


def hashed_randomize() -> list[dict]:
    rng = random.Random(2828)
    out = []

    def case(spec: MetricSpec, code: bytes, words: list[int], note: str) -> None:
        assert spec.strings is not None
        source = WordRandomSource(words)
        report = _hashed_report(spec, code, source)
        prefix = spec.strings.prefix_of(code)
        out.append(
            {
                "note": note,
                **_round_json(spec),
                "code": code.hex(),
                "prefix": prefix.hex(),
                "words": words[: source.position],
                "report": list(report),
            }
        )

    for strings, epsilon, rule in _STRINGS_ROUNDS:
        spec = MetricSpec.strings_round(strings, epsilon, **rule)
        t = spec.mechanism.keep_threshold
        for code in _CODES[:4]:
            case(spec, code, [rng.getrandbits(32) for _ in range(40)], "random words")
        for hit in (True, False):
            words = (
                [rng.getrandbits(32) for _ in range(9)] + _draw_words(t, hit) + [rng.getrandbits(32) for _ in range(8)]
            )
            case(spec, _CODES[2], words, "kept" if hit else "not kept")
        # below(P) rejects words 0 and 1/P mod 2^32; below(g - 1) rejects 0 unless g - 1 is a power of two.
        words = [0, _REJECTED_BY_BELOW_P] + [rng.getrandbits(32) for _ in range(9)] + _draw_words(t, False)
        case(spec, _CODES[3], words + [0] + [rng.getrandbits(32) for _ in range(8)], "below() rejections")
    return out


def hashed_support() -> list[dict]:
    """Which candidates a report holds, for reports of candidates (kept or not) and of others."""
    rng = random.Random(3838)
    out = []
    for strings, epsilon, rule in _STRINGS_ROUNDS[:3] + (
        (StringsRound("crash_signature", 1, 4, (b"S", b"\xff")), 1.0, {}),
    ):
        spec = MetricSpec.strings_round(strings, epsilon, **rule)
        source = WordRandomSource([rng.getrandbits(32) for _ in range(2000)])
        candidates = strings.candidates
        codes = [
            c.ljust(CODE_BYTES, b"\x00") for c in (candidates[0], candidates[-1], candidates[len(candidates) // 2])
        ]
        codes += list(_CODES[:3])
        reports = [_hashed_report(spec, code, source) for code in codes]
        out.append(
            {
                **_round_json(spec),
                "reports": [list(r) for r in reports],
                "supported": [spec.mechanism.support(r, candidates) for r in reports],
            }
        )
    return out


def strings_memo_keys() -> list[dict]:
    """Strings memo keys: the round's name and design (its fingerprint without parents), the prefix."""
    secret = bytes(range(32))
    out = []
    for strings, epsilon, rule in _STRINGS_ROUNDS:
        spec = MetricSpec.strings_round(strings, epsilon, **rule)
        for code in _CODES[:3]:
            prefix = strings.prefix_of(code)
            out.append(
                {
                    "secret": secret.hex(),
                    "spec": _spec_json(spec),
                    "fingerprint": spec.fingerprint,
                    "design_canonical_json": _canonical_text(spec.design_canonical()),
                    "design": spec.design,
                    "prefix": prefix.hex(),
                    "message_hex": strings_memo_message(spec.name, spec.design, prefix).hex(),
                    "key": strings_memo_key(secret, spec.name, spec.design, prefix).hex(),
                }
            )
    return out


def estimates() -> list[dict]:
    rng = random.Random(191919)
    out = []
    for mechanism, k, epsilon, n, rpd in (
        ("subset", 4, 1.0, 1000, 1),
        ("krr", 3, 0.5, 50, 1),
        ("warner", 2, 2.0, 7, 1),
        ("subset", 10, 1.0, 200, 3),
        ("rappor", 3, 1.0, 500, 1),
        ("rappor-admissible", 4, 2.0, 300, 2),
        ("krr", 16, 1.0, 5, 1),
    ):
        spec = _spec(mechanism, k, epsilon)
        source = WordRandomSource([rng.getrandbits(32) for _ in range(200 * k * n)])
        weights = spec.mechanism.weight_law().weights
        row = {t: r for r, t in enumerate(weights)}
        n_t = [0] * len(weights)
        v = [[0] * k for _ in weights]
        for i in range(n):
            report = spec.mechanism.randomize(min(i % (k + 1), k - 1), source)
            r = row[len(report)]
            n_t[r] += 1
            for j in report:
                v[r][j] += 1
        result = estimate(spec.mechanism, Counts(weights, n_t, v), reports_per_device=rpd)
        out.append(
            {
                "spec": _spec_json(spec),
                "weights": list(weights),
                "n": n_t,
                "v": v,
                "reports_per_device": rpd,
                "estimate": result.estimate.tolist(),
                "stderr": result.stderr.tolist(),
                "lower": result.lower.tolist(),
                "upper": result.upper.tolist(),
            }
        )
    return out


_FILES = {
    "fingerprints.json": fingerprints,
    "thresholds.json": thresholds,
    "randomize.json": randomize,
    "encodings.json": encodings,
    "upload_batches.json": upload_batches,
    "memo_keys.json": memo_keys,
    "numeric_values.json": numeric_values,
    "numeric_alphas.json": numeric_alphas,
    "strings_codes.json": strings_codes,
    "strings_rounds.json": strings_rounds,
    "hashed_randomize.json": hashed_randomize,
    "hashed_support.json": hashed_support,
    "strings_memo_keys.json": strings_memo_keys,
    "estimates.json": estimates,
}


def render() -> dict[str, str]:
    """Each vector file's text."""
    return {
        name: json.dumps({"version": "v1", "vectors": make()}, indent=1, ensure_ascii=False) + "\n"
        for name, make in _FILES.items()
    }


def drifted() -> list[str]:
    """Names of vector files that differ from, or are missing beside, what the code makes.
    Everything is compared exactly but the estimates' floating-point results, which may differ
    in the last bits between machines (the order of a sum's SIMD lanes): within 1e-12."""
    return [
        name
        for name, text in render().items()
        if not (OUT / name).exists()
        or not _same(json.loads((OUT / name).read_text(encoding="utf-8")), json.loads(text))
    ]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    return type(a) is type(b) and a == b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when they drifted")
    args = parser.parse_args(argv)
    if args.check:
        bad = drifted()
        for name in bad:
            print(f"drifted: {OUT / name}", file=sys.stderr)
        return 1 if bad else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
