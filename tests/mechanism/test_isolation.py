"""The SDK's math must stay light: importing it loads no numpy, numba or redis."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "numba", "redis", "scipy", "cryptography")


def test_import_veil_mechanism_loads_nothing_heavy():
    code = (
        "import sys, veil.mechanism as m; m.SubsetSpec(1024, 1.0).randomize(3); "
        f"print(','.join(x for x in {HEAVY!r} if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_veil_is_a_namespace_package():
    import veil

    assert getattr(veil, "__file__", None) is None
    assert len(list(veil.__path__)) >= 3  # client/src, aggregator/src and proto
