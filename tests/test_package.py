"""The distribution: one wheel, one namespace `veil` over three source trees."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from veil_testing import running
from veil_testing.processes import ServeProcess

pytestmark = pytest.mark.starts_first  # minutes of builds and installs

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
def wheel(dist) -> Path:
    """The wheel `make dist` builds (one build a run: the tests below install it too)."""
    return dist["wheel"]


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


# --- what a user installs: `make dist`, installed outside the repository --------------------------
#
# The sdist and the wheel (built from it) and the npm tarball, each installed into an environment
# of its own in a temporary directory: the aggregator from the wheel (with its extra), the Python
# SDK from the sdist (no extra: it reports over HTTP, with no grpcio installed) and from the wheel
# (over gRPC: in the aggregator's environment, and, in the slow run, with the grpc extra alone), the
# TypeScript SDK from the tarball in two Node projects, with and without the optional gRPC peers.
# Devices of both SDKs report to that aggregator, and its own `veil estimates` counts them.
# Installs come from the package registries (pip's and npm's caches make repeat runs quick).

JS = ROOT / "client" / "js"
ROUND_TRIP_REPORTS = 150  # per device; the metric's min_n is 100, so each count is estimated
USER_TYPES = """\
from veil.client import Counters, Reporter
from veil.mechanism import MetricSpec


def sent(reporter: Reporter) -> int:
    counters: Counters = reporter.counters()
    return counters.sent


def labels(spec: MetricSpec) -> tuple[str, ...]:
    return tuple(spec.labels)
"""
REPORT_PY = """\
import sys
from veil.client import Reporter

endpoint, metric, value, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
reporter = Reporter(endpoint, schedule_delay_ms=20)  # no TLS argument: the aggregator is on loopback
assert reporter.wait_for_specs(30), "no specs"
for _ in range(n):
    reporter.report(metric, value)
assert reporter.force_flush(30), reporter.counters()
print(reporter.counters().accepted)
reporter.shutdown(5)
print("grpc loaded:", "grpc" in sys.modules)
"""
NO_GRPC_PY = """\
import importlib.util
import veil.client

print("grpc installed:", importlib.util.find_spec("grpc") is not None)
try:
    veil.client.Reporter("127.0.0.1:1")
except veil.client.ConfigError as error:
    print("pip install 'veil[grpc]'" if "pip install 'veil[grpc]'" in str(error) else error)
"""
REPORT_JS = """\
import { Reporter } from "@veil/client";
import { GrpcTransport, nodeFileStore } from "@veil/client/node";

const [how, where, metric, value, n, store] = process.argv.slice(2);
let refused = null;
const transport = how === "grpc" ? new GrpcTransport(where) : undefined;  // no TLS option: loopback
if (how === "http") {
  try { new GrpcTransport("127.0.0.1:1"); } catch (error) { refused = error.message; }
}
const reporter = new Reporter({ transport, endpoint: how === "http" ? where : undefined,
  store: nodeFileStore(store), scheduleDelayMs: 20 });
for (let i = 0; i < Number(n); i++) reporter.report(metric, value);
const ok = await reporter.shutdown(30000);
console.log(JSON.stringify({ ok, counters: reporter.counters(), refused }));
"""
USER_TS = """\
import { Reporter, type Counters } from "@veil/client";
import { GrpcTransport, nodeFileStore, type GrpcOptions } from "@veil/client/node";

const options: GrpcOptions = { token: "t" };
const reporter: Reporter = new Reporter({ transport: new GrpcTransport("127.0.0.1:50051", options),
  store: nodeFileStore("state") });
