"""The distribution: one wheel, one namespace `veil` over three source trees."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from veil_testing.wheel import build_wheel

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = [
    "veil.mechanism",
    "veil.client",
    "veil.aggregator.store",
    "veil.release",
    "veil.aggregator",
    "veil.cli",
    "veil.wire.v1.veil_pb2",
    "veil.wire.v1.veil_pb2_grpc",
]
SOURCE_DIRS = ["client/src", "cli/src", "aggregator/src", "release/src", "proto"]


def test_the_editable_install_imports_every_subpackage_from_the_checkout():
    code = f"import importlib; print('\\n'.join(importlib.import_module(m).__file__ for m in {SUBPACKAGES!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    for path in out.stdout.split():
        assert Path(path).resolve().is_relative_to(ROOT)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


def test_the_wheel_has_one_namespace_and_no_veil_init(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "veil/__init__.py" not in names
    for module in (
        "veil/mechanism/__init__.py",
        "veil/aggregator/estimate.py",
        "veil/wire/v1/veil_pb2.py",
        "veil/wire/v1/veil.proto",
    ):
        assert module in names
    assert not any(
        n.startswith(("client/", "cli/", "aggregator/", "release/", "proto/", "tests/", "testing/", "veil_testing/"))
        for n in names
    )  # the test support is the checkout's only


def test_the_wheel_imports_every_subpackage(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    # Only the wheel's tree on the path (plus site-packages for the dependencies), not the checkout.
    checkout = [str(ROOT / d) for d in SOURCE_DIRS]
    code = (
        f"import sys, importlib; sys.path = [p for p in sys.path if p not in {checkout!r}]; "
        f"sys.path.insert(0, {str(tmp_path)!r}); "
        f"import veil; assert set(veil.__path__) == {{{str(tmp_path / 'veil')!r}}}, veil.__path__; "
        f"[importlib.import_module(m) for m in {SUBPACKAGES!r}]"
    )
    subprocess.run([sys.executable, "-S", "-c", "import site; site.main(); " + code], check=True, cwd="/")
