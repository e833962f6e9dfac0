"""The wire contract: generated code in step with the .proto, and messages that round-trip."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grpc

from veil.wire.v1 import veil_pb2, veil_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TOOLS_VERSION = re.search(r'^TOOLS_VERSION = "(.+)"$', (ROOT / "proto" / "generate.py").read_text(), re.M)[1]


def test_generated_code_has_not_drifted_from_the_proto():
    out = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_the_drift_check_can_fail(tmp_path):
    # Copy the proto tree, change the contract, and the check must name the stale module.
    import shutil

    copy = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", copy, ignore=shutil.ignore_patterns("__pycache__"))
    proto = copy / "veil" / "wire" / "v1" / "veil.proto"
    proto.write_text(proto.read_text().replace("uint32 count = 4;", "uint64 count = 4;"))
    # The copy uses the checkout's pinned protoc rather than installing one beside itself.
    toolchain = ["--toolchain", str(ROOT / ".venv" / f"grpcio-tools-{TOOLS_VERSION}")]
    out = subprocess.run(
        [sys.executable, str(copy / "generate.py"), "--check", *toolchain], capture_output=True, text=True
    )
    assert out.returncode == 1 and "veil_pb2.py" in out.stderr


def test_upload_round_trips_with_columnar_reports():
    indices = b"".join(i.to_bytes(4, "little") for i in (1, 4, 7))
    request = veil_pb2.UploadRequest(
        batch_id=bytes(range(16)),
        metric="browser",
        spec_fingerprint="ab" * 16,
        count=1,
        index_sets=veil_pb2.IndexSets(set_size=3, indices=indices),
    )
    decoded = veil_pb2.UploadRequest.FromString(request.SerializeToString())
    assert decoded == request and decoded.WhichOneof("reports") == "index_sets"
    bitmaps = veil_pb2.UploadRequest(count=2, bitmaps=veil_pb2.Bitmaps(bits=b"\x05\x00\x80\x01"))
    assert veil_pb2.UploadRequest.FromString(bitmaps.SerializeToString()).WhichOneof("reports") == "bitmaps"


def test_services_and_mechanisms_match_the_mechanism_package():
    from veil.mechanism import MECHANISMS, HashedSpec

    values = {name.lower().replace("_", "-"): value for name, value in veil_pb2.Mechanism.items() if value}
    assert values == {**{name: shape.proto for name, shape in MECHANISMS.items()}, HashedSpec.name: HashedSpec.proto}
    service = veil_pb2.DESCRIPTOR.services_by_name
    assert set(service["Collector"].methods_by_name) == {"GetMetricSpecs", "Upload", "UploadBatches"}
    assert set(service["Estimates"].methods_by_name) == {"Get", "Watch", "Series"}
    assert service["Estimates"].methods_by_name["Watch"].server_streaming
    assert callable(veil_pb2_grpc.add_CollectorServicer_to_server)
    assert hasattr(grpc, "server")
