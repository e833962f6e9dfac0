"""Fuzzing the running aggregator's Upload, and the decoder under atheris.

Every input goes to a real in-process aggregator as raw bytes through a generic unary call, so
that it need not even be protobuf. An oracle written here from the wire contract (veil.proto),
not from decode.py, says what each input must get:

- a message larger than the server's limit: RESOURCE_EXHAUSTED, from gRPC before it is read;
- bytes that do not parse as an UploadRequest: INVALID_ARGUMENT (see UNPARSEABLE below);
- an undeclared metric or a stale spec fingerprint: FAILED_PRECONDITION;
- a malformed batch: INVALID_ARGUMENT, naming "batch" or the first bad report;
- a valid batch: OK with accepted = count, or duplicate = True when (metric, batch_id) was
  counted before.

Never UNKNOWN (an exception escaping the servicer), never a dead server. After every input
the counters of every metric and window (the store's n and V per weight, and the n that
Estimates.Get serves) are unchanged, or changed by exactly the batch's own reports when it was
counted; the Prometheus counters agree with the oracle at the end, and the server is healthy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from upload_contract import bitmap_width, members
from veil_testing.running import METRICS, config_dict, specs_of

from veil.aggregator import decode
from veil.aggregator.config import parse_config
from veil.aggregator.daemon import max_message_bytes
from veil.aggregator.simulate import FastKeystream, simulate_reports
from veil.aggregator.store import CountsKey
from veil.client._encoding import encode_batch
from veil.mechanism import MetricSpec, SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
HealthCheck = hypothesis.HealthCheck

UPLOAD = "/veil.wire.v1.Collector/Upload"
# Bytes that are not an UploadRequest are the caller's error, whatever grpcio does by default
# with a request its deserializer cannot parse (INTERNAL "Exception deserializing request!").
UNPARSEABLE = (grpc.StatusCode.INVALID_ARGUMENT, decode.UNPARSEABLE)

SPECS = specs_of(METRICS)
NAMES = tuple(SPECS)
MAX_BATCH = 10_000  # the default server.max_batch, which config_dict keeps
# The largest message the server reads (gRPC's max_receive_message_length), for the config
# the tests run: inputs either side of it are generated.
LIMIT = max_message_bytes(parse_config(config_dict("memory")))


# --- the oracle: the wire contract, independently of decode.py ----------------------------


def _members(spec: MetricSpec, request: veil_pb2.UploadRequest) -> np.ndarray | str:
    """(count, k) membership of a batch's reports, or "batch" / "report i" for the first
    fault, as veil.proto states the rules (upload_contract)."""
    found = members(spec.mechanism, request, MAX_BATCH)
    return f"report {found}" if isinstance(found, int) else found


class Oracle:
    """What the server must answer to each input, given what it has counted so far."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[tuple[str, bytes]] = set()
        self.reports = Counter()  # reports counted per metric (veil_reports_counted)
        self.outcomes = Counter()  # (metric label, outcome) of calls that reached the servicer

    def expect(self, data: bytes) -> tuple[grpc.StatusCode, str | None, tuple[str, np.ndarray] | None]:
        """(code, what the details start with, (metric, members) of a batch to count)."""
        try:
            request = veil_pb2.UploadRequest.FromString(data)
        except DecodeError:
            request = None
        if len(data) > self.limit:
            # Refused unread. But a batch the contract allows, encoded without anything else
            # (unknown fields, repeated fields), must fit.
            spec = SPECS.get(request.metric) if request is not None else None
            valid = spec and request.spec_fingerprint == spec.fingerprint
            if valid and isinstance(_members(spec, request), np.ndarray):
                request.DiscardUnknownFields()
                assert request.ByteSize() <= self.limit, "a valid batch exceeds the server's message limit"
            return grpc.StatusCode.RESOURCE_EXHAUSTED, None, None
        if request is None:
            return UNPARSEABLE[0], UNPARSEABLE[1], None
        spec = SPECS.get(request.metric)
        if spec is None:
            self.outcomes["(undeclared)", "unknown_metric"] += 1
            return grpc.StatusCode.FAILED_PRECONDITION, "Metric ", None
        if request.spec_fingerprint != spec.fingerprint:
            self.outcomes[spec.name, "stale_spec"] += 1
            return grpc.StatusCode.FAILED_PRECONDITION, "The batch was randomized under another spec", None
        members = _members(spec, request)
        if isinstance(members, str):
            self.outcomes[spec.name, "invalid"] += 1
            return grpc.StatusCode.INVALID_ARGUMENT, f"{members}: ", None
        if (spec.name, request.batch_id) in self.seen:
            self.outcomes[spec.name, "duplicate"] += 1
            return grpc.StatusCode.OK, "duplicate", None
        self.seen.add((spec.name, request.batch_id))
        self.outcomes[spec.name, "accepted"] += 1
        self.reports[spec.name] += request.count
        return grpc.StatusCode.OK, "accepted", (spec.name, members)


