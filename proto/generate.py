"""Regenerate the Python modules of the wire contract from the .proto files beside them.

    python proto/generate.py           # rewrite the committed modules
    python proto/generate.py --check   # exit 1, naming the files, when they have drifted

protoc comes from grpcio-tools TOOLS_VERSION, installed by this script into a virtualenv of its
own (kept under .venv/, beside proto/, and reused): grpcio-tools pins its protobuf, so it cannot
share the development virtualenv, whose protobuf is the newest. The version is old on purpose:
generated code works with the runtime it was made for and every newer one, never an older one,
so the oldest toolchain sets the oldest grpcio and protobuf an app embedding the SDK may have
(pyproject.toml's ranges; `make test-oldest` runs the SDK's tests on them).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTOS = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# Its protoc (25.x) writes code for protobuf 4.25 and later, with no runtime version check, and
# its gRPC plugin code that runs on grpcio 1.62 and later (March 2024).
TOOLS_VERSION = "1.62.3"
DEFAULT_TOOLCHAIN = PROTO_ROOT.parent / ".venv" / f"grpcio-tools-{TOOLS_VERSION}"
_READY = ".installed"  # written last: a virtualenv without it is half made


def toolchain(where: Path) -> Path:
    """The Python of a virtualenv holding grpcio-tools TOOLS_VERSION, made at `where` if missing."""
    python = where / "bin" / "python"
    if (where / _READY).exists():
        return python
    print(f"installing grpcio-tools=={TOOLS_VERSION} into {where}", file=sys.stderr)
    # Made beside and renamed into place, so a run stopped halfway or a concurrent one leaves no
    # broken toolchain; a virtualenv moved whole still works when run as bin/python -m.
    where.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{where.name}.", dir=where.parent))
    try:
        venv.create(partial, with_pip=True)
        subprocess.run(
            [partial / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            + [f"grpcio-tools=={TOOLS_VERSION}"],
            check=True,
        )
        (partial / _READY).write_text(f"grpcio-tools=={TOOLS_VERSION}\n")
        try:
            os.rename(partial, where)
        except OSError:  # another run finished first
            if not (where / _READY).exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return python


def generate(out_dir: Path, toolchain_dir: Path = DEFAULT_TOOLCHAIN) -> list[Path]:
    """Run the pinned protoc on every .proto under proto/ into out_dir; return the files written."""
    protoc = (
        "import sys, pathlib; from grpc_tools import protoc; "
        "include = pathlib.Path(protoc.__file__).resolve().parent / '_proto'; "
        "sys.exit(protoc.main(['protoc', f'-I{include}', *sys.argv[1:]]))"
    )
    args = [
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTOS,
    ]
    if subprocess.run([toolchain(toolchain_dir), "-c", protoc, *args]).returncode != 0:
        raise SystemExit("protoc failed; see the message above")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def drifted(toolchain_dir: Path = DEFAULT_TOOLCHAIN) -> list[str]:
    """Names of generated files that differ from, or are missing beside, the .proto files."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp), toolchain_dir)
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
    parser.add_argument(
        "--toolchain",
        type=Path,
        default=DEFAULT_TOOLCHAIN,
        metavar="DIR",
        help=f"the virtualenv of grpcio-tools {TOOLS_VERSION}, made if missing (default {DEFAULT_TOOLCHAIN})",
    )
    args = parser.parse_args(argv)
    if args.check:
        bad = drifted(args.toolchain)
        for name in bad:
            print(f"drifted: proto/{name} (run: python proto/generate.py)", file=sys.stderr)
        return 1 if bad else 0
    for path in generate(PROTO_ROOT, args.toolchain):
        print(f"wrote proto/{path.relative_to(PROTO_ROOT).as_posix()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
