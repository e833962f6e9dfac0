"""A numeric metric served end to end: its config -> a real in-process aggregator -> reports of
known numbers uploaded through the real wire (gRPC and HTTP, with a token scoped to the numeric
metric) -> the mean and quantiles over gRPC, the HTTP JSON, the CLI and /metrics, with the shapes
docs/protocol.md section 9 gives and the values numeric.py computes; and the config's numeric
keys refused with one clear sentence each."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request

import grpc
import numpy as np
import pytest
from veil_testing.promtool import promtool_lint
from veil_testing.running import bearer, collector

from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator
from veil.aggregator.errors import ConfigError
from veil.aggregator.estimates_wire import encode_window
from veil.aggregator.numeric import QUANTILES, mean_estimate, quantile_estimates
from veil.cli import main
from veil.client import encode_batch
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

UPLOAD = "upload-token-numeric-0123456789abcdef"
READ = "read-token-numeric-00112233445566778"
LOW, HIGH = 0.0, 2000.0
BUCKETS = [100, 250, 500, 1000]
N = 12_000
METRIC = {
    "name": "load_ms",
    "type": "numeric",
    "range": [LOW, HIGH],
    "buckets": BUCKETS,
    "epsilon": 4.0,
    "windows": ["total", "1h"],
}


def numeric_config(**metric: object) -> dict:
    return {
        "server": {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "min_n": 100, "grace_period": 1.0},
        "store": {"url": "memory"},
        "metrics": [{**METRIC, **metric}, {"name": "browser", "labels": ["a", "b"], "epsilon": 1.0}],
        "auth": {
            "upload_tokens": [{"name": "app", "token": UPLOAD, "metrics": ["load_ms"]}],
            "read_tokens": [{"name": "dashboard", "token": READ}],
        },
    }


def values() -> np.ndarray:
    """The devices' page load times: lognormal, median 300 ms, some past the range (clipped)."""
    return np.random.default_rng(27).lognormal(math.log(300.0), 0.8, N)


