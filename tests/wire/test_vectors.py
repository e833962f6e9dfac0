"""The shared test vectors (proto/veil/wire/v1/vectors, docs/protocol.md): made by
proto/vectors.py from this implementation, so drift fails here; and the TypeScript SDK
(client/js) reproduces them and randomizes as this SDK does, word for word."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from veil.aggregator.counts import Counts
from veil.aggregator.decode import decode_upload
from veil.aggregator.discovery import count_hashed
from veil.client._memo import device_round, round_message, strings_memo_key, strings_memo_message
from veil.mechanism import (
    HASHED,
    MECHANISMS,
    REPORT_WORDS,
    ROUNDS,
    MetricSpec,
    NumericSpec,
    StringsRound,
    WordRandomSource,
    code_text,
    string_code,
)
from veil.wire.v1 import veil_pb2

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto" / "veil" / "wire" / "v1" / "vectors"
JS = ROOT / "client" / "js"


def _load(name: str) -> list[dict]:
    data = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    assert data["version"] == "v1" and data["vectors"]
    return data["vectors"]


def test_vectors_have_not_drifted_from_the_code():
    out = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "vectors.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def _edited_check(tmp_path, name: str, edit) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "veil" / "wire" / "v1" / "vectors" / name
    data = json.loads(target.read_text(encoding="utf-8"))
    edit(data["vectors"][0])
    target.write_text(json.dumps(data), encoding="utf-8")
    return subprocess.run([sys.executable, str(copy / "vectors.py"), "--check"], capture_output=True, text=True)


def test_the_vector_drift_check_can_fail(tmp_path):
    out = _edited_check(tmp_path, "fingerprints.json", lambda v: v.update(fingerprint="0" * 32))
    assert out.returncode == 1 and "fingerprints.json" in out.stderr


@pytest.mark.parametrize(("change", "drifts"), [(1e-9, True), (1e-15, False)])
def test_estimates_drift_beyond_the_last_bits_only(tmp_path, change, drifts):
    """Estimates may differ in their last bits between machines; not by more."""

    def nudge(vector: dict) -> None:
        vector["estimate"][0] *= 1 + change

    out = _edited_check(tmp_path, "estimates.json", nudge)
    assert (out.returncode == 1 and "estimates.json" in out.stderr) if drifts else out.returncode == 0, out.stderr


def _spec_of(canonical: dict) -> MetricSpec:
    """The spec a vector states by its canonical fields (a round of a strings metric included)."""
    rule = {"period": canonical["period"], "reports_per_period": canonical["reports_per_period"]}
    if "strings" in canonical:
        s = canonical["strings"]
        strings = StringsRound(s["metric"], s["round"], s["buckets"], tuple(bytes.fromhex(p) for p in s["parents"]))
        return MetricSpec.strings_round(strings, canonical["epsilon"], **rule)
    n = canonical.get("numeric")
    numeric = (
        None
        if n is None
        else NumericSpec(n["metric"], n["part"], n["low"], n["high"], tuple(n["boundaries"]), n["levels"])
    )
    return MetricSpec.create(
        canonical["name"], canonical["labels"], canonical["mechanism"], canonical["epsilon"], numeric=numeric, **rule
    )


def test_every_fingerprint_vector_is_of_the_spec_it_states():
    specs = [(_spec_of(v["spec"]), v) for v in _load("fingerprints.json")]
    assert any(spec.strings is not None for spec, _ in specs) and any(spec.numeric is not None for spec, _ in specs)
    for spec, v in specs:
        assert spec.canonical() == v["spec"] and spec.fingerprint == v["fingerprint"]


def test_every_mechanism_has_vectors():
    for name in ("thresholds.json", "randomize.json"):
        assert {v["mechanism"] for v in _load(name)} == set(MECHANISMS)
    # HASHED is no declared mechanism: it is derived for strings metrics' rounds, its own encoding.
    assert {v["spec"]["mechanism"] for v in _load("encodings.json")} == set(MECHANISMS) | {HASHED}
    assert {v["encoding"] for v in _load("encodings.json")} == {"bitmaps", "index_sets", HASHED}
    assert any(b["encoding"] == HASHED for v in _load("upload_batches.json") for b in v["batches"])


def _hashed_rows(request: veil_pb2.UploadRequest) -> np.ndarray:
    return np.frombuffer(request.hashed.words, "<u4").astype(np.uint32).reshape(request.count, REPORT_WORDS)


def test_encoded_vectors_decode_to_their_reports_at_the_aggregator():
    for v in _load("encodings.json"):
        spec = _spec_of(v["spec"])
        request = veil_pb2.UploadRequest.FromString(bytes.fromhex(v["upload_hex"]))
        if spec.strings is not None:
            # REPORT_WORDS words (32 bytes) a report, and the aggregator counts what each report holds.
            assert len(request.hashed.words) == 4 * REPORT_WORDS * request.count
            assert _hashed_rows(request).tolist() == v["reports"]
            counts = Counts.zeros(spec.mechanism)
            assert count_hashed(spec, _hashed_rows(request), counts) == -1
            expected = np.zeros(spec.k, np.int64)
            for report in v["reports"]:
                expected[spec.mechanism.support(report, spec.strings.candidates)] += 1
            assert counts.total == len(v["reports"]) and counts.totals.tolist() == expected.tolist()
            continue
        counts = decode_upload(veil_pb2.UploadRequest.FromString(bytes.fromhex(v["upload_hex"])), spec, max_reports=100)
        expected = [0] * spec.k
        for report in v["reports"]:
            for j in report:
                expected[j] += 1
        assert counts.total == len(v["reports"]) and counts.totals.tolist() == expected


# --- strings metrics (docs/protocol.md section 10) --------------------------------------------


def test_strings_codes_and_how_they_are_shown():
    for v in _load("strings_codes.json"):
        value = v["string"] if "string" in v else bytes.fromhex(v["bytes_hex"])
        if "string" in v:
            assert v["string"].encode().hex() == v["utf8_hex"]
        code = string_code(value)
        assert code.hex() == v["code"] and code_text(code) == v["shown"], v


def test_strings_rounds_of_devices():
    vectors = _load("strings_rounds.json")
    assert {v["round"] for v in vectors} == set(range(ROUNDS))
    for v in vectors:
        secret = bytes.fromhex(v["secret"])
        assert round_message(v["metric"]).hex() == v["message_hex"]
        assert (int(v["x"]) * ROUNDS) >> 64 == v["round"] == device_round(secret, v["metric"]), v


def test_hashed_randomize_from_the_words_listed():
    vectors = _load("hashed_randomize.json")
    notes = {v["note"] for v in vectors}
    assert {"kept", "not kept", "below() rejections"} <= notes
    assert {v["spec"]["strings"]["round"] for v in vectors} >= {0, 3, ROUNDS - 1}
    for v in vectors:
        spec = _spec_of(v["spec"])
        assert spec.fingerprint == v["fingerprint"] and spec.mechanism.buckets == v["buckets"]
        assert str(spec.mechanism.keep_threshold) == v["keep_threshold"]
        assert spec.strings is not None and spec.strings.prefix_of(bytes.fromhex(v["code"])).hex() == v["prefix"]
        source = WordRandomSource(v["words"])
        assert list(spec.mechanism.randomize_prefix(bytes.fromhex(v["prefix"]), source)) == v["report"], v["note"]
        assert source.position == len(v["words"]), "every word listed is consumed"
        assert spec.mechanism.check_report(v["report"]) is None


def test_hashed_support_is_what_the_aggregator_counts():
    for v in _load("hashed_support.json"):
        spec = _spec_of(v["spec"])
        assert spec.fingerprint == v["fingerprint"] and spec.strings is not None
        assert [spec.mechanism.support(r, spec.strings.candidates) for r in v["reports"]] == v["supported"]
        counts = Counts.zeros(spec.mechanism)
        assert count_hashed(spec, np.array(v["reports"], np.uint32), counts) == -1
        expected = np.zeros(spec.k, np.int64)
        for held in v["supported"]:
            expected[held] += 1
        assert counts.totals.tolist() == expected.tolist()


def test_strings_memo_keys():
    vectors = _load("strings_memo_keys.json")
    for v in vectors:
        spec = _spec_of(v["spec"])
        assert spec.fingerprint == v["fingerprint"]
        assert (
            json.dumps(spec.design_canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            == (v["design_canonical_json"])
        )
        assert spec.design == v["design"]
        prefix = bytes.fromhex(v["prefix"])
        assert strings_memo_message(spec.name, spec.design, prefix).hex() == v["message_hex"]
        assert strings_memo_key(bytes.fromhex(v["secret"]), spec.name, spec.design, prefix).hex() == v["key"]


def test_a_rounds_design_does_not_change_with_its_parents():
    """The memo key's design: a device whose value stays put keeps its report as parents change."""
    changed = 0
    for v in _load("strings_memo_keys.json"):
        spec = _spec_of(v["spec"])
        assert spec.strings is not None
        if len(spec.strings.parents) < 2:
            continue
        fewer = StringsRound(spec.strings.metric, spec.strings.round, spec.strings.buckets, spec.strings.parents[1:])
        other = MetricSpec.strings_round(
            fewer, spec.mechanism.epsilon, period=spec.period, reports_per_period=spec.reports_per_period
        )
        assert other.fingerprint != spec.fingerprint and other.design == spec.design
        changed += 1
    assert changed


