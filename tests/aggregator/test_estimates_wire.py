"""Estimates on the wire: the numpy-built EstimatesResponse bytes are exactly what protobuf's own
SerializeToString writes for the message built field by field (the way the servicer built it
before), and the cached JSON text is exactly json.dumps of to_json; caches follow versions."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from veil.aggregator.config import MetricConfig, Window
from veil.aggregator.estimate import Estimate
from veil.aggregator.estimates_wire import ResponseCache, encode_window
from veil.aggregator.live import WindowEstimate, estimates_json
from veil.mechanism import PROJECTION_NOTE, MetricSpec
from veil.wire.v1 import veil_pb2

TOTAL = Window("total", None, None)
HOUR = Window("1h", 3600, 7 * 3600)


def reference_window(e: WindowEstimate) -> veil_pb2.WindowEstimate:
    """The message as the servicer used to build it: through to_json, None as NaN."""
    body = e.to_json()
    nan = float("nan")
    return veil_pb2.WindowEstimate(
        metric=body["metric"],
        window=body["window"],
        start_unix=e.start,
        end_unix=e.end,
        n=e.n,
        mechanism=veil_pb2.Mechanism.Value(e.metric.spec.mechanism.name.upper().replace("-", "_")),
        epsilon=e.metric.spec.mechanism.epsilon,
        spec_fingerprint=e.metric.spec.fingerprint,
        withheld=e.withheld,
        reason=e.reason,
        categories=[
            veil_pb2.CategoryEstimate(**{k: nan if v is None else v for k, v in c.items()}) for c in body["categories"]
        ],
        estimand=body["estimand"],
        reports_per_device=body["reports_per_device"],
        period_seconds=body["period"],
        provisional=body["provisional"],
        periods=body["periods"],
    )


def reference_json(e: WindowEstimate) -> dict:
    """to_json as it was: one dict per category, float() of each number, None where not finite."""
    spec = e.metric.spec

    def finite(x):
        value = float(x)
        return value if np.isfinite(value) else None

    body = {
        "metric": spec.name,
        "window": e.window.name,
        "start": e.start,
        "end": e.end,
        "n": e.n,
        "mechanism": spec.mechanism.name,
        "epsilon": spec.mechanism.epsilon,
        "spec_fingerprint": spec.fingerprint,
        "withheld": e.withheld,
        "reason": e.reason,
        "estimand": e.estimand,
        "period": spec.period,
        "reports_per_device": e.reports_per_device,
        "periods": e.periods,
        "provisional": e.provisional,
        "categories": [],
    }
    if e.estimate is not None:
        est = e.estimate
        body["categories"] = [
            {
                "label": label,
                "estimate": finite(est.estimate[j]),
                "stderr": finite(est.stderr[j]),
                "lower": finite(est.lower[j]),
                "upper": finite(est.upper[j]),
                "projected": finite(est.projection[j]),
            }
            for j, label in enumerate(spec.labels)
        ]
    return body


SPECIAL = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-300, -1.5, 5e-324, 1.0])


def window_estimate(
    labels, mechanism="subset", epsilon=1.0, *, seed=0, special=0.3, window=HOUR, version=7, withheld=False, n=12345
) -> WindowEstimate:
    """A WindowEstimate with random numbers, a share `special` of them replaced by zeros (both
    signs), NaNs (both signs), infinities and other edge values."""
    spec = MetricSpec.create("metric-é", labels, mechanism, epsilon)
    metric = MetricConfig(spec, (TOTAL, HOUR))
    start, end = window.bucket(1_700_000_123)
    what = f"share of devices ({seed})"
    # Fields 16 and 17 (revision 2) both ways: provisional or not (false is left out), periods 1..
    more = dict(periods=1 + seed, provisional=seed % 2 == 0)
    if withheld:
        return WindowEstimate(
            metric, window, start, end, version, n, None, f"{n} reports so far", 1 + seed, what, **more
        )
    rng = np.random.default_rng(seed)
    k = len(labels)
    columns = []
    for _ in range(5):
        column = rng.normal(0, 0.3, k)
        pick = rng.random(k) < special
        column[pick] = rng.choice(SPECIAL, pick.sum())
        columns.append(column)
    estimate = Estimate(n, "minimax", *columns[:4], projection=columns[4], reports_per_device=1 + seed)
    return WindowEstimate(metric, window, start, end, version, n, estimate, "", 1 + seed, what, **more)


CASES = {
    "k2": dict(labels=["no", "yes"], mechanism="warner"),
    "k8-zeros": dict(labels=[f"c{j}" for j in range(8)], special=0.9),
    "k1024": dict(labels=[f"category-{j}" for j in range(1024)]),
    "k1024-all-special": dict(labels=[f"c{j}" for j in range(1024)], special=1.0),
    "k16-no-special": dict(labels=[f"c{j}" for j in range(16)], special=0.0, mechanism="rappor"),
    # Labels of 1..300 bytes: record lengths on both sides of the one-byte varint limit (127).
    "long-labels": dict(labels=["x" * j + "ü" * (j % 3) for j in range(1, 301, 7)], mechanism="krr", epsilon=2.5),
    # Labels JSON escapes, or that would break a record built by splitting or %-formatting.
    "awkward-labels": dict(labels=["a, b", '"q"', "back\\slash", "%s %d", "ünï 📈", "line\nbreak", "}, {", "null"]),
    "total-window": dict(labels=["a", "b", "c"], window=TOTAL, version=0),
    "withheld": dict(labels=["a", "b", "c"], withheld=True, n=1),
    "withheld-empty": dict(labels=["a", "b", "c"], withheld=True, n=0, version=0),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_window_encodes_byte_for_byte_as_protobuf_serializes_it(case, seed):
    e = window_estimate(**CASES[case], seed=seed)
    reference = reference_window(e)
    assert encode_window(e) == reference.SerializeToString()
    assert veil_pb2.WindowEstimate.FromString(encode_window(e)).SerializeToString() == reference.SerializeToString()


def test_a_response_of_several_windows_is_the_reference_response():
    estimates = [window_estimate(**CASES[case], seed=3) for case in CASES]
    reference = veil_pb2.EstimatesResponse(estimates=[reference_window(e) for e in estimates])
    # One cache per window: the cases share (metric, window, bucket, version), a cache's key.
    assert b"".join(ResponseCache().response(("", ""), [e]) for e in estimates) == reference.SerializeToString()
    assert ResponseCache().response(("", ""), []) == b""


@pytest.mark.parametrize("case", CASES)
def test_to_json_is_the_documented_shape_and_json_text_its_dump(case):
    e = window_estimate(**CASES[case], seed=5)
    body = e.to_json()
    assert json.dumps(body, allow_nan=False) == json.dumps(reference_json(e), allow_nan=False)
    assert e.json_text == json.dumps(body, allow_nan=False)
    body["categories"] = "changed by a caller"  # a fresh outer dict each call
    assert e.to_json()["categories"] != "changed by a caller"


def test_estimates_json_is_the_whole_body_byte_for_byte():
    estimates = [window_estimate(**CASES[case], seed=6) for case in ("k8-zeros", "withheld", "long-labels")]
    for current in (estimates, estimates[:1], []):
        generated_at = 1_700_000_000.123456
        expected = json.dumps(
            {"generated_at": generated_at, "projection": PROJECTION_NOTE, "estimates": [e.to_json() for e in current]},
            allow_nan=False,
        ).encode()
        assert estimates_json(current, generated_at) == expected


def reference_response(estimates) -> bytes:
    return veil_pb2.EstimatesResponse(estimates=[reference_window(e) for e in estimates]).SerializeToString()


def test_the_response_cache_serves_the_same_bytes_until_a_version_or_bucket_changes():
    cache = ResponseCache()
    labels = [f"c{j}" for j in range(32)]
    first = [window_estimate(labels, seed=1, version=3), window_estimate(labels, seed=2, window=TOTAL, version=3)]
    response = cache.response(("", ""), first)
    assert response == reference_response(first)
    assert cache.response(("", ""), list(first)) is response
    # Another request shape gets its own response, from the same encoded windows.
    alone = cache.response(("metric-é", "1h"), first[:1])
    assert alone == reference_response(first[:1])
    # A new version of one window (new numbers): a new response with the new numbers.
    newer = [window_estimate(labels, seed=9, version=4), first[1]]
    changed = cache.response(("", ""), newer)
    assert changed is not response and changed == reference_response(newer)
    # A new bucket of the same version (the hour turned): new again.
    moved = WindowEstimate(
        newer[0].metric,
        newer[0].window,
        newer[0].start + 3600,
        newer[0].end + 3600,
        4,
        newer[0].n,
        newer[0].estimate,
        "",
    )
    later = veil_pb2.EstimatesResponse.FromString(cache.response(("", ""), [moved, first[1]]))
    assert later.estimates[0].start_unix == newer[0].start + 3600
    # The same counts once a reporting period began: one device may have sent more, so new bytes.
    wider = WindowEstimate(
        moved.metric,
        moved.window,
        moved.start,
        moved.end,
        4,
        moved.n,
        moved.estimate,
        "",
        moved.reports_per_device + 1,
        moved.estimand,
    )
    again = veil_pb2.EstimatesResponse.FromString(cache.response(("", ""), [wider, first[1]]))
    assert again.estimates[0].reports_per_device == moved.reports_per_device + 1
    # The same counts once a period began that brought no data (c is the same, the estimand names
    # one period more spanned), or once the bucket left its lateness: new bytes each time.
    spanned = dataclasses.replace(
        wider, spanned=wider.spanned + 1, estimand=wider.estimand + ", from the one period with reports of the 2"
    )
    said = veil_pb2.EstimatesResponse.FromString(cache.response(("", ""), [spanned, first[1]]))
    assert said.estimates[0].estimand == spanned.estimand
    final = dataclasses.replace(spanned, provisional=False)
    closed = veil_pb2.EstimatesResponse.FromString(cache.response(("", ""), [final, first[1]]))
    assert not closed.estimates[0].provisional