def batches(spec, numbers: np.ndarray, seed: int) -> list[bytes]:
    """The reports of these numbers in one part, as devices make them (each its own rounding
    threshold alpha), in uploads of 4000."""
    numeric = spec.numeric
    alphas = np.random.default_rng(seed).random(numbers.size)
    source = SeededRandomSource(seed)
    reports = [
        spec.mechanism.randomize(numeric.category(numeric.clip(float(x))[0], float(a)), source)
        for x, a in zip(numbers, alphas)
    ]
    return [encode_batch(spec, reports[i : i + 4000], bytes([seed, i // 4000]) * 8) for i in range(0, N, 4000)]


@pytest.fixture(scope="module")
def served():
    """An aggregator holding N reports of each part: the mean's over gRPC, the distribution's
    over HTTP, both with the one upload token that names the numeric metric."""
    config = parse_config(numeric_config())
    aggregator = Aggregator(config)
    aggregator.start()
    try:
        specs = {m.name: m.spec for m in config.metrics}
        numbers = values()
        stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
        for body in batches(specs["load_ms.mean"], numbers, 1):
            reply = stub.Upload(veil_pb2.UploadRequest.FromString(body), metadata=bearer(UPLOAD), timeout=10)
            assert reply.accepted == 4000
        for body in batches(specs["load_ms.distribution"], numbers, 2):
            request = urllib.request.Request(
                f"http://127.0.0.1:{aggregator.http_port}/v1/upload",
                data=body,
                method="POST",
                headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {UPLOAD}"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
        yield aggregator, specs, numbers
    finally:
        aggregator.stop(grace=0)


def grpc_windows(aggregator, **request: object) -> list:
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    return list(stub.Get(veil_pb2.EstimatesRequest(**request), metadata=bearer(READ), timeout=10).estimates)


def http_json(aggregator, path: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{aggregator.http_port}{path}", headers={"Authorization": f"Bearer {READ}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def live_estimate(aggregator, part: str):
    (e,) = aggregator.live.current(f"load_ms.{part}", "total")
    return e


def test_the_mean_over_grpc_is_numeric_py_s_and_covers_the_truth(served):
    aggregator, specs, numbers = served
    (window,) = grpc_windows(aggregator, metric="load_ms.mean", window="total")
    assert window.numeric.metric == "load_ms" and window.numeric.part == veil_pb2.NUMERIC_MEAN
    assert (window.numeric.low, window.numeric.high) == (LOW, HIGH)
    assert window.numeric.levels == specs["load_ms.mean"].numeric.levels and not window.quantiles
    e = live_estimate(aggregator, "mean")
    expected = mean_estimate(specs["load_ms.mean"], e.estimate)
    got = window.mean
    assert (got.estimate, got.stderr, got.lower, got.upper) == (
        expected.estimate,
        expected.stderr,
        expected.lower,
        expected.upper,
    )
    truth = float(np.clip(numbers, LOW, HIGH).mean())
    assert got.lower <= truth <= got.upper
    assert LOW < got.lower < got.estimate < got.upper < HIGH and got.upper - got.lower < (HIGH - LOW) / 10
    assert "mean of load_ms" in window.estimand


def test_the_quantiles_over_grpc_are_numeric_py_s_with_bucket_boundaries_as_ends(served):
    aggregator, specs, numbers = served
    spec = specs["load_ms.distribution"]
    (window,) = grpc_windows(aggregator, metric="load_ms.distribution", window="total")
    assert window.numeric.part == veil_pb2.NUMERIC_DISTRIBUTION and list(window.numeric.boundaries) == BUCKETS
    assert not window.HasField("mean") and len(window.categories) == len(BUCKETS) + 1
    expected = quantile_estimates(spec, live_estimate(aggregator, "distribution").estimate)
    got = [(q.q, q.estimate, q.lower, q.upper) for q in window.quantiles]
    assert got == [(x.q, x.estimate, x.lower, x.upper) for x in expected]
    assert [q for q, *_ in got] == list(QUANTILES)
    edges = {LOW, *BUCKETS, HIGH}
    clipped = np.clip(numbers, LOW, HIGH)
    assert got[0][2:] == (250, 500)  # the median, 300 ms, known to its bucket
    for q, estimate, lower, upper in got:
        assert lower in edges and upper in edges and lower <= estimate <= upper
        assert lower <= float(np.quantile(clipped, q)) <= upper


@pytest.mark.parametrize("part", ["mean", "distribution"])
def test_the_hand_written_wire_bytes_are_protobuf_s_own(served, part):
    aggregator, _, _ = served
    e = live_estimate(aggregator, part)
    message = veil_pb2.WindowEstimate.FromString(encode_window(e))
    assert encode_window(e) == message.SerializeToString()  # fields in number order, 18..20 last
    assert message.HasField("mean") == (part == "mean") and len(message.quantiles) == (3 if part != "mean" else 0)
    assert [c.label for c in message.categories] == list(e.metric.spec.labels)


def test_the_http_json_has_protocol_section_9_s_shape_and_the_grpc_numbers(served):
    aggregator, specs, _ = served
    (mean,) = http_json(aggregator, "/v1/estimates/load_ms.mean?window=total")["estimates"]
    levels = specs["load_ms.mean"].numeric.levels
    assert mean["numeric"] == {
        "metric": "load_ms",
        "part": "mean",
        "low": LOW,
        "high": HIGH,
        "boundaries": [],
        "levels": levels,
    }
    (over_grpc,) = grpc_windows(aggregator, metric="load_ms.mean", window="total")
    m = over_grpc.mean
    assert mean["mean"] == {"estimate": m.estimate, "stderr": m.stderr, "lower": m.lower, "upper": m.upper}
    assert "quantiles" not in mean
    (dist,) = http_json(aggregator, "/v1/estimates/load_ms.distribution?window=total")["estimates"]
    assert dist["numeric"]["part"] == "distribution" and dist["numeric"]["boundaries"] == BUCKETS
    assert "mean" not in dist
    assert [sorted(q) for q in dist["quantiles"]] == [["estimate", "lower", "q", "upper"]] * 3
    assert [q["q"] for q in dist["quantiles"]] == list(QUANTILES)
    # A metric of categories carries none of the three.
    (browser,) = http_json(aggregator, "/v1/estimates/browser?window=total")["estimates"]
    assert not {"numeric", "mean", "quantiles"} & set(browser)


def test_series_merged_and_groups_of_buckets(served):
    aggregator, _, _ = served
    series = http_json(aggregator, "/v1/series/load_ms.distribution?window=1h&last=2h")["estimates"]
    (merged,) = http_json(aggregator, "/v1/series/load_ms.mean?window=1h&last=2h&merged=1")["estimates"]
    (total_mean,) = http_json(aggregator, "/v1/estimates/load_ms.mean?window=total")["estimates"]
    (total_dist,) = http_json(aggregator, "/v1/estimates/load_ms.distribution?window=total")["estimates"]
    # Every report is in one of the last two hours' buckets: that one has the total's quantiles.
    assert sum(w["n"] for w in series) == N
    for w in series:
        assert ("quantiles" in w) == (w["n"] == N) and w["numeric"] == total_dist["numeric"]
    assert [w["quantiles"] for w in series if "quantiles" in w] == [total_dist["quantiles"]]
    assert merged["mean"] == total_mean["mean"]
    # Bucket labels hold a comma; a group of buckets, comma-separated, still reads as buckets.
    query = urllib.request.quote("[0, 100),[100, 250)")
    (grouped,) = http_json(aggregator, f"/v1/estimates/load_ms.distribution?window=total&group={query}")["estimates"]
    assert grouped["group"]["labels"] == ["[0, 100)", "[100, 250)"]
    shares = {c["label"]: c["estimate"] for c in total_dist["categories"]}
    assert grouped["group"]["estimate"] == pytest.approx(shares["[0, 100)"] + shares["[100, 250)"])
    assert grouped["quantiles"] == total_dist["quantiles"]
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    request = veil_pb2.SeriesRequest(metric="load_ms.mean", window="1h", from_unix=int(time.time()) - 7200, merged=True)
    (over_grpc,) = stub.Series(request, metadata=bearer(READ), timeout=10).estimates
    assert over_grpc.mean.estimate == merged["mean"]["estimate"]


def test_the_cli_prints_the_mean_and_quantiles(served, capsys, monkeypatch):
    aggregator, _, _ = served
    monkeypatch.setenv("VEIL_TOKEN", READ)
    address = f"127.0.0.1:{aggregator.grpc_port}"
    assert main(["estimates", "--address", address, "--window", "total", "--json"]) == 0
    by_metric = {w["metric"]: w for w in json.loads(capsys.readouterr().out)["estimates"]}
    (http_mean,) = http_json(aggregator, "/v1/estimates/load_ms.mean?window=total")["estimates"]
    (http_dist,) = http_json(aggregator, "/v1/estimates/load_ms.distribution?window=total")["estimates"]
    for key in ("numeric", "mean"):
        assert by_metric["load_ms.mean"][key] == http_mean[key]
    for key in ("numeric", "quantiles"):
        assert by_metric["load_ms.distribution"][key] == http_dist[key]
    assert main(["estimates", "load_ms.distribution", "--address", address, "--window", "total"]) == 0
    table = capsys.readouterr().out
    q90 = http_dist["quantiles"][1]
    assert f"q90 of load_ms: {q90['estimate']:.4g}, 95% interval [{q90['lower']:.4g}, {q90['upper']:.4g}]" in table
    assert main(["estimates", "load_ms.mean", "--address", address, "--window", "total"]) == 0
    assert f"mean of load_ms: {http_mean['mean']['estimate']:.4g}" in capsys.readouterr().out
    # --group splits at commas, which bucket labels hold: the buckets still come back whole.
    group = ["--group", "[0, 100), [100, 250)", "--json"]
    assert main(["estimates", "load_ms.distribution", "--address", address, "--window", "total", *group]) == 0
    (grouped,) = json.loads(capsys.readouterr().out)["estimates"]
    assert grouped["group"]["labels"] == ["[0, 100)", "[100, 250)"]


def test_the_cli_s_series_table_and_csv_carry_the_numbers_in_the_metric_s_units(served, capsys, monkeypatch):
    aggregator, _, _ = served
    monkeypatch.setenv("VEIL_TOKEN", READ)
    address = f"127.0.0.1:{aggregator.grpc_port}"
    (dist,) = http_json(aggregator, "/v1/estimates/load_ms.distribution?window=1h")["estimates"]
    assert main(["estimates", "load_ms.distribution", "--address", address, "--window", "1h", "--last", "2h"]) == 0
    table = capsys.readouterr().out
    q50 = dist["quantiles"][0]
    assert "q50" in table.splitlines()[1] and "q99" in table.splitlines()[1]
    assert f"{q50['estimate']:.4g} [{q50['lower']:.4g}, {q50['upper']:.4g}]" in table
    assert main(["estimates", "load_ms.mean", "--address", address, "--window", "total", "--csv"]) == 0
    (mean_row,) = [row for row in capsys.readouterr().out.splitlines() if ",mean," in row]
    (mean,) = http_json(aggregator, "/v1/estimates/load_ms.mean?window=total")["estimates"]
    assert mean_row.split(",")[10:14] == [repr(mean["mean"][x]) for x in ("estimate", "stderr", "lower", "upper")]


def test_watch_streams_the_mean(served):
    aggregator, _, _ = served
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.grpc_port}"))
    stream = stub.Watch(veil_pb2.WatchRequest(metric="load_ms.mean", window="total"), metadata=bearer(READ), timeout=10)
    first = next(iter(stream))
    stream.cancel()
    (window,) = first.estimates
    (over_get,) = grpc_windows(aggregator, metric="load_ms.mean", window="total")
    assert window.mean == over_get.mean and window.numeric == over_get.numeric


def test_a_token_scoped_to_the_numeric_metric_uploads_both_parts_and_nothing_else(served):
    aggregator, specs, _ = served
    assert [live_estimate(aggregator, part).n for part in ("mean", "distribution")] == [N, N]
    other = parse_config(numeric_config()).metric("browser")
    assert other is not None
    reports = [other.spec.mechanism.randomize(0, SeededRandomSource(3)) for _ in range(10)]
    body = encode_batch(other.spec, reports, b"browser-batch-01")
    stub = collector(f"127.0.0.1:{aggregator.grpc_port}")
    with pytest.raises(grpc.RpcError) as refused:
        stub.Upload(veil_pb2.UploadRequest.FromString(body), metadata=bearer(UPLOAD), timeout=10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_metrics_exports_the_mean_and_quantiles_with_their_intervals(served):
    aggregator, _, _ = served
    request = urllib.request.Request(
        f"http://127.0.0.1:{aggregator.http_port}/metrics", headers={"Authorization": f"Bearer {READ}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    (over_http,) = http_json(aggregator, "/v1/estimates/load_ms.mean?window=total")["estimates"]
    mean = over_http["mean"]
    for suffix, key in (("", "estimate"), ("_stderr", "stderr"), ("_lower", "lower"), ("_upper", "upper")):
        assert f'veil_numeric_mean{suffix}{{metric="load_ms",window="total"}} {mean[key]!r}' in text
    quantiles = [line for line in text.splitlines() if line.startswith("veil_numeric_quantile")]
    assert len(quantiles) == 2 * 3 * 3  # 2 windows x 3 quantiles x (estimate, lower, upper)
    assert 'veil_numeric_quantile_upper{metric="load_ms",q="0.99",window="total"}' in text
    assert promtool_lint(text) == ""


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"type": "number"},
            'metrics[0].type: expected "categories" (the default), "numeric" or "strings", got \'number\'.',
        ),
        ({"range": [5, 5]}, "metrics[0].range: expected [low, high], two finite numbers with low < high, got [5, 5]."),
        (
            {"range": "0..10"},
            "metrics[0].range: expected [low, high], two finite numbers with low < high, got '0..10'.",
        ),
        ({"buckets": ["a"]}, "metrics[0].buckets: expected a list of bucket boundaries (numbers), got ['a']."),
        ({"buckets": [100, 50]}, "bucket boundaries of numeric metric 'load_ms' must increase strictly"),
        ({"buckets": [100, 3000]}, "lie strictly inside its range [0, 2000]"),
        (
            {"estimate": ["median"]},
            'metrics[0].estimate: expected ["mean"], ["distribution"] or both, got [\'median\'].',
        ),
        ({"estimate": ["mean"]}, 'metrics[0].buckets: given, but estimate does not ask for the "distribution".'),
        ({"buckets": [], "estimate": ["distribution"]}, "metrics[0].buckets: the distribution needs bucket boundaries"),
        (
            {"mean_share": 1.0},
            "metrics[0].mean_share: expected the share of epsilon the mean gets, above 0 and below 1",
        ),
        (
            {"buckets": [], "mean_share": 0.5},
            "metrics[0].mean_share: only for a metric estimating both the mean and the distribution.",
        ),
        ({"labels": ["a"]}, "labels"),
    ],
)
def test_numeric_config_mistakes_are_one_clear_sentence(change, message):
    raw = numeric_config(**change)
    del raw["auth"]
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    text = str(err.value)
    assert message in text and not re.search(r"\.\s+[A-Z]", text) and text.endswith("."), text  # one sentence