# --- the server's counters ------------------------------------------------------------------


def snapshot(aggregator) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(n per weight, V per weight) of every metric's every window, read from the store."""
    out = {}
    for metric in aggregator.config.metrics:
        mechanism = metric.spec.mechanism
        for window in metric.windows:
            key = CountsKey(metric.name, metric.spec.fingerprint, window.name, window.bucket(aggregator.frozen_now)[0])
            counts = aggregator.store.read(key, mechanism.weight_law().weights, mechanism.k)
            out[metric.name, window.name] = (counts.n, counts.v)
    return out


def served_n(estimates_stub) -> dict[tuple[str, str], int]:
    response = estimates_stub.Get(veil_pb2.EstimatesRequest(), timeout=10)
    return {(e.metric, e.window): e.n for e in response.estimates}


def expected_after(before, batch: tuple[str, np.ndarray] | None):
    """The snapshot after counting batch (or nothing)."""
    if batch is None:
        return before
    name, members = batch
    weights = SPECS[name].mechanism.weight_law().weights
    weight = members.sum(axis=1)
    n = np.array([np.sum(weight == t) for t in weights], np.int64)
    v = np.array([members[weight == t].sum(axis=0) for t in weights], np.int64).reshape(len(weights), -1)
    return {key: (bn + n, bv + v) if key[0] == name else (bn, bv) for key, (bn, bv) in before.items()}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k][0], b[k][0]) and np.array_equal(a[k][1], b[k][1]) for k in a
    )


class Harness:
    """One aggregator, one channel, the oracle, and a count of the inputs sent."""

    def __init__(self, aggregator, tally: Counter, name: str) -> None:
        self.aggregator = aggregator
        self.oracle = Oracle(max_message_bytes(aggregator.config))
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{aggregator.grpc_port}", options=[("grpc.max_send_message_length", 64 << 20)]
        )
        self.upload = self.channel.unary_unary(
            UPLOAD, request_serializer=None, response_deserializer=veil_pb2.UploadResponse.FromString
        )
        self.estimates = veil_pb2_grpc.EstimatesStub(self.channel)
        self.tally, self.name = tally, name
        self.codes = Counter()
        self.state = snapshot(aggregator)

    def send(self, data: bytes) -> None:
        code, details, batch = self.oracle.expect(data)
        try:
            response = self.upload(data, timeout=30)
            got, text = grpc.StatusCode.OK, None
        except grpc.RpcError as error:
            got, text, response = error.code(), error.details(), None
        self.codes[got.name] += 1
        self.tally[f"{self.name}: inputs sent to the running server"] += 1
        before, self.state = self.state, snapshot(self.aggregator)
        assert got == code, (got, text, code, details, data[:200])
        if code == grpc.StatusCode.OK:
            request = veil_pb2.UploadRequest.FromString(data)
            assert response.accepted == request.count
            assert response.duplicate == (details == "duplicate")
        elif details is not None:
            assert text.startswith(details), (text, details)
        assert same(self.state, expected_after(before, batch)), (code, details)
        assert served_n(self.estimates) == {key: int(n.sum()) for key, (n, _) in self.state.items()}

    def check_healthy(self) -> None:
        """SERVING, every Prometheus counter as the oracle says, and a fresh batch counted."""
        endpoint = health_pb2_grpc.HealthStub(self.channel)
        assert (
            endpoint.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        )
        registry = self.aggregator.instruments.registry
        for name in NAMES:
            assert (
                registry.get_sample_value("veil_reports_counted_total", {"metric": name}) or 0
            ) == self.oracle.reports[name]
        outcomes = {
            (sample.labels["metric"], sample.labels["outcome"]): sample.value
            for family in registry.collect()
            if family.name == "veil_uploads"
            for sample in family.samples
            if sample.name == "veil_uploads_total"
        }
        assert outcomes == dict(self.oracle.outcomes)
        spec = SPECS["browser"]
        reports = [spec.mechanism.randomize(i % spec.k, SeededRandomSource(i)) for i in range(50)]
        self.send(encode_batch(spec, reports, os.urandom(16)))
        assert self.codes["OK"] >= 1

    def close(self) -> None:
        self.channel.close()


