"""The wire encoding of batches and specs, checked against the proto's own words."""

from __future__ import annotations

import pytest
from loopback_collector import decode, to_proto

from veil.client._encoding import MAX_BATCH_BYTES, encode_batch
from veil.client._specs import spec_from_proto, spec_to_proto
from veil.mechanism import MechanismError, MetricSpec, SeededRandomSource, encoding, report_bytes
from veil.wire.v1 import veil_pb2

BATCH_ID = bytes(range(16))


def test_index_sets_are_q_little_endian_uint32_per_report():
    # At epsilon = 4 the subset design's q = 5 indices (20 bytes) beat a 38-byte bitmap.
    spec = MetricSpec.create("m", [f"c{i}" for i in range(300)], "subset", 4.0)
    reports = [tuple(range(i, i + spec.mechanism.q)) for i in (0, 7)]
    request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, BATCH_ID))
    assert (request.batch_id, request.metric, request.spec_fingerprint, request.count) == (
        BATCH_ID,
        "m",
        spec.fingerprint,
        2,
    )
    assert request.WhichOneof("reports") == "index_sets" and request.index_sets.set_size == spec.mechanism.q
    raw = request.index_sets.indices
    assert raw[:8] == b"\x00\x00\x00\x00\x01\x00\x00\x00"
    assert [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)] == [j for r in reports for j in r]


def test_bitmaps_put_category_j_at_bit_j_mod_8_of_byte_j_div_8():
    spec = MetricSpec.create("m", [f"c{i}" for i in range(10)], "rappor", 1.0)
    request = veil_pb2.UploadRequest.FromString(encode_batch(spec, [(0, 2, 9), (), (8,)], BATCH_ID))
    assert request.WhichOneof("reports") == "bitmaps"
    assert request.bitmaps.bits == bytes([0b101, 0b10, 0, 0, 0, 0b1])


@pytest.mark.parametrize(
    "mechanism,k",
    [
        ("subset", 16),
        ("krr", 5),
        ("warner", 2),
        ("rappor", 13),
        ("rappor-admissible", 8),
        ("subset", 1024),
        ("subset", 300),
    ],
)
def test_random_batches_round_trip_through_an_independent_decoder(mechanism, k):
    spec = MetricSpec.create("m", [f"c{i}" for i in range(k)], mechanism, 1.0)
    source = SeededRandomSource(k)
    reports = [spec.mechanism.randomize(i % k, source) for i in range(50)]
    rows = decode(spec, veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, BATCH_ID)))
    assert [tuple(j for j in range(k) if row[j]) for row in rows] == reports


def test_a_q_subset_design_takes_the_shorter_encoding():
    wide = MetricSpec.create("m", [f"c{i}" for i in range(1024)], "subset", 1.0)  # q = 275
    request = veil_pb2.UploadRequest.FromString(
        encode_batch(wide, [tuple(range(275)), tuple(range(749, 1024))], BATCH_ID)
    )
    assert request.WhichOneof("reports") == "bitmaps" and len(request.bitmaps.bits) == 2 * 128
    assert request.bitmaps.bits[:35] == b"\xff" * 34 + b"\x07"


def test_report_sizes_keep_batches_under_the_message_cap():
    def sent_bytes(mechanism: str, k: int) -> int:
        spec = MetricSpec.create("m", [f"c{i}" for i in range(k)], mechanism, 1.0).mechanism
        return report_bytes(spec, encoding(spec))

    assert sent_bytes("subset", 1024) == 128
    assert sent_bytes("krr", 1024) == 4
    assert sent_bytes("rappor", 9) == 2
    assert MAX_BATCH_BYTES // sent_bytes("subset", 1024) < 4 << 20


@pytest.mark.parametrize("mechanism", ["subset", "rappor", "rappor-admissible", "krr"])
def test_specs_rebuild_from_the_proto_with_the_same_fingerprint(mechanism):
    spec = MetricSpec.create("m", ["a", "b", "c", "d", "e"], mechanism, 1.5)
    assert spec_to_proto(spec) == to_proto(spec)
    assert spec_from_proto(to_proto(spec)) == spec


def test_specs_that_do_not_reproduce_their_fingerprint_are_refused():
    message = to_proto(MetricSpec.create("m", ["a", "b", "c"], "subset", 1.0))
    for change in (
        {"fingerprint": "0" * 32},
        {"epsilon": 1.0000001},
        {"q": 2},
        {"mechanism": 0},
        {"labels": ["a", "b", "b"]},
    ):
        forged = veil_pb2.MetricSpec()
        forged.CopyFrom(message)
        for field, value in change.items():
            if field == "labels":
                del forged.labels[:]
                forged.labels.extend(value)
            else:
                setattr(forged, field, value)
        with pytest.raises(MechanismError):
            spec_from_proto(forged)