export const counters: Counters = reporter.counters();
"""


# No byte-compiling at install: Python compiles what it imports anyway, and compiling the whole
# of numpy's, numba's and grpcio's trees is work no test here needs.
PIP_INSTALL = ("-m", "pip", "install", "-q", "--no-compile")


def run(*args: object, cwd: Path, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert out.returncode == 0, f"{args}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def venv(where: Path) -> Path:
    """A new virtualenv at `where` with a pip that knows the registries; its python."""
    run(sys.executable, "-m", "venv", where, cwd=where.parent)
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """What `make dist` builds, by kind: sdist, wheel, npm."""
    out = tmp_path_factory.mktemp("dist")
    run("make", "-s", "dist", f"DIST={out}", cwd=ROOT)
    (sdist,) = out.glob("veil-*.tar.gz")
    (wheel,) = out.glob("veil-*.whl")
    (npm,) = out.glob("veil-client-*.tgz")
    return {"sdist": sdist, "wheel": wheel, "npm": npm}


def test_make_dist_builds_the_sdist_the_wheel_and_the_npm_tarball_with_their_metadata(dist):
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert {"veil/client/py.typed", "veil/mechanism/py.typed", "veil-0.1.0.dist-info/licenses/LICENSE"} <= set(names)
    metadata = zipfile.ZipFile(dist["wheel"]).read("veil-0.1.0.dist-info/METADATA").decode()
    headers = metadata.partition("\n\n")[0].splitlines()  # the README follows them
    assert {"License-Expression: Apache-2.0", "Classifier: Typing :: Typed"} <= set(headers)
    assert {"Provides-Extra: aggregator", "Provides-Extra: grpc", "Provides-Extra: release"} == {
        h for h in headers if "Extra:" in h
    }
    assert [h for h in headers if h.startswith("Requires-Dist:") and "extra ==" not in h] == [
        "Requires-Dist: protobuf<8,>=4.25.1"
    ]  # the SDK alone: no grpcio
    assert not any("ruff" in h or "pytest" in h for h in headers)  # the dev tools are groups, unpublished
    with tarfile.open(dist["sdist"]) as sdist:
        files = sdist.getnames()
    assert "veil-0.1.0/LICENSE" in files and "veil-0.1.0/CHANGELOG.md" in files
    assert not any("/node_modules/" in f or "/client/js/dist/" in f for f in files)
    with tarfile.open(dist["npm"]) as npm:
        files = set(npm.getnames())
    assert {
        "package/README.md",
        "package/LICENSE",
        "package/dist/proto/veil.proto",
        "package/dist/src/node.d.ts",
    } <= files
    assert not any(f.startswith("package/dist/test/") for f in files)


def test_the_npm_package_keeps_grpc_optional_with_caret_ranges():
    package = json.loads((JS / "package.json").read_text())
    assert "dependencies" not in package  # browser users install nothing of gRPC's
    assert set(package["peerDependencies"]) == {"@grpc/grpc-js", "@grpc/proto-loader"}
    assert all(package["peerDependenciesMeta"][name]["optional"] for name in package["peerDependencies"])
    assert all(range_.startswith("^") for range_ in package["peerDependencies"].values())
    assert package["typesVersions"]["*"]["node"] == [package["exports"]["./node"]["types"].removeprefix("./")]


@pytest.mark.parametrize(
    "copy, home", [("client/js/proto/veil.proto", "proto/veil/wire/v1/veil.proto"), ("client/js/LICENSE", "LICENSE")]
)
def test_the_npm_package_s_copies_match_their_one_home(copy, home):
    # The package builds outside the repository from its own copy; the repository's file is the truth.
    assert (ROOT / copy).read_bytes() == (ROOT / home).read_bytes(), f"{copy} drifted: cp {home} {copy}"


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> dict[str, Path]:
    """The aggregator's environment (the wheel with its extra) and the SDK's (the sdist alone),
    both outside the repository; their pythons."""
    home = tmp_path_factory.mktemp("user")
    aggregator = venv(home / "aggregator")
    run(aggregator, *PIP_INSTALL, f"veil[aggregator] @ {dist['wheel'].as_uri()}", cwd=home)
    sdk = venv(home / "sdk")
    run(sdk, *PIP_INSTALL, dist["sdist"], cwd=home)
    return {"aggregator": aggregator, "sdk": sdk, "home": home}


def test_the_sdk_installed_from_the_sdist_is_typed_for_a_user_s_mypy_strict(installed, tmp_path):
    user = tmp_path / "user.py"
    user.write_text(USER_TYPES)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", installed["sdk"], user]
    run(*mypy, cwd=tmp_path)
    # Without the marker mypy would not read the package's types: the check above is of py.typed.
    code = "import veil.client, pathlib; print(pathlib.Path(veil.client.__file__).parent / 'py.typed')"
    marker = Path(run(installed["sdk"], "-c", code, cwd=tmp_path).stdout.strip())
    marker.unlink()
    try:
        out = subprocess.run([str(a) for a in mypy], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 1 and "missing library stubs or py.typed marker" in out.stdout
    finally:
        marker.touch()


def test_a_report_count_estimate_round_trip_through_every_installed_package(installed, dist, tmp_path):
    home = installed["home"]
    sdk_modules = run(installed["sdk"], "-c", "import sys, veil.client; print(sorted(sys.modules))", cwd=home).stdout
    assert "numpy" not in sdk_modules and "veil.aggregator" not in sdk_modules
    # The SDK alone installs no grpcio, and a gRPC endpoint names the extra it needs.
    assert run(installed["sdk"], "-c", NO_GRPC_PY, cwd=home).stdout.split("\n")[:2] == [
        "grpc installed: False",
        "pip install 'veil[grpc]'",
    ]
    veil = installed["aggregator"].parent / "veil"
    config = running.config_dict(f"sqlite:///{tmp_path / 'veil.db'}")
    with ServeProcess(tmp_path / "serve", config, command=[str(veil), "serve"]) as serve:
        where = run(installed["aggregator"], "-c", "import veil.aggregator; print(veil.aggregator.__file__)", cwd=home)
        assert Path(where.stdout.strip()).is_relative_to(home)  # served from the install, not the checkout
        n = ROUND_TRIP_REPORTS
        # The SDK alone over HTTP (grpc never loaded), then the wheel's over gRPC (the wheel's
        # SDK with the grpc extra alone: test_the_wheel_s_grpc_extra_alone_reports_over_grpc).
        http = f"http://127.0.0.1:{serve.http_port}"
        out = run(installed["sdk"], "-c", REPORT_PY, http, "browser", "firefox", n, cwd=home).stdout
        assert out.splitlines() == [str(n), "grpc loaded: False"]
        out = run(installed["aggregator"], "-c", REPORT_PY, serve.endpoint, "browser", "chrome", n, cwd=home).stdout
        assert out.splitlines() == [str(n), "grpc loaded: True"]

        # Node: the tarball alone reports over HTTP (and GrpcTransport names what it needs); with
        # the optional peers installed, over gRPC.
        peers = json.loads((JS / "package.json").read_text())["peerDependencies"]
        for how, extra in (("http", []), ("grpc", [f"{name}@{range_}" for name, range_ in peers.items()])):
            project = home / f"node-{how}"
            project.mkdir()
            (project / "package.json").write_text(
                json.dumps({"name": f"user-{how}", "private": True, "type": "module"})
            )
            npm = ["npm", "install", "--no-audit", "--no-fund", "--prefer-offline"]
            run(*npm, dist["npm"], *extra, cwd=project)
            assert (project / "node_modules" / "@grpc").exists() == (how == "grpc")
            (project / "report.mjs").write_text(REPORT_JS)
            where = f"http://127.0.0.1:{serve.http_port}" if how == "http" else serve.endpoint
            out = run("node", "report.mjs", how, where, "os", "linux", n, project / "state", cwd=project)
            answer = json.loads(out.stdout)
            assert answer["ok"] and answer["counters"]["accepted"] == n, answer
            if how == "http":
                assert "npm install @grpc/grpc-js @grpc/proto-loader" in answer["refused"]

        estimates = run(veil, "estimates", "--address", serve.endpoint, "--window", "total", "--json", cwd=home)
        by_metric = {e["metric"]: e for e in json.loads(estimates.stdout)["estimates"]}
        assert by_metric["browser"]["n"] == 2 * n and by_metric["os"]["n"] == 2 * n
        assert not by_metric["os"]["withheld"] and len(by_metric["os"]["categories"]) == 6


@pytest.mark.slow  # a virtualenv and an install of their own; the default run reports over gRPC from the aggregator's
def test_the_wheel_s_grpc_extra_alone_reports_over_grpc(dist, tmp_path):
    sdk_grpc = venv(tmp_path / "sdk-grpc")
    run(sdk_grpc, *PIP_INSTALL, f"veil[grpc] @ {dist['wheel'].as_uri()}", cwd=tmp_path)
    modules = run(sdk_grpc, "-c", "import sys, veil.client; print(sorted(sys.modules))", cwd=tmp_path).stdout
    assert "numpy" not in modules and "veil.aggregator" not in modules
    config = running.config_dict(f"sqlite:///{tmp_path / 'veil.db'}")
    with ServeProcess(tmp_path / "serve", config) as serve:
        out = run(sdk_grpc, "-c", REPORT_PY, serve.endpoint, "browser", "chrome", ROUND_TRIP_REPORTS, cwd=tmp_path)
    assert out.stdout.splitlines() == [str(ROUND_TRIP_REPORTS), "grpc loaded: True"]


def test_the_node_export_is_typed_under_node10_module_resolution(dist, tmp_path):
    # An older TypeScript setup ("moduleResolution": "node10") ignores "exports": typesVersions
    # is what finds the types of "@veil/client/node" there.
    (tmp_path / "package.json").write_text(json.dumps({"name": "user-types", "private": True}))
    run("npm", "install", "--no-audit", "--no-fund", "--prefer-offline", dist["npm"], cwd=tmp_path)
    (tmp_path / "user.ts").write_text(USER_TS)
    options = {"module": "commonjs", "moduleResolution": "node10", "strict": True, "noEmit": True}
    options |= {"skipLibCheck": False, "lib": ["ES2022", "DOM"], "types": []}
    (tmp_path / "tsconfig.json").write_text(json.dumps({"compilerOptions": options, "files": ["user.ts"]}))
    run("node", JS / "node_modules" / "typescript" / "bin" / "tsc", "-p", tmp_path / "tsconfig.json", cwd=tmp_path)
