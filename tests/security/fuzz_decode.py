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
- a verdict that differs from the wire contract's (upload_contract, written from veil.proto):
  accepted where the contract rejects, rejected where it accepts, another report named;
- accepted counts that differ from the contract's plain sums, or a total other than count;
- a request changed by decoding (it must be read in place and never written).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris
import numpy as np
from google.protobuf.message import DecodeError

# Imported before instrumentation: numpy, protobuf, the numba kernels (numba compiles Python
# bytecode, which must stay as written) and the mechanisms.
from veil.aggregator.errors import InvalidBatch
from veil.aggregator.simulate import FastKeystream, simulate_reports
from veil.mechanism import AdmissibleRapporSpec, KrrSpec, MetricSpec, RapporSpec, SubsetSpec, WarnerSpec
from veil.wire.v1 import veil_pb2

# The contract's oracle is instrumented too: its branches guide the fuzzer (a differential harness).
with atheris.instrument_imports(include=["veil.aggregator.decode", "upload_contract"]):
    from upload_contract import bitmap_width, members

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


@atheris.instrument_func
def check(metric: MetricSpec, request: veil_pb2.UploadRequest) -> None:
    spec = metric.mechanism
    before = request.SerializeToString(deterministic=True)
    expected = members(spec, request, MAX_REPORTS)
    try:
        counts = decode_upload(request, metric, max_reports=MAX_REPORTS)
    except InvalidBatch as error:
        got = "batch" if error.report is None else error.report
        if isinstance(expected, np.ndarray) or got != expected:
            raise Finding(
                f"{spec.name} k={spec.k}: rejected ({error}) where the contract says {expected!r:.60}"
            ) from error
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
    request.count = (
        fdp.ConsumeIntInRange(0, 2**32 - 1)
        if count_kind == 0
        else MAX_REPORTS + fdp.ConsumeIntInRange(0, 2)
        if count_kind == 1
        else fdp.ConsumeIntInRange(0, 12)
    )
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
                bits = np.zeros((n, 8 * bitmap_width(spec)), np.uint8)
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