# --- inputs ---------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _index_sets_of(reports: list[tuple[int, ...]], q: int) -> veil_pb2.IndexSets:
    return veil_pb2.IndexSets(set_size=q, indices=b"".join(j.to_bytes(4, "little") for r in reports for j in r))


def _bitmaps_of(reports: list[tuple[int, ...]], k: int) -> veil_pb2.Bitmaps:
    width = (k + 7) // 8
    return veil_pb2.Bitmaps(bits=b"".join(sum(1 << j for j in r).to_bytes(width, "little") for r in reports))


def _request(
    spec: MetricSpec, reports: list[tuple[int, ...]], batch_id: bytes, encoding: str
) -> veil_pb2.UploadRequest:
    """A valid request, in the SDK's own encoding or in either the contract allows."""
    if encoding == "sdk" or (encoding == "index_sets" and spec.mechanism.q is None):
        return veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, batch_id))
    request = veil_pb2.UploadRequest(
        batch_id=batch_id, metric=spec.name, spec_fingerprint=spec.fingerprint, count=len(reports)
    )
    if encoding == "index_sets":
        request.index_sets.CopyFrom(_index_sets_of(reports, spec.mechanism.q))
    else:
        request.bitmaps.CopyFrom(_bitmaps_of(reports, spec.k))
    return request


def _simulated(spec: MetricSpec, n: int, seed: int) -> list[tuple[int, ...]]:
    """n reports from the batch kernels (word for word spec.randomize), as index tuples."""
    values = np.random.default_rng(seed).integers(0, spec.k, n)
    reports = simulate_reports(spec.mechanism, values, keystream=FastKeystream(seed))
    if spec.mechanism.q is not None:
        return [tuple(map(int, row)) for row in reports]
    bits = np.unpackbits(reports, axis=1, count=spec.k, bitorder="little")
    return [tuple(np.flatnonzero(row).tolist()) for row in bits]


batch_ids = st.one_of(st.binary(min_size=16, max_size=16), st.just(bytes(16)), st.just(b"\xff" * 16))


@st.composite
def valid_requests(draw, max_reports: int = 30) -> veil_pb2.UploadRequest:
    spec = SPECS[draw(st.sampled_from(NAMES))]
    n = draw(st.one_of(st.integers(1, 8), st.integers(1, max_reports)))
    source = SeededRandomSource(draw(st.integers(0, 2**32 - 1)))
    reports = [spec.mechanism.randomize(source.below(spec.k), source) for _ in range(n)]
    return _request(spec, reports, draw(batch_ids), draw(st.sampled_from(["sdk", "index_sets", "bitmaps"])))


@st.composite
def mutated_bytes(draw) -> bytes:
    """A valid request's bytes truncated, flipped, spliced, extended."""
    data = bytearray(draw(valid_requests()).SerializeToString())
    for op in draw(
        st.lists(st.sampled_from(["truncate", "flip", "insert", "delete", "append", "set"]), min_size=1, max_size=4)
    ):
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "truncate":
            del data[position:]
        elif op == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[position : position + draw(st.integers(1, 8))]
        elif op == "append":
            data += draw(st.binary(min_size=1, max_size=16))
        elif op == "set" and data:
            data[position] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x2A, 0x32]))
    return bytes(data)


