"""Regenerate the Python modules of the wire contract from the .proto files beside them.

    python proto/generate.py           # rewrite the committed modules
    python proto/generate.py --check   # exit 1, naming the files, when they have drifted

Needs grpcio-tools (the `dev` extra pins the version whose output is committed).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTOS = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto under proto/ into out_dir; return the files written."""
    from grpc_tools import protoc  # dev-only dependency, so imported here

    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the message above")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def drifted() -> list[str]:
    """Names of generated files that differ from, or are missing beside, the .proto files."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        names = [p.relative_to(tmp).as_posix() for p in fresh]
        committed = sorted(
            p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)
        )
        bad = [
            n
            for n in names
            if not (PROTO_ROOT / n).exists() or not filecmp.cmp(Path(tmp) / n, PROTO_ROOT / n, shallow=False)
        ]
        bad += [n for n in committed if n not in names]
        return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 when the committed code drifted"
    )
    args = parser.parse_args(argv)
    if args.check:
        bad = drifted()
        for name in bad:
            print(f"drifted: proto/{name} (run: python proto/generate.py)", file=sys.stderr)
        return 1 if bad else 0
    for path in generate(PROTO_ROOT):
        print(f"wrote proto/{path.relative_to(PROTO_ROOT).as_posix()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
