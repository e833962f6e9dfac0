"""The `veil` command in an install without the aggregator: the SDK's own `pip install veil`.

A subprocess makes the aggregator's packages unimportable (as they are when only the SDK is
installed) and runs the command the way the `veil` script does.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# What `pip install veil` leaves out: the aggregator extra's packages (and numpy, the release's).
_EXTRA_ONLY = (
    "numpy",
    "numba",
    "redis",
    "hiredis",
    "cryptography",
    "aiohttp",
    "prometheus_client",
    "grpc_health",
    "grpc_reflection",
)

_SDK_ONLY = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {_EXTRA_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
from veil.cli import main
code = main(sys.argv[1:])
print("loaded:", ",".join(sorted(m for m in sys.modules if m.partition(".")[0] in {_EXTRA_ONLY!r}
                                 or m.startswith(("veil.aggregator", "veil.release")))))
sys.exit(code)
"""


def veil_without_the_aggregator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SDK_ONLY, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("serve", "--config", "veil.toml"), "aggregator"),
        (("demo", "--duration", "1"), "aggregator"),
        (("store", "check", "--store", "memory"), "aggregator"),
        (("health", "--address", "127.0.0.1:1"), "aggregator"),
        (("release", "example", "--output", "population.csv"), "release"),
    ],
)
def test_a_subcommand_that_needs_an_extra_says_which_in_one_sentence(args, extra, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _SDK_ONLY, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"veil {args[0]}: needs the {extra} packages (")
    assert line.endswith(f"pip install 'veil[{extra}]'.")
    assert "Traceback" not in out.stderr


def test_the_remote_subcommands_and_privacy_load_no_server_code():
    """`veil specs` and `veil estimates` are gRPC clients: they work in the SDK's install and
    import nothing of the aggregator (which is what made them slow to start)."""
    for args in (
        ("specs", "--address", "127.0.0.1:1", "--timeout", "0.1"),
        ("estimates", "--address", "127.0.0.1:1", "--timeout", "0.1"),
        ("estimates", "browser", "--window", "1h", "--last", "24h", "--address", "127.0.0.1:1", "--timeout", "0.1"),
    ):
        out = veil_without_the_aggregator(*args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(f"veil {args[0]}: 127.0.0.1:1: UNAVAILABLE"), out.stderr
        assert out.stdout.strip() == "loaded:", out.stdout
    out = veil_without_the_aggregator("privacy", "--k", "16", "--epsilon", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].strip() == "loaded:"


def test_a_bad_duration_is_one_line_in_an_sdk_only_install():
    out = veil_without_the_aggregator(
        "estimates", "browser", "--window", "1h", "--last", "soon", "--address", "127.0.0.1:1"
    )
    assert out.returncode == 2
    assert out.stderr == ('veil estimates: --last: expected a duration such as "15m", "1h" or "1d", got \'soon\'.\n')


def test_the_cli_knows_each_extra_by_the_packages_pyproject_gives_it():
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    from veil.cli import EXTRA_MODULES

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # A base dependency an extra names again (with a higher floor) is installed with the SDK.
    base = {Requirement(spec).name for spec in project["dependencies"]}
    # A distribution's name -> the module it installs, where the two differ.
    module_of = {
        "grpcio": "grpc",
        "grpcio-health-checking": "grpc_health",
        "grpcio-reflection": "grpc_reflection",
        "prometheus-client": "prometheus_client",
    }

    def modules(extra: str) -> set[str]:
        found = set()
        for spec in extras[extra]:
            requirement = Requirement(spec)
            if requirement.name == "veil":
                found |= {m for e in requirement.extras for m in modules(e)}
                continue
            if requirement.name in base:
                continue
            found.add(module_of.get(requirement.name, requirement.name.replace("-", "_")))
            found |= set(requirement.extras)  # redis[hiredis]
        return found

    for extra, names in EXTRA_MODULES.items():
        assert set(names) == modules(extra), extra