# --- the TypeScript SDK ------------------------------------------------------------------------


def _node(script: str, stdin: str) -> str:
    node = shutil.which("node")
    assert node, "node is missing: `make test` installs it (Debian's nodejs)"
    built = JS / "dist" / "test" / script
    assert built.exists(), "the TypeScript SDK is not built: `make test` runs npm ci and npm run build in client/js"
    out = subprocess.run([node, str(built)], input=stdin, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_typescript_sdk_passes_its_tests_on_the_shared_vectors():
    # The tests as built by `make test` (client/js/dist/.built), not `npm test`, which deletes and
    # rebuilds dist/ under every other test using the SDK at the same time (and make's stamp with it).
    node = shutil.which("node")
    assert node, "node is missing: `make test` installs it (Debian's nodejs)"
    tests = sorted(str(p) for p in (JS / "dist" / "test").glob("*.test.js"))
    assert tests, "the TypeScript SDK is not built: `make test` runs npm ci and npm run build in client/js"
    out = subprocess.run([node, "--test", *tests], cwd=JS, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_typescript_randomizer_sends_what_python_sends_from_the_same_words(mechanism):
    # The privacy audit of the TypeScript randomizer: word for word it is Python's, whose exact
    # transition matrices have every likelihood ratio at most e^epsilon (tests/mechanism).
    rng = random.Random(f"ts-{mechanism}")
    cases, expected = [], []
    for _ in range(300):
        k = 2 if mechanism == "warner" else rng.choice((2, 3, 5, 12, 33))
        epsilon = rng.choice((1e-4, 0.05, 0.5, 1.0, 1 / 3, 3.0, 20.0))
        value = rng.randrange(k)
        words = [rng.getrandbits(32) for _ in range(4 * k + 64)]
        source = WordRandomSource(words)
        expected.append(
            {
                "report": list(
                    MetricSpec.create("m", [str(j) for j in range(k)], mechanism, epsilon).mechanism.randomize(
                        value, source
                    )
                ),
                "used": source.position,
            }
        )
        cases.append({"mechanism": mechanism, "k": k, "epsilon": epsilon, "value": value, "words": words})
    assert json.loads(_node("randomize-stdin.js", json.dumps(cases))) == expected
