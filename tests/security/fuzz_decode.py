"""An atheris (libFuzzer) harness for veil.aggregator.decode.decode_upload.

    python tests/security/fuzz_decode.py --write-corpus DIR    # seed inputs: valid uploads
    python tests/security/fuzz_decode.py DIR -max_total_time=60 -print_final_stats=1

Each input is one UploadRequest, decoded for a metric of every mechanism (and of q-subset
designs with and without padding bits). The first byte picks how the rest becomes a request:
even, parsed as protobuf bytes (a DecodeError ends the input: the server never decodes those);
odd, built field by field from the bytes (FuzzedDataProvider), so that most inputs reach the
per-report checks rather than the parser.

Findings, each raised as an exception, which libFuzzer reports as a crash with the input:
- any exception from decode_upload other than InvalidBatch;
- a verdict that differs from a reference written here from the wire contract (veil.proto):
  accepted where the reference rejects, rejected where it accepts, another report named;
- accepted counts that differ from the reference's plain sums, or a total other than count;
- a request changed by decoding (it must be read in place and never written).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris
import numpy as np
from google.protobuf.message import DecodeError

# Imported before instrumentation: numpy, protobuf, the numba kernels (numba compiles Python
# bytecode, which must stay as written) and the mechanisms. Only the decoder is instrumented.
from veil.aggregator._errors import InvalidBatch
from veil.aggregator.simulate import FastKeystream, simulate_reports
from veil.mechanism import AdmissibleRapporSpec, KrrSpec, MetricSpec, RapporSpec, SubsetSpec, WarnerSpec
from veil.wire.v1 import veil_pb2

with atheris.instrument_imports(include=["veil.aggregator.decode"]):
    from veil.aggregator.decode import decode_upload

MAX_REPORTS = 64
SPECS = [
    SubsetSpec(13, 0.5),  # q = 5, three padding bits
    SubsetSpec(16, 1.0),  # q = 4, no padding
    KrrSpec(6, 1.0),
    WarnerSpec(2, 1.0),
    RapporSpec(13, 1.0),
    RapporSpec(8, 2.0),
    AdmissibleRapporSpec(9, 1.0),
    AdmissibleRapporSpec(16, 2.0),
]
METRICS = [MetricSpec(f"m{i}", tuple(f"c{j}" for j in range(s.k)), s) for i, s in enumerate(SPECS)]


class Finding(AssertionError):
    pass


@atheris.instrument_func  # its branches guide the fuzzer too (a differential harness)
def reference(spec, request: veil_pb2.UploadRequest) -> np.ndarray | str | int:
    """(count, k) report membership, "batch" for a batch fault, or the first bad report."""
    count = request.count
    if len(request.batch_id) != 16 or count == 0 or count > MAX_REPORTS:
        return "batch"
    payload = request.WhichOneof("reports")
    if payload == "index_sets":
        q = spec.q
        if q is None or request.index_sets.set_size != q or len(request.index_sets.indices) != 4 * q * count:
            return "batch"
        rows = np.frombuffer(request.index_sets.indices, "<u4").reshape(count, q).astype(np.int64)
        for i, row in enumerate(rows.tolist()):
            if max(row) >= spec.k or any(a >= b for a, b in zip(row, row[1:])):
                return i
        members = np.zeros((count, spec.k), bool)
        members[np.arange(count)[:, None], rows] = True
        return members
    if payload == "bitmaps":
        width = (spec.k + 7) // 8
        if len(request.bitmaps.bits) != count * width:
            return "batch"
        bits = np.unpackbits(np.frombuffer(request.bitmaps.bits, np.uint8).reshape(count, width), axis=1,
                             bitorder="little")
        if spec.q is not None:
            allowed = {spec.q}
        elif isinstance(spec, AdmissibleRapporSpec):
            allowed = set(range(1, spec.k))
        else:
            allowed = set(range(spec.k + 1))
        for i, row in enumerate(bits):
            if row[spec.k:].any() or int(row.sum()) not in allowed:
                return i
        return bits[:, : spec.k].astype(bool)
    return "batch"


@atheris.instrument_func
def check(metric: MetricSpec, request: veil_pb2.UploadRequest) -> None:
    spec = metric.mechanism
    before = request.SerializeToString(deterministic=True)
    expected = reference(spec, request)
    try:
        counts = decode_upload(request, metric, max_reports=MAX_REPORTS)
    except InvalidBatch as error:
        got = "batch" if error.report is None else error.report
        if isinstance(expected, np.ndarray) or got != expected:
            raise Finding(f"{spec.name} k={spec.k}: rejected ({error}) where the contract says {expected!r:.60}")
    else:
        if not isinstance(expected, np.ndarray):
            raise Finding(f"{spec.name} k={spec.k}: accepted where the contract says {expected!r}")
        weight = expected.sum(axis=1)
        n = [int(np.sum(weight == t)) for t in counts.weights]
        v = [expected[weight == t].sum(axis=0).tolist() for t in counts.weights]
        if counts.total != request.count or counts.n.tolist() != n or counts.v.tolist() != v:
            raise Finding(f"{spec.name} k={spec.k}: counted {counts.n.tolist()} / {counts.v.tolist()}, not {n} / {v}")
    if request.SerializeToString(deterministic=True) != before:
        raise Finding("decode_upload changed the request")


@atheris.instrument_func
def structured(data: bytes) -> veil_pb2.UploadRequest:
    fdp = atheris.FuzzedDataProvider(data)
    request = veil_pb2.UploadRequest()
    request.batch_id = fdp.ConsumeBytes(16 if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 24))
    request.metric = "m"
    count_kind = fdp.ConsumeIntInRange(0, 3)
    request.count = (fdp.ConsumeIntInRange(0, 2**32 - 1) if count_kind == 0 else
                     MAX_REPORTS + fdp.ConsumeIntInRange(0, 2) if count_kind == 1 else fdp.ConsumeIntInRange(0, 12))
    kind = fdp.ConsumeIntInRange(0, 2)
    if kind == 0:
        request.index_sets.set_size = fdp.ConsumeIntInRange(0, 6) if fdp.ConsumeBool() else fdp.ConsumeUInt(4)
        request.index_sets.indices = fdp.ConsumeBytes(fdp.remaining_bytes())
    elif kind == 1:
        request.bitmaps.bits = fdp.ConsumeBytes(fdp.remaining_bytes())
    return request


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        try:
            request = veil_pb2.UploadRequest.FromString(data[1:])
        except DecodeError:
            return
    else:
        request = structured(data[1:])
    for metric in METRICS:
        check(metric, request)


def seeds() -> list[bytes]:
    """Valid uploads of every design in both encodings, as raw-mode inputs."""
    out = []
    for number, spec in enumerate(SPECS):
        for n in (1, 3, 20):
            values = np.random.default_rng(number).integers(0, spec.k, n)
            reports = simulate_reports(spec, values, keystream=FastKeystream(number + n))
            request = veil_pb2.UploadRequest(batch_id=bytes(range(16)), metric="m", count=n)
            if spec.q is not None:
                request.index_sets.set_size = spec.q
                request.index_sets.indices = reports.astype("<u4").tobytes()
                out.append(b"\x00" + request.SerializeToString())
                bits = np.zeros((n, 8 * ((spec.k + 7) // 8)), np.uint8)
                np.put_along_axis(bits, reports.astype(np.intp), 1, axis=1)
                request.bitmaps.bits = np.packbits(bits, axis=1, bitorder="little").tobytes()
            else:
                request.bitmaps.bits = reports.tobytes()
            out.append(b"\x00" + request.SerializeToString())
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-corpus":
        folder = Path(sys.argv[2])
        for i, seed in enumerate(seeds()):
            (folder / f"seed-{i:03d}").write_bytes(seed)
        return
    for seed in seeds():  # compile the numba kernels before the clock starts
        test_one_input(seed)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
