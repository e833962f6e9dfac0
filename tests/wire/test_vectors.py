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

import pytest

from veil.aggregator.decode import decode_upload
from veil.mechanism import MECHANISMS, MetricSpec, WordRandomSource
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


def test_every_mechanism_has_vectors():
    for name in ("thresholds.json", "randomize.json"):
        assert {v["mechanism"] for v in _load(name)} == set(MECHANISMS)
    assert {v["spec"]["mechanism"] for v in _load("encodings.json")} == set(MECHANISMS)
    assert {v["encoding"] for v in _load("encodings.json")} == {"bitmaps", "index_sets"}


def test_encoded_vectors_decode_to_their_reports_at_the_aggregator():
    for v in _load("encodings.json"):
        s = v["spec"]
        spec = MetricSpec.create(
            s["name"],
            s["labels"],
            s["mechanism"],
            s["epsilon"],
            period=s["period"],
            reports_per_period=s["reports_per_period"],
        )
        counts = decode_upload(veil_pb2.UploadRequest.FromString(bytes.fromhex(v["upload_hex"])), spec, max_reports=100)
        expected = [0] * spec.k
        for report in v["reports"]:
            for j in report:
                expected[j] += 1
        assert counts.total == len(v["reports"]) and counts.totals.tolist() == expected


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