@st.composite
def spoiled_requests(draw) -> bytes:
    """A valid request with one or two of its reports spoiled: an index out of range, repeated
    or out of order; a bitmap bit flipped (a padding bit, or a category bit changing the
    weight), a report all zeros or all ones."""
    request = draw(valid_requests())
    spec = SPECS[request.metric]
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.integers(0, request.count - 1))
        if request.HasField("index_sets"):
            q = request.index_sets.set_size
            rows = bytearray(request.index_sets.indices)
            row = list(np.frombuffer(bytes(rows[4 * q * i : 4 * q * (i + 1)]), "<u4"))
            j = draw(st.integers(0, q - 1))
            fault = draw(st.sampled_from(["k", "max", "repeat", "swap", "any"]))
            if fault == "k":
                row[j] = spec.k
            elif fault == "max":
                row[j] = 2**32 - 1
            elif fault == "repeat" and q > 1:
                row[j] = row[(j + 1) % q]
            elif fault == "swap" and q > 1:
                row[0], row[-1] = row[-1], row[0]
            else:
                row[j] = draw(st.integers(0, spec.k + 2))
            rows[4 * q * i : 4 * q * (i + 1)] = np.array(row, "<u4").tobytes()
            request.index_sets.indices = bytes(rows)
        else:
            width = bitmap_width(spec.mechanism)
            bits = bytearray(request.bitmaps.bits)
            fault = draw(st.sampled_from(["flip", "padding", "zeros", "ones"]))
            if fault == "flip":
                j = draw(st.integers(0, 8 * width - 1))
                bits[width * i + j // 8] ^= 1 << (j % 8)
            elif fault == "padding" and spec.k % 8:
                bits[width * i + width - 1] |= 1 << draw(st.integers(spec.k % 8, 7))
            else:
                row = ((1 << spec.k) - 1 if fault == "ones" else 0).to_bytes(width, "little")
                bits[width * i : width * (i + 1)] = row
            request.bitmaps.bits = bytes(bits)
    return request.SerializeToString()


EXTREME_COUNTS = [0, 1, 2, MAX_BATCH - 1, MAX_BATCH, MAX_BATCH + 1, 2**31 - 1, 2**31, 2**32 - 1]


@st.composite
def tampered_requests(draw) -> bytes:
    """A valid request with fields set to wrong values: other metrics, stale fingerprints,
    extreme counts, odd batch ids, the other encoding, wrong set sizes, random payloads."""
    request = draw(valid_requests())
    other = SPECS[draw(st.sampled_from(NAMES))]
    for field in draw(
        st.lists(
            st.sampled_from(
                ["metric", "fingerprint", "count", "batch_id", "set_size", "encoding", "clear", "payload", "swap"]
            ),
            min_size=1,
            max_size=3,
            unique=True,
        )
    ):
        if field == "metric":
            request.metric = draw(
                st.one_of(
                    st.sampled_from(NAMES),
                    st.text(max_size=40),
                    st.just(request.metric.upper()),
                    st.just(request.metric + "\x00"),
                )
            )
        elif field == "fingerprint":
            request.spec_fingerprint = draw(
                st.one_of(st.just(other.fingerprint), st.text(max_size=40), st.just(request.spec_fingerprint[:-1]))
            )
        elif field == "count":
            request.count = draw(
                st.one_of(
                    st.sampled_from(EXTREME_COUNTS),
                    st.integers(max(0, request.count - 2), request.count + 2),
                    st.integers(0, 2**32 - 1),
                )
            )
        elif field == "batch_id":
            request.batch_id = draw(st.binary(max_size=40))
        elif field == "set_size":
            request.index_sets.set_size = draw(st.one_of(st.integers(0, 40), st.just(2**32 - 1)))
        elif field == "encoding":
            data = request.index_sets.indices if request.HasField("index_sets") else request.bitmaps.bits
            if request.HasField("index_sets"):
                request.bitmaps.bits = data
            else:
                request.index_sets.indices = data
                request.index_sets.set_size = draw(st.integers(0, 40))
        elif field == "clear" and request.WhichOneof("reports"):
            request.ClearField(request.WhichOneof("reports"))
        elif field == "payload":
            data = draw(st.binary(max_size=200))
            if request.HasField("index_sets"):
                request.index_sets.indices = data
            else:
                request.bitmaps.bits = data
        elif field == "swap":
            # Another metric's name and fingerprint on these reports: a well-formed request of a
            # design its payload may or may not fit.
            request.metric, request.spec_fingerprint = other.name, other.fingerprint
    return request.SerializeToString()


@st.composite
def wire_soup(draw, depth: int = 0) -> bytes:
    """Hand-encoded protobuf fields with wrong wire types for the known field numbers (a
    length-delimited count, a varint metric, a fixed32 batch id, groups, reserved wire types),
    overlong varints, bad UTF-8, huge declared lengths, unknown fields, nested soup."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.one_of(st.integers(1, 7), st.sampled_from([0, 15, 16, 2**29 - 1]), st.integers(1, 2**29 - 1)))
        wire_type = draw(st.integers(0, 7))
        out += _key(number, wire_type)
        if wire_type == 0:
            value = _varint(draw(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**32, 2**63]))))
            if draw(st.booleans()):  # overlong: padded with continuation bytes, or past 10 bytes
                value = bytes(b | 0x80 for b in value) + b"\x80" * draw(st.integers(0, 10)) + b"\x00"
            out += value
        elif wire_type == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire_type == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        elif wire_type == 2:
            if depth < 3 and draw(st.booleans()):
                body = draw(wire_soup(depth + 1))
            else:
                bad_utf8 = st.sampled_from([b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80"])
                body = draw(st.one_of(st.binary(max_size=40), bad_utf8))
            declared = draw(st.one_of(st.just(len(body)), st.integers(0, 2**32)))
            out += _varint(declared) + body
        elif wire_type == 3 and draw(st.booleans()):
            out += draw(st.binary(max_size=8))
            out += _key(number, 4)  # a matching end group
        # 4 (a stray end group), 6 and 7 (reserved) stand alone
    return bytes(out)


@st.composite
def extreme_sizes(draw) -> bytes:
    """Batches of max_batch and max_batch + 1 reports, a count of 2**32 - 1 on a small
    payload, messages either side of the size limit, a huge unknown field, deep nesting."""
    kind = draw(st.sampled_from(["max", "max+1", "huge-count", "limit", "unknown-field", "nested"]))
    spec = SPECS[draw(st.sampled_from(NAMES))]
    limit = LIMIT
    if kind in ("max", "max+1"):
        n = MAX_BATCH + (kind == "max+1")
        reports = _simulated(spec, n, seed=draw(st.integers(0, 2**16)))
        return _request(
            spec, reports, draw(batch_ids), draw(st.sampled_from(["sdk", "index_sets", "bitmaps"]))
        ).SerializeToString()
    if kind == "huge-count":
        request = draw(valid_requests(max_reports=3))
        request.count = 2**32 - 1
        return request.SerializeToString()
    if kind == "limit":
        # A payload making the whole message limit + delta bytes long (the payload's length
        # prefixes grow with it, hence a few rounds).
        request = draw(valid_requests(max_reports=1))
        target = limit + draw(st.integers(-3, 3))
        field, name = (request.index_sets, "indices") if request.HasField("index_sets") else (request.bitmaps, "bits")
        base, extra = getattr(field, name), 0
        for _ in range(6):
            setattr(field, name, base + bytes(extra))
            if request.ByteSize() == target:
                break
            extra = max(0, extra + target - request.ByteSize())
        return request.SerializeToString()
    if kind == "unknown-field":
        request = draw(valid_requests())
        size = draw(st.sampled_from([1 << 10, 1 << 16, limit - 200, limit + 1]))
        return request.SerializeToString() + _key(99, 2) + _varint(size) + b"\x01" * size
    # Nested groups or length-delimited messages far deeper than any parser's recursion limit.
    depth = draw(st.sampled_from([50, 101, 200, 5000]))
    if draw(st.booleans()):
        return _key(99, 3) * depth + _key(99, 4) * depth
    body = b""
    for _ in range(depth):
        body = _key(5, 2) + _varint(len(body)) + body
    return body


uploads = st.one_of(
    st.binary(max_size=300),
    # Twice each: most inputs should get past the parser to the servicer and the decoder.
    valid_requests().map(lambda r: r.SerializeToString()),
    mutated_bytes(),
    tampered_requests(),
    spoiled_requests(),
    valid_requests().map(lambda r: r.SerializeToString()),
    mutated_bytes(),
    tampered_requests(),
    spoiled_requests(),
    wire_soup(),
    extreme_sizes(),
    # Other messages of the same package sent to Upload.
    st.sampled_from(
        [
            veil_pb2.GetMetricSpecsRequest(metrics=["browser"]).SerializeToString(),
            veil_pb2.EstimatesRequest(metric="browser", window="total").SerializeToString(),
            veil_pb2.UploadResponse(accepted=5, duplicate=True).SerializeToString(),
            veil_pb2.MetricSpec(name="browser", labels=["a"], q=2).SerializeToString(),
        ]
    ),
)


def fuzz_server(aggregator, tally: Counter, name: str, examples: int) -> Harness:
    harness = Harness(aggregator, tally, name)
    assert harness.oracle.limit == LIMIT

    # No shrinking: the server keeps what it counted, so a failing input replayed later is not
    # the same experiment; the first failure is reported as found.
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )
    @hypothesis.given(uploads)
    def check(data: bytes) -> None:
        harness.send(data)

    try:
        check()
        harness.check_healthy()
    finally:
        harness.close()
    return harness


def _report(harness: Harness, tally: Counter) -> None:
    for code, calls in sorted(harness.codes.items()):
        tally[f"{harness.name}: status {code}"] += calls


def test_fuzzed_uploads_get_the_right_status_and_never_change_counters_wrongly(start_frozen_aggregator, tally):
    aggregator = start_frozen_aggregator()
    harness = fuzz_server(aggregator, tally, "server fuzz", examples=500)
    _report(harness, tally)
    # Every class of outcome was reached, so the run did more than bounce off the parser.
    assert {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"} <= set(harness.codes)
    assert not {"UNKNOWN", "INTERNAL"} & set(harness.codes)


def test_the_largest_batches_and_messages_at_the_limit(start_frozen_aggregator, tally):
    """Deterministic edges the fuzzer may miss: max_batch reports of every metric in each
    encoding it allows are counted, max_batch + 1 refused; a message of exactly the limit is
    read, one byte more is not."""
    harness = Harness(start_frozen_aggregator(), tally, "edge cases")
    try:
        encodings = 0
        for number, spec in enumerate(SPECS.values()):
            for encoding in ["bitmaps"] if spec.mechanism.q is None else ["bitmaps", "index_sets"]:
                encodings += 1
                for n in (MAX_BATCH, MAX_BATCH + 1):
                    reports = _simulated(spec, n, seed=number)
                    harness.send(_request(spec, reports, os.urandom(16), encoding).SerializeToString())
        spec = SPECS["browser"]
        for size in (LIMIT - 1, LIMIT, LIMIT + 1):
            # A valid batch of one report, brought to `size` by an unknown bytes field (99).
            base = _request(spec, _simulated(spec, 1, seed=size), os.urandom(16), "sdk").SerializeToString()
            filler = size - len(base)
            while len(data := base + _key(99, 2) + _varint(filler) + bytes(filler)) != size:
                filler -= len(data) - size
            harness.send(data)
        assert harness.codes == Counter(OK=encodings + 2, INVALID_ARGUMENT=encodings, RESOURCE_EXHAUSTED=1)
        harness.check_healthy()
    finally:
        harness.close()


@pytest.mark.slow
def test_fuzzed_uploads_at_length(start_frozen_aggregator, tally):
    aggregator = start_frozen_aggregator()
    examples = int(os.environ.get("VEIL_FUZZ_EXAMPLES", 5000))
    harness = fuzz_server(aggregator, tally, "server fuzz (slow)", examples=examples)
    _report(harness, tally)
    assert "UNKNOWN" not in harness.codes


# --- the decoder under atheris ----------------------------------------------------------------

HARNESS = Path(__file__).with_name("fuzz_decode.py")


def run_atheris(tmp_path: Path, seconds: int) -> tuple[int, str]:
    """Run fuzz_decode.py under libFuzzer for `seconds`; (executions, output)."""
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    subprocess.run([sys.executable, str(HARNESS), "--write-corpus", str(corpus)], check=True, timeout=300)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            str(corpus),
            f"-max_total_time={seconds}",
            "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/",
            "-rss_limit_mb=4096",
            "-timeout=30",
            "-close_fd_mask=1",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and not list(artifacts.iterdir()), output[-5000:]
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    assert executed, output[-3000:]
    return int(executed.group(1)), output


def test_atheris_decoder_smoke(tmp_path, tally):
    """A short coverage-guided run (tens of thousands of inputs), so that the harness itself is
    exercised on every run; the long run is test_atheris_decoder (slow)."""
    executions, _ = run_atheris(tmp_path, seconds=5)
    tally["atheris decode_upload executions (5 s)"] += executions
    assert executions > 1000


@pytest.mark.slow
def test_atheris_decoder(tmp_path, tally):
    seconds = int(os.environ.get("VEIL_ATHERIS_SECONDS", 60))
    executions, _ = run_atheris(tmp_path, seconds=seconds)
    tally[f"atheris decode_upload executions ({seconds} s)"] += executions
    assert executions > 10_000
