"""The SDK must stay light: importing its math loads no numpy, numba or redis, and importing
veil.client loads no grpc (an extra, loaded by a Reporter that reports over gRPC only)."""

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


def test_import_veil_client_loads_no_grpc():
    # grpcio is the veil[grpc] extra: an app reporting over HTTP never loads it.
    code = "import sys, veil.client; print(sorted(m for m in sys.modules if m.partition('.')[0] == 'grpc'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_grpc_endpoint_without_grpcio_is_a_config_error_naming_the_extra():
    # sys.modules["grpc"] = None makes `import grpc` fail, as in an install without the extra.
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "import veil.client as c\n"
        "try:\n"
        "    c.Reporter('127.0.0.1:1', tls=False)\n"
        "except c.ConfigError as error:\n"
        "    print(error)\n"
        "r = c.Reporter('http://127.0.0.1:1'); r.shutdown(1); print('http ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'veil[grpc]'" in out.stdout and out.stdout.strip().endswith("http ok")
