"""deploy/: every file parses, every config passes `veil serve --check-config`, and the files agree
with each other (ports, grace periods, users, Redis durability, where the TLS files and tokens are
mounted and who may read them). No Docker engine or cluster runs here, so this is what keeps the
image, compose file, manifests and unit honest.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from veil_testing.pki import Pki
from veil_testing.wheel import build_wheel

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
KUBE = DEPLOY / "kubernetes"
KUBE_CLUSTER = DEPLOY / "kubernetes-cluster"
SYSTEMD = DEPLOY / "systemd"
MAKE_SECRETS = DEPLOY / "make-secrets.sh"

YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
# Not what make-secrets.sh leaves in a git-ignored secrets/ directory (its tokens.toml).
TOML_FILES = sorted(p for p in DEPLOY.rglob("*.toml") if "secrets" not in p.relative_to(DEPLOY).parts)
VEIL_CONFIGS = [DOCKER / "veil.toml", KUBE / "veil.toml", KUBE_CLUSTER / "veil.toml", SYSTEMD / "veil.toml"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


def veil_config(path: Path):
    """What a veil.toml declares, leaving out its [tls] and [auth] files: they exist only where it
    is deployed (test_every_veil_config_passes_check_config loads them, with stand-ins)."""
    from veil.aggregator.config import parse_config

    data = tomllib.loads(path.read_text())
    return parse_config({k: v for k, v in data.items() if k not in ("tls", "auth")}, source=str(path), base=path.parent)


# What make-secrets.sh makes, and which of those files each key of a veil.toml names.
SECRET_FILES = {"ca.crt", "ca.key", "server.crt", "server.key", "tokens.toml", "prometheus.token"}
ROLE_FILES = {
    "tls.cert_file": "server.crt",
    "tls.key_file": "server.key",
    "tls.client_ca_file": "ca.crt",
    "auth.tokens_file": "tokens.toml",
}


def secret_paths(path: Path) -> dict[str, str]:
    """The files a veil.toml names under [tls] and [auth], by key ("tls.cert_file", ...)."""
    data = tomllib.loads(path.read_text())
    named = {f"tls.{key}": value for key, value in data.get("tls", {}).items()}
    if "tokens_file" in data.get("auth", {}):
        named["auth.tokens_file"] = data["auth"]["tokens_file"]
    return named


def with_secrets(path: Path, secrets: Path, tmp_path: Path) -> Path:
    """A copy of a veil.toml whose [tls] and [auth] files are those in `secrets`."""
    text = path.read_text()
    for key, named in secret_paths(path).items():
        text = text.replace(f'"{named}"', json.dumps(str(secrets / ROLE_FILES[key])))
    copy = tmp_path / path.parent.name / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    return copy


STAND_IN_TOKENS = """
[[upload_tokens]]
name = "app"
token = "upload-token-0123456789abcdef"
metrics = ["browser"]

[[read_tokens]]
name = "prometheus"
token = "read-token-0123456789abcdef"
"""


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> Path:
    """make-secrets.sh's files, made without openssl: Pki's CA and its server certificate for
    localhost and 127.0.0.1, and tokens (the CA's key is not needed)."""
    directory = tmp_path_factory.mktemp("secrets")
    pki = Pki(directory / "pki")
    for name, source in (("ca.crt", pki.ca), ("server.crt", pki.server_cert), ("server.key", pki.server_key)):
        shutil.copy(source, directory / name)
    (directory / "tokens.toml").write_text(STAND_IN_TOKENS)
    (directory / "prometheus.token").write_text("read-token-0123456789abcdef\n")
    for name in ("tokens.toml", "prometheus.token"):
        (directory / name).chmod(0o600)
    return directory


def check_config(path: Path) -> subprocess.CompletedProcess:
    # The file's own [store] url, not one from the environment of whoever runs the tests.
    env = {k: v for k, v in os.environ.items() if k not in ("VEIL_STORE_URL", "VEIL_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "veil.cli", "serve", "--config", str(path), "--check-config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def veil_argv(argv: list[str]):
    """argv parsed by the real `veil` parser, as the container or unit would run it."""
    from veil.cli import build_parser

    assert argv[0] in ("veil", "/opt/veil/bin/veil"), argv
    return build_parser().parse_args(argv[1:])


# --- every file parses ----------------------------------------------------------------------


def test_deploy_has_the_expected_files():
    for name in (
        "README.md",
        ".gitignore",
        "make-secrets.sh",
        "compose.yaml",
        "docker/Dockerfile",
        "docker/Dockerfile.dockerignore",
        "docker/veil.toml",
        "docker/constraints.txt",
        "prometheus/prometheus.yml",
        "grafana/veil-dashboard.json",
        "grafana/provisioning/datasources/veil.yaml",
        "grafana/provisioning/dashboards/veil.yaml",
        "kubernetes/kustomization.yaml",
        "kubernetes/aggregator.yaml",
        "kubernetes/redis.yaml",
        "kubernetes/pdb.yaml",
        "kubernetes/prometheus-operator/servicemonitor.yaml",
        "kubernetes/veil.toml",
        "kubernetes/secret.env.example",
        "kubernetes-cluster/kustomization.yaml",
        "kubernetes-cluster/redis-cluster.yaml",
        "kubernetes-cluster/hpa.yaml",
        "kubernetes-cluster/veil.toml",
        "kubernetes-cluster/secret.env.example",
        "systemd/veil-aggregator.service",
        "systemd/veil.toml",
        "systemd/veil.env.example",
    ):
        assert (DEPLOY / name).is_file(), name
    assert len(YAML_FILES) >= 5 and len(TOML_FILES) == 4


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_every_yaml_file_parses(path):
    docs = load_yaml(path)
    assert docs and all(isinstance(doc, dict) for doc in docs)


@pytest.mark.parametrize("path", TOML_FILES, ids=rel)
def test_every_toml_file_parses(path):
    assert tomllib.loads(path.read_text())


@pytest.mark.parametrize("path", VEIL_CONFIGS, ids=rel)
def test_every_veil_config_passes_check_config(path, stand_ins, tmp_path):
    # Its TLS files and tokens file, where this test has them.
    out = check_config(with_secrets(path, stand_ins, tmp_path))
    # The stores these name (redis:6379, redis-0.redis:6379) do not exist here: a good config
    # still exits 0, and says so.
    assert out.returncode == 0, out.stderr
    assert re.search(r": OK \(\d+ metrics; store .*: (reachable|not reachable from here)", out.stdout), out.stdout


@pytest.mark.parametrize("path", VEIL_CONFIGS, ids=rel)
def test_every_veil_config_serves_tls_and_requires_tokens(path, stand_ins, tmp_path):
    from veil.aggregator.config import load_config

    config = load_config(with_secrets(path, stand_ins, tmp_path))  # parsed only: no store is opened
    assert config.tls is not None and config.auth.enabled
    # The files are named where the deployment mounts them, not relative to the config.
    assert set(secret_paths(path)) == {"tls.cert_file", "tls.key_file", "auth.tokens_file"}
    assert all(Path(named).is_absolute() for named in secret_paths(path).values())


def test_every_veil_config_in_deploy_is_checked():
    assert {p for p in TOML_FILES if "metrics" in tomllib.loads(p.read_text())} == set(VEIL_CONFIGS)


def test_the_sample_configs_listen_where_the_deploy_files_expect():
    for path in VEIL_CONFIGS:
        config = veil_config(path)
        assert port(config.grpc_address) == 50051 and port(config.http_address) == 8080, path
    for path in (DOCKER / "veil.toml", KUBE / "veil.toml", KUBE_CLUSTER / "veil.toml"):  # containers bind all
        assert veil_config(path).grpc_address.startswith("0.0.0.0:"), path


# --- the Dockerfile ---------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """(INSTRUCTION, arguments) per stage; continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", (DOCKER / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages[1:]  # stages[0] holds the ARGs before the first FROM


def final_stage(instruction: str) -> list[str]:
    return [args for name, args in dockerfile_stages()[-1] if name == instruction]


def exec_form(args: str) -> list[str]:
    argv = json.loads(args)
    assert isinstance(argv, list), f"use the exec form (a JSON list): {args}"
    return argv


def test_the_image_is_python_311_slim():
    bases = [args.split()[0] for stage in dockerfile_stages() for name, args in stage if name == "FROM"]
    assert bases and all(base == "${PYTHON_IMAGE}" for base in bases)
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?(@sha256:[0-9a-f]{64})?", default)


def image_user() -> int:
    (user,) = final_stage("USER")
    uid = user.partition(":")[0]
    assert uid.isdigit(), "a numeric USER, so Kubernetes' runAsNonRoot can check it"
    return int(uid)


def test_the_image_runs_as_a_non_root_user():
    assert image_user() != 0
    (create,) = [args for args in final_stage("RUN") if "useradd" in args]
    assert f"--uid {image_user()}" in create


def healthcheck() -> tuple[str, list[str]]:
    """The HEALTHCHECK's options and its command line."""
    (line,) = final_stage("HEALTHCHECK")
    options, _, command = line.partition(" CMD ")
    return options, exec_form(command)


def test_the_image_health_check_is_veil_health_over_tls_within_dockers_timeout():
    options, command = healthcheck()
    args = veil_argv(command)
    assert args.command == "health"
    docker_timeout = re.search(r"--timeout=(\d+)s", options)
    assert docker_timeout and args.timeout < int(docker_timeout.group(1))
    # The listener is TLS: the check trusts the CA compose mounts beside the server's files, and
    # dials a name make-secrets.sh always puts in the certificate.
    assert port(args.address) == 50051 and args.address.rpartition(":")[0] in ("127.0.0.1", "localhost")
    assert Path(compose_secrets("aggregator")[args.ca_file]).name == "ca.crt"


def test_the_image_serves_its_config_on_the_ports_it_exposes():
    (cmd,) = final_stage("CMD")
    args = veil_argv(exec_form(cmd))
    assert args.command == "serve" and args.config == "/etc/veil/veil.toml"
    assert f"deploy/docker/veil.toml {args.config}" in final_stage("COPY")
    config = veil_config(DOCKER / "veil.toml")
    (expose,) = final_stage("EXPOSE")
    assert sorted(map(int, expose.split())) == sorted([port(config.grpc_address), port(config.http_address)])


def image_env() -> dict[str, str]:
    env = {}
    for args in final_stage("ENV"):
        env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
    return env


def test_the_image_gives_numba_a_writable_cache_owned_by_its_user():
    cache = image_env()["NUMBA_CACHE_DIR"]
    (create,) = [args for args in final_stage("RUN") if "useradd" in args]
    assert re.search(rf"install -d -o veil -g veil -m 0700 {re.escape(cache)}\b", create)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule, enough for the patterns used here: the last pattern matching
    the path or one of its parent directories decides; a leading "!" lets it in again."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = re.escape(pattern.lstrip("!")).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            verdict = not negate
    return verdict


def dockerignore() -> list[str]:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def build_copies() -> list[tuple[str, str]]:
    copies = []
    for stage in dockerfile_stages():
        for name, args in stage:
            if name == "COPY" and not args.startswith("--from"):
                *sources, dest = args.split()
                copies += [(source, dest) for source in sources]
    return copies


def test_the_build_context_holds_what_the_dockerfile_copies_and_not_the_rest():
    patterns = dockerignore()
    for source, _ in build_copies():
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is copied but .dockerignore leaves it out"
    for left_out in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/test_deploy.py",
        "bench/bench_randomize.py",
        "aggregator/src/veil/aggregator/__pycache__/daemon.cpython-311.pyc",
        "deploy/secrets/server.key",
        "deploy/kubernetes/secrets/tokens.toml",
    ):
        assert ignored(left_out, patterns), left_out


def test_the_dockerfile_passes_its_lint_rules():
    """Where no container builder runs, these rules (hadolint's that apply, which Debian does not
    package) are what the build gets: the image's build is at least linted."""
    default_base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (DOCKER / "Dockerfile").read_text(), re.M)[1]
    instructions = [(name, args) for stage in dockerfile_stages() for name, args in stage]
    for name, args in instructions:
        assert name in {"FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "HEALTHCHECK", "CMD", "ARG"}, name
        if name == "FROM":
            image = args.split()[0].replace("${PYTHON_IMAGE}", default_base)
            assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", image) and not image.endswith(":latest"), (
                args
            )
        if name == "WORKDIR":
            assert args.startswith("/"), f"WORKDIR {args}: absolute, or it depends on the one before"
        if name == "RUN" and "pip install" in args:
            assert "--no-cache-dir" in args, "pip's cache would stay in the layer"
        if name == "RUN":
            assert "sudo " not in args and "curl " not in args and "wget " not in args, args
            assert "apt-get install" not in args or "--no-install-recommends" in args, args
        if name == "COPY":
            assert "--chown" not in args or "--from" in args, "files the runtime user can change"
    # Exec form: no shell between Docker and the process, so SIGTERM reaches veil itself.
    exec_form(final_stage("CMD")[0])
    healthcheck()
    (user,) = final_stage("USER")
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "a numeric non-root user:group (runAsNonRoot checks it)"
    assert [name for name, _ in dockerfile_stages()[-1]][-1] == "CMD"


def container_builder() -> str | None:
    """The reason no image can be built here, or None when `docker build` can run."""
    if shutil.which("docker") is None:
        return "no container builder: the docker CLI is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines() or ["no reason given"]
        return f"no container builder: the docker CLI finds no daemon ({lines[-1]})"
    return None


def test_the_image_builds_and_runs_as_its_user(tmp_path):
    reason = container_builder()
    if reason is not None:
        pytest.skip(reason)
    tag = f"veil-aggregator:test-{os.getpid()}"
    build = ["docker", "build", "-f", str(DOCKER / "Dockerfile"), "-t", tag, str(ROOT)]
    out = subprocess.run(build, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    try:
        run = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c", "id -u; veil serve --help >/dev/null"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0 and run.stdout.split() == ["10001"], run.stderr
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, timeout=120)


def test_the_wheel_builds_from_what_the_dockerfile_copies(tmp_path):
    """The build stage's COPY lines, replayed from the filtered context, then its pip install's
    build step: the wheel holds every package, `veil health` (the HEALTHCHECK) included."""
    src = tmp_path / "src"
    patterns = dockerignore()
    for source, dest in build_copies():
        if dest.startswith("/"):
            continue  # constraints.txt, and the runtime stage's config
        origin = ROOT / source
        files = [origin] if origin.is_file() else [p for p in origin.rglob("*") if p.is_file()]
        for file in files:
            name = str(file.relative_to(ROOT))
            if not ignored(name, patterns):
                target = src / dest / (file.name if origin.is_file() else file.relative_to(origin))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
    wheel = build_wheel(src, tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "veil/mechanism/__init__.py",
        "veil/client/__init__.py",
        "veil/aggregator/daemon.py",
        "veil/cli/_serve.py",
        "veil/cli/_health.py",
        "veil/wire/v1/veil_pb2.py",
    ):
        assert module in names
    assert not any("__pycache__" in n for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)  # the image's package has its license


def test_the_constraints_pin_every_dependency_within_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    specs = project["dependencies"] + project["optional-dependencies"]["aggregator"]
    for spec in specs:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        if name == "veil":  # an extra of its own (veil[release]): its dependencies, not itself
            specs += [s for extra in requirement.extras for s in project["optional-dependencies"][extra]]
            continue
        assert name in pins, f"constraints.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {spec}"
        for extra in requirement.extras:  # redis[hiredis]
            assert canonicalize_name(extra) in pins, f"constraints.txt does not pin {extra}"
    assert "veil" not in pins


# --- compose and Prometheus ------------------------------------------------------------------------


def compose() -> dict:
    (doc,) = load_yaml(DEPLOY / "compose.yaml")
    return doc


def flags(argv: list[str]) -> dict[str, str]:
    """--name value pairs of a command line."""
    return {a[2:]: b for a, b in zip(argv, argv[1:], strict=False) if a.startswith("--")}


def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(text)).groups()
    return float(value) * {"ms": 0.001, "s": 1, "m": 60}[unit]


def test_compose_redis_fsyncs_every_write_to_a_volume():
    redis = compose()["services"]["redis"]
    options = flags(redis["command"])
    assert redis["command"][0] == "redis-server"
    assert options["appendonly"] == "yes" and options["appendfsync"] == "always"
    (volume,) = redis["volumes"]
    name, target = volume.split(":")[:2]
    assert target == "/data" and name in compose()["volumes"]
    assert re.fullmatch(r"redis:7(\.\d+)*", redis["image"])
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])


def test_compose_starts_the_aggregator_after_a_healthy_redis_and_stops_it_after_its_grace_period():
    aggregator = compose()["services"]["aggregator"]
    assert aggregator["depends_on"]["redis"]["condition"] == "service_healthy"
    assert compose()["services"]["prometheus"]["depends_on"]["aggregator"]["condition"] in (
        "service_started",
        "service_healthy",
    )
    assert seconds(aggregator["stop_grace_period"]) > veil_config(DOCKER / "veil.toml").grace_period
    build = aggregator["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    config = next(v for v in aggregator["volumes"] if v.split(":")[1] == "/etc/veil/veil.toml")
    assert (DEPLOY / config.split(":")[0]).resolve() == DOCKER / "veil.toml"
    assert urlsplit(veil_config(DOCKER / "veil.toml").store_url).hostname in compose()["services"]


def compose_secrets(service: str) -> dict[str, str]:
    """Where a compose service sees its secrets (/run/secrets/NAME) -> the file (relative to deploy/)."""
    files = compose()["secrets"]
    return {f"/run/secrets/{name}": files[name]["file"] for name in compose()["services"][service]["secrets"]}


def test_compose_mounts_the_files_the_docker_config_names_from_make_secrets_output():
    mounted = compose_secrets("aggregator")
    for key, named in secret_paths(DOCKER / "veil.toml").items():
        assert Path(mounted[named]).name == ROLE_FILES[key], key
    for secret in compose()["secrets"].values():
        source = Path(secret["file"])
        assert source.parent == Path("secrets") and source.name in SECRET_FILES - {"ca.key"}, source
    assert "secrets/" in (DEPLOY / ".gitignore").read_text().split()


def test_compose_publishes_grpc_for_devices_and_http_on_loopback_only():
    config = veil_config(DOCKER / "veil.toml")
    grpc_port, http_port = port(config.grpc_address), port(config.http_address)
    published = compose()["services"]["aggregator"]["ports"]
    assert sorted(published) == sorted([f"{grpc_port}:{grpc_port}", f"127.0.0.1:{http_port}:{http_port}"])
    # Beyond loopback only because every caller needs TLS and a token there.
    assert {"tls.cert_file", "auth.tokens_file"} <= secret_paths(DOCKER / "veil.toml").keys()
    assert "ports" not in compose()["services"]["redis"]
    assert all(p.startswith("127.0.0.1:") for p in compose()["services"]["prometheus"]["ports"])


def prometheus_job() -> dict:
    service = compose()["services"]["prometheus"]
    mount = next(v for v in service["volumes"] if v.split(":")[1] == "/etc/prometheus/prometheus.yml")
    (prometheus,) = load_yaml((DEPLOY / mount.split(":")[0]).resolve())
    (job,) = prometheus["scrape_configs"]
    return job


def test_prometheus_scrapes_the_aggregators_http_port_over_tls_with_a_read_token():
    job = prometheus_job()
    (target,) = [t for static in job["static_configs"] for t in static["targets"]]
    host, _, target_port = target.rpartition(":")
    assert host == "aggregator" and host in compose()["services"]
    assert int(target_port) == port(veil_config(DOCKER / "veil.toml").http_address)
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["scheme"] == "https" and not job["tls_config"].get("insecure_skip_verify", False)
    mounted = compose_secrets("prometheus")
    assert Path(mounted[job["tls_config"]["ca_file"]]).name == "ca.crt"
    assert job["authorization"].get("type", "Bearer") == "Bearer"
    assert Path(mounted[job["authorization"]["credentials_file"]]).name == "prometheus.token"


def test_compose_runs_grafana_with_the_veil_dashboard_and_prometheus_provisioned():
    grafana = compose()["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    provisioning = (DEPLOY / mounts["/etc/grafana/provisioning"]).resolve()
    assert provisioning == DEPLOY / "grafana" / "provisioning"
    (datasources,) = load_yaml(provisioning / "datasources" / "veil.yaml")
    (source,) = datasources["datasources"]
    url = urlsplit(source["url"])
    prometheus = compose()["services"]["prometheus"]
    assert source["type"] == "prometheus" and source["isDefault"] and url.hostname in compose()["services"]
    assert any(p.endswith(f":{url.port}") for p in prometheus["ports"]) and "image" in prometheus
    # The provider reads the directory the dashboard file is mounted in, and it is this repository's.
    (dashboards,) = load_yaml(provisioning / "dashboards" / "veil.yaml")
    (provider,) = dashboards["providers"]
    ((target, source_file),) = [(t, s) for t, s in mounts.items() if t.startswith(provider["options"]["path"] + "/")]
    assert (DEPLOY / source_file).resolve() == DEPLOY / "grafana" / "veil-dashboard.json"
    dashboard = json.loads((DEPLOY / source_file).read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert variable["query"] == source["type"]  # the dashboard's datasource variable finds it
    assert all(p.startswith("127.0.0.1:") for p in grafana["ports"])  # admin/admin until first login
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_started"
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", grafana["image"])
    assert any(v.startswith("grafana-data:") for v in grafana["volumes"]) and "grafana-data" in compose()["volumes"]


def test_the_readmes_say_compose_v2():
    for text in ((DEPLOY / "README.md").read_text(), (DEPLOY / "compose.yaml").read_text()):
        assert "Docker Compose v2" in text and "1.29" in text


def test_compose_and_kubernetes_run_the_image_of_this_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert compose()["services"]["aggregator"]["image"] == f"veil-aggregator:{version}"
    assert aggregator_container()["image"] == f"veil-aggregator:{version}"


# --- Kubernetes --------------------------------------------------------------------------------


def kustomization() -> dict:
    (doc,) = load_yaml(KUBE / "kustomization.yaml")
    return doc


def kube_objects() -> list[dict]:
    return [doc for name in kustomization()["resources"] for doc in load_yaml(KUBE / name)]


def kube_object(kind: str, name: str) -> dict:
    (obj,) = [o for o in kube_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def aggregator_container() -> dict:
    (container,) = kube_object("Deployment", "veil-aggregator")["spec"]["template"]["spec"]["containers"]
    return container


def test_kustomization_lists_every_manifest_and_generates_config_and_secrets_from_files():
    manifests = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == manifests
    (config_map,) = kustomization()["configMapGenerator"]
    assert config_map["files"] == ["veil.toml"]
    generators = {g["name"]: g for g in kustomization()["secretGenerator"]}
    assert generators["veil"]["envs"] == ["secret.env"]
    assert "secret.env" in (KUBE / ".gitignore").read_text().split()
    # The TLS Secret has the type and keys cert-manager gives its own, so one can replace the other.
    assert generators["veil-tls"]["type"] == "kubernetes.io/tls"
    assert set(secret_files()["veil-tls"]) == {"tls.crt", "tls.key", "ca.crt"}


def secret_files() -> dict[str, dict[str, str]]:
    """Secret name -> {key: file under kubernetes/} for the Secrets generated from files."""
    return {
        g["name"]: dict(f.split("=", 1) for f in g["files"]) for g in kustomization()["secretGenerator"] if "files" in g
    }


def secrets_volume() -> tuple[dict, dict]:
    """The aggregator's projected volume of Secrets, and its mount."""
    pod = kube_object("Deployment", "veil-aggregator")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "projected" in v]
    (mount,) = [m for m in aggregator_container()["volumeMounts"] if m["name"] == volume["name"]]
    return volume, mount


def mounted_secrets() -> dict[str, str]:
    """Path in the aggregator's container -> the file under kubernetes/ it comes from."""
    volume, mount = secrets_volume()
    files = secret_files()
    return {
        f"{mount['mountPath']}/{key}": file
        for source in volume["projected"]["sources"]
        for key, file in files[source["secret"]["name"]].items()
    }


def test_the_deployment_mounts_the_files_the_kubernetes_config_names_from_make_secrets_output():
    mounted = mounted_secrets()
    for key, named in secret_paths(KUBE / "veil.toml").items():
        assert Path(mounted[named]).name == ROLE_FILES[key], key
    for file in mounted.values():
        assert Path(file).parent == Path("secrets") and Path(file).name in SECRET_FILES - {"ca.key"}, file
    assert "secrets/" in (DEPLOY / ".gitignore").read_text().split()


def image_group() -> int:
    (user,) = final_stage("USER")
    return int(user.partition(":")[2])


def test_the_secret_files_are_readable_by_the_aggregators_group_alone():
    volume, mount = secrets_volume()
    assert mount["readOnly"] is True
    # Kubernetes makes them root's, group fsGroup: 0440 is what the aggregator accepts of a
    # root-owned secret (at most group-readable), and its group can read them.
    assert volume["projected"]["defaultMode"] == 0o440
    pod = kube_object("Deployment", "veil-aggregator")["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == image_group()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a root-owned file needs root")
def test_the_aggregator_accepts_a_secret_as_kubernetes_mounts_it(tmp_path):
    from veil.aggregator._secrets import check_private_file
    from veil.aggregator.errors import ConfigError

    volume, _ = secrets_volume()
    secret = tmp_path / "tls.key"
    secret.write_text("")
    os.chown(secret, 0, image_group())
    secret.chmod(volume["projected"]["defaultMode"])
    check_private_file(secret, "tls.key_file")
    secret.chmod(0o444)  # what a Secret volume gives by default: refused
    with pytest.raises(ConfigError):
        check_private_file(secret, "tls.key_file")


def test_the_deployment_probes_healthz_over_https_on_the_http_port():
    container = aggregator_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = veil_config(KUBE / "veil.toml")
    assert ports == {"grpc": port(config.grpc_address), "http": port(config.http_address)}
    assert tomllib.loads((KUBE / "veil.toml").read_text())["tls"]  # so HTTPS
    for probe in ("readinessProbe", "livenessProbe"):
        # The kubelet's own request, no process in the container; HTTPS, as the listener is TLS.
        assert "exec" not in container[probe], probe
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}, probe
        assert container[probe]["timeoutSeconds"] < container[probe]["periodSeconds"], probe
    service = kube_object("Service", "veil-aggregator")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    selector = kube_object("Deployment", "veil-aggregator")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert (
        selector.items()
        <= kube_object("Deployment", "veil-aggregator")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_kubernetes_config_answers_the_probe_over_https_without_a_token(stand_ins, tmp_path):
    """kubernetes/veil.toml with stand-in secrets: /healthz over HTTPS, unverified as the kubelet
    asks it, is 200 with no token, while /metrics wants one; plain HTTP gets no answer."""
    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import Aggregator

    text = with_secrets(KUBE / "veil.toml", stand_ins, tmp_path).read_text()
    data = tomllib.loads(text)
    data["server"].update(grpc="127.0.0.1:0", http="127.0.0.1:0")
    aggregator = Aggregator(parse_config(data, store_url="memory", base=tmp_path))
    aggregator.start()
    try:
        kubelet = ssl.create_default_context()
        kubelet.check_hostname, kubelet.verify_mode = False, ssl.CERT_NONE
        address = ("127.0.0.1", aggregator.http_port)
        assert https_get(address, "10.1.2.3", "/healthz", kubelet, None) == b"HTTP/1.0 200 OK"
        assert https_get(address, "10.1.2.3", "/metrics", kubelet, None).startswith(b"HTTP/1.0 401")
        with socket.create_connection(address, timeout=10) as plain:
            plain.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert not plain.makefile("rb").readline().startswith(b"HTTP/1.0 200")
    finally:
        aggregator.stop(grace=0)


def test_a_disruption_budget_keeps_all_but_one_aggregator_through_drains():
    budget = kube_object("PodDisruptionBudget", "veil-aggregator")
    deployment = kube_object("Deployment", "veil-aggregator")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]


def test_the_servicemonitor_example_scrapes_each_pod_over_tls_with_the_prometheus_token():
    path = KUBE / "prometheus-operator" / "servicemonitor.yaml"
    (monitor,) = load_yaml(path)
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    service = kube_object("Service", "veil-aggregator")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "https")
    # The Secret its header tells how to make holds the keys it reads, from make-secrets.sh's files.
    command = " ".join(
        line.lstrip("# ").rstrip("\\ ") for line in path.read_text().splitlines() if "--from-file" in line
    )
    made = dict(re.findall(r"--from-file=([\w.]+)=secrets/([\w.]+)", command))
    (secret,) = re.findall(r"create secret generic (\S+)", path.read_text())
    tls, token = endpoint["tlsConfig"]["ca"]["secret"], endpoint["authorization"]["credentials"]
    assert tls["name"] == token["name"] == secret
    assert (made[tls["key"]], made[token["key"]]) == ("ca.crt", "prometheus.token")
    assert endpoint["tlsConfig"]["serverName"] == service["metadata"]["name"]  # a name make-secrets.sh was given
    assert f"make-secrets.sh secrets {service['metadata']['name']} " in (DEPLOY / "README.md").read_text()


def test_the_deployment_runs_the_image_user_read_only_and_outlasts_the_grace_period():
    pod = kube_object("Deployment", "veil-aggregator")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == image_user()
    container = aggregator_container()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["terminationGracePeriodSeconds"] > veil_config(KUBE / "veil.toml").grace_period
    assert {"requests", "limits"} <= container["resources"].keys()
    # The read-only root leaves numba only the volume mounted at the image's NUMBA_CACHE_DIR.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts[image_env()["NUMBA_CACHE_DIR"]]]


def test_the_deployment_mounts_the_generated_config_where_the_image_reads_it():
    (cmd,) = final_stage("CMD")
    config_path = Path(veil_argv(exec_form(cmd)).config)
    container = aggregator_container()
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    pod = kube_object("Deployment", "veil-aggregator")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == kustomization()["configMapGenerator"][0]["name"]
    assert config_path.name in kustomization()["configMapGenerator"][0]["files"]


def secret_keys() -> set[str]:
    lines = (KUBE / "secret.env.example").read_text().splitlines()
    return {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}


def secret_refs(container: dict) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_the_store_url_and_redis_password_come_from_the_generated_secret():
    secret = kustomization()["secretGenerator"][0]["name"]
    assert secret_refs(aggregator_container()) == {"VEIL_STORE_URL": (secret, "VEIL_STORE_URL")}
    (redis,) = kube_object("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"]
    assert set(secret_refs(redis).values()) == {(secret, "REDIS_PASSWORD")}
    assert secret_keys() == {"VEIL_STORE_URL", "REDIS_PASSWORD"}
    # The example's URL names the StatefulSet's pod through its headless Service, as veil.toml does.
    example = dict(
        line.split("=", 1)
        for line in (KUBE / "secret.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    url = urlsplit(example["VEIL_STORE_URL"])
    assert url.password == example["REDIS_PASSWORD"]
    assert (url.hostname, url.port) == (urlsplit(veil_config(KUBE / "veil.toml").store_url).hostname, 6379)
    statefulset = kube_object("StatefulSet", "redis")
    assert url.hostname == f"{statefulset['metadata']['name']}-0.{statefulset['spec']['serviceName']}"


def test_the_redis_statefulset_fsyncs_every_write_to_its_volume():
    statefulset = kube_object("StatefulSet", "redis")
    (redis,) = statefulset["spec"]["template"]["spec"]["containers"]
    script = " ".join(redis["command"] + redis["args"])
    assert re.search(r"\bexec redis-server\b.*--appendonly yes\b", script)
    assert re.search(r"--appendfsync always\b", script)
    assert "$REDIS_PASSWORD" in script and "--requirepass" not in script  # stdin, not argv
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (mount,) = redis["volumeMounts"]
    assert mount == {"name": claim["metadata"]["name"], "mountPath": "/data"}
    assert "--dir /data" in script
    assert re.fullmatch(r"redis:7(\.\d+)*", redis["image"])
    headless = kube_object("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]


def test_the_redis_script_passes_the_password_on_stdin(tmp_path):
    """The container's script, run with a stand-in redis-server that prints what it gets: the
    options as arguments, then "-" (read config from stdin), and the password on stdin only."""
    (redis,) = kube_object("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"]
    assert redis["command"] == ["sh", "-c"]
    fake = tmp_path / "redis-server"
    fake.write_text('#!/bin/sh\nprintf "arg %s\\n" "$@"\nsed "s/^/stdin /"\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", redis["args"][0]],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "REDIS_PASSWORD": "0123abcd"},
    )
    lines = out.stdout.splitlines()
    assert lines[-2:] == ["arg -", 'stdin requirepass "0123abcd"']
    assert not any("0123abcd" in line for line in lines if line.startswith("arg"))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) is not installed")
def test_kustomize_renders_and_the_rendered_configmap_passes_check_config(tmp_path, stand_ins):
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy)
    shutil.copy(copy / "secret.env.example", copy / "secret.env")
    shutil.copytree(stand_ins, copy / "secrets", ignore=shutil.ignore_patterns("pki"))
    rendered = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True, check=True)
    objects = {
        (
            o["kind"],
            o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] in ("ConfigMap", "Secret") else o["metadata"]["name"],
        ): o
        for o in yaml.safe_load_all(rendered.stdout)
    }
    config_map = objects["ConfigMap", "veil-config"]
    config = tmp_path / "veil.toml"
    config.write_text(config_map["data"]["veil.toml"])
    out = check_config(with_secrets(config, stand_ins, tmp_path / "checked"))
    assert out.returncode == 0, out.stderr
    tls = objects["Secret", "veil-tls"]
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    # kustomize wrote the generated names (with their hash) into every reference.
    pod = objects["Deployment", "veil-aggregator"]["spec"]["template"]["spec"]
    assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} == {config_map["metadata"]["name"]}
    secret = objects["Secret", "veil"]["metadata"]["name"]
    (redis,) = objects["StatefulSet", "redis"]["spec"]["template"]["spec"]["containers"]
    for container in (pod["containers"][0], redis):
        assert {name for name, _ in secret_refs(container).values()} == {secret}
    (volume,) = [v for v in pod["volumes"] if "projected" in v]
    assert {s["secret"]["name"] for s in volume["projected"]["sources"]} == {
        objects["Secret", name]["metadata"]["name"] for name in ("veil-tls", "veil-tokens")
    }


# --- systemd -------------------------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    # strict=False: a unit may repeat a key (SystemCallFilter=); the last one read is enough here.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string((SYSTEMD / "veil-aggregator.service").read_text())
    return parser


def systemd_seconds(text: str) -> float:
    total = 0.0
    for value, unit_ in re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h)?", text):
        total += float(value) * {"ms": 0.001, "s": 1, "": 1, "min": 60, "h": 3600}[unit_]
    return total


def test_the_unit_stops_later_than_the_grace_period_with_sigterm():
    service = unit()["Service"]
    assert systemd_seconds(service["TimeoutStopSec"]) > veil_config(SYSTEMD / "veil.toml").grace_period
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"


def test_the_unit_runs_veil_serve_on_the_installed_config_and_environment_file():
    service = unit()["Service"]
    args = veil_argv(shlex.split(service["ExecStart"]))
    assert args.command == "serve" and args.config == "/etc/veil/veil.toml"
    assert service["EnvironmentFile"].lstrip("-") == "/etc/veil/veil.env"
    example = (SYSTEMD / "veil.env.example").read_text().splitlines()
    assert {line.split("=", 1)[0] for line in example if line and not line.startswith("#")} == {"VEIL_STORE_URL"}


def credentials() -> dict[str, str]:
    """The unit's LoadCredential= lines, id -> file (configparser keeps only the last of a key)."""
    text = (SYSTEMD / "veil-aggregator.service").read_text()
    return dict(re.findall(r"^LoadCredential=([^:\s]+):(\S+)$", text, re.M))


def test_the_unit_passes_the_files_the_systemd_config_names_as_credentials():
    # The config cannot say $CREDENTIALS_DIRECTORY: it names the directory systemd gives this unit.
    directory = Path("/run/credentials") / (SYSTEMD / "veil-aggregator.service").name
    loaded = credentials()
    named = secret_paths(SYSTEMD / "veil.toml")
    assert set(loaded) == {Path(path).name for path in named.values()}
    for key, path in named.items():
        assert Path(path).parent == directory, key
        assert Path(loaded[Path(path).name]).name == ROLE_FILES[key], key
    # From where the install steps have make-secrets.sh put them; never the CA's key.
    (made,) = re.findall(r"make-secrets\.sh (\S+)", (SYSTEMD / "veil-aggregator.service").read_text())
    for source in loaded.values():
        assert Path(source).parent == Path(made) and Path(source).name in SECRET_FILES - {"ca.key"}, source


def test_the_unit_is_hardened_and_gives_numba_a_writable_cache():
    service = unit()["Service"]
    assert service.get("DynamicUser") == "yes" or service.get("User") not in (None, "root", "0")
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"
    assert service["StateDirectory"] == "veil"
    assert service["Environment"] == f"NUMBA_CACHE_DIR=%C/{service['CacheDirectory']}"
    # numba's JIT needs memory that is written, then executed.
    assert service.get("MemoryDenyWriteExecute", "no") == "no"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # verify wants ExecStart's program to exist: point it at this environment's veil.
    veil = Path(sys.executable).parent / "veil"
    text = (SYSTEMD / "veil-aggregator.service").read_text().replace("/opt/veil/bin/veil", str(veil))
    (tmp_path / "veil-aggregator.service").write_text(text)
    out = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "veil-aggregator.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


# --- make-secrets.sh: what the deployments mount -------------------------------------------------


def make_secrets(directory: Path, *names: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(MAKE_SECRETS), str(directory), *names], capture_output=True, text=True, timeout=60, env=env
    )


def test_make_secrets_says_why_openssl_failed_and_leaves_nothing_behind(tmp_path):
    fake = tmp_path / "bin" / "openssl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'openssl: no such curve' >&2\nexit 1\n")
    fake.chmod(0o755)
    out = make_secrets(tmp_path / "secrets", "aggregator", env={**os.environ, "PATH": f"{fake.parent}:/usr/bin:/bin"})
    assert out.returncode == 1 and "openssl: no such curve" in out.stderr
    assert list((tmp_path / "secrets").iterdir()) == []


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """make-secrets.sh's output for compose's aggregator (the name Prometheus scrapes) and an address."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl (which make-secrets.sh runs) is not installed")
    directory = tmp_path_factory.mktemp("made") / "secrets"
    out = make_secrets(directory, "aggregator", "192.0.2.7")
    assert out.returncode == 0, out.stderr
    tokens = tomllib.loads((directory / "tokens.toml").read_text())
    for entry in tokens["upload_tokens"] + tokens["read_tokens"]:
        assert entry["token"] not in out.stdout + out.stderr  # it prints no secret
    return directory


def test_make_secrets_makes_owner_only_files_and_overwrites_nothing(made):
    assert {p.name for p in made.iterdir()} == SECRET_FILES
    for path in made.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == (0o644 if path.suffix == ".crt" else 0o600), path.name
    before = {p.name: p.read_bytes() for p in made.iterdir()}
    again = make_secrets(made, "aggregator")
    assert again.returncode == 1 and "exists already" in again.stderr
    assert {p.name: p.read_bytes() for p in made.iterdir()} == before
    assert make_secrets(made).returncode == 2  # no NAME: usage


def test_make_secrets_certifies_the_names_given_and_those_the_probes_dial(made):
    from cryptography import x509

    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((made / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "aggregator"}
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "192.0.2.7"}
    tokens = tomllib.loads((made / "tokens.toml").read_text())
    (prometheus,) = [t for t in tokens["read_tokens"] if t["name"] == "prometheus"]
    assert (made / "prometheus.token").read_text().strip() == prometheus["token"]


def https_get(address: tuple[str, int], host: str, path: str, context: ssl.SSLContext, token: str | None) -> bytes:
    """The status line of GET `path` over TLS to `address`, checking the certificate for `host`."""
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    with socket.create_connection(address, timeout=10) as raw, context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n{authorization}\r\n".encode())
        return tls.makefile("rb").readline().strip()


def test_the_docker_config_with_make_secrets_output_answers_the_health_check_and_prometheus(made, tmp_path, capsys):
    """docker/veil.toml's TLS and tokens, on free loopback ports and a memory store: the image's
    HEALTHCHECK and compose's Prometheus job, with the files compose mounts, both get in."""
    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import Aggregator
    from veil.cli import main

    data = tomllib.loads(with_secrets(DOCKER / "veil.toml", made, tmp_path).read_text())
    data["server"].update(grpc="127.0.0.1:0", http="127.0.0.1:0")
    aggregator = Aggregator(parse_config(data, store_url="memory"))
    aggregator.start()
    try:

        def host_file(service: str, path: str) -> str:
            return str(made / Path(compose_secrets(service)[path]).name)

        _, command = healthcheck()
        args = veil_argv(command)
        argv = [
            *command[1:],
            "--ca-file",
            host_file("aggregator", args.ca_file),
            "--address",
            f"{args.address.rpartition(':')[0]}:{aggregator.grpc_port}",
        ]
        assert main(argv) == 0 and capsys.readouterr().out.strip() == "SERVING"

        job = prometheus_job()
        context = ssl.create_default_context(cafile=host_file("prometheus", job["tls_config"]["ca_file"]))
        token = Path(host_file("prometheus", job["authorization"]["credentials_file"])).read_text().strip()
        (target,) = job["static_configs"][0]["targets"]
        address = ("127.0.0.1", aggregator.http_port)
        host = target.rpartition(":")[0]
        assert https_get(address, host, job.get("metrics_path", "/metrics"), context, token) == b"HTTP/1.0 200 OK"
        assert https_get(address, host, "/metrics", context, None).startswith(b"HTTP/1.0 401")
    finally:
        aggregator.stop(grace=0)


# --- Kubernetes on a Redis Cluster (kubernetes-cluster/, an overlay of kubernetes/) -------------


def cluster_kustomization() -> dict:
    (doc,) = load_yaml(KUBE_CLUSTER / "kustomization.yaml")
    return doc


def cluster_object(kind: str, name: str) -> dict:
    objects = [
        doc
        for name_ in cluster_kustomization()["resources"]
        if not name_.startswith("..")
        for doc in load_yaml(KUBE_CLUSTER / name_)
    ]
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def cluster_patches() -> list[dict]:
    return [yaml.safe_load(p["patch"]) for p in cluster_kustomization()["patches"]]


def test_the_cluster_overlay_is_the_base_without_its_redis_plus_a_cluster_and_an_autoscaler():
    resources = cluster_kustomization()["resources"]
    assert resources[0] == "../kubernetes" and (KUBE_CLUSTER / resources[0] / "kustomization.yaml").exists()
    assert {p.name for p in KUBE_CLUSTER.glob("*.yaml")} - {"kustomization.yaml"} == set(resources[1:])
    deleted = {(p["kind"], p["metadata"]["name"]) for p in cluster_patches() if p.get("$patch") == "delete"}
    base = {(o["kind"], o["metadata"]["name"]) for o in load_yaml(KUBE / "redis.yaml")}
    assert deleted == base  # every object of the single Redis, and nothing else
    generators = {
        g["name"]: g
        for g in [*cluster_kustomization()["configMapGenerator"], *cluster_kustomization()["secretGenerator"]]
    }
    assert generators["veil-config"] == {"name": "veil-config", "behavior": "replace", "files": ["veil.toml"]}
    assert generators["veil"] == {"name": "veil", "behavior": "replace", "envs": ["secret.env"]}
    assert "secret.env" in (KUBE_CLUSTER / ".gitignore").read_text().split()


def test_the_autoscaler_scales_the_aggregator_deployment_on_cpu_against_a_one_core_request():
    hpa = cluster_object("HorizontalPodAutoscaler", "veil-aggregator")["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "veil-aggregator")
    kube_object("Deployment", "veil-aggregator")  # the base has it
    (patch,) = [p for p in cluster_patches() if p["kind"] == "Deployment"]
    assert patch["spec"]["replicas"] == hpa["minReplicas"] < hpa["maxReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu" and 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] == aggregator_container()["name"] and container["resources"]["requests"]["cpu"] == "1"


def test_the_redis_cluster_is_six_fsyncing_nodes_formed_into_three_masters_with_a_replica_each():
    nodes = cluster_object("StatefulSet", "redis-cluster")["spec"]
    assert nodes["replicas"] == 6 and nodes["serviceName"] == "redis-cluster"
    (redis,) = nodes["template"]["spec"]["containers"]
    command = " ".join(redis["args"])
    for flag in (
        "--cluster-enabled yes",
        "--appendonly yes",
        "--appendfsync always",
        "--cluster-config-file /data/nodes.conf",
        "--cluster-preferred-endpoint-type hostname",
    ):
        assert flag in command, flag
    assert "requirepass" in command and "masterauth" in command and "$REDIS_PASSWORD" not in command.split("<<")[0]
    service = cluster_object("Service", "redis-cluster")["spec"]
    assert service["clusterIP"] == "None" and service["selector"] == nodes["selector"]["matchLabels"]
    assert {p["port"] for p in service["ports"]} == {6379, 16379}
    (create,) = cluster_object("Job", "redis-cluster-create")["spec"]["template"]["spec"]["containers"]
    script = create["args"][0]
    assert "--cluster-replicas 1" in script and "for i in 0 1 2 3 4 5" in script and "cluster_state:ok" in script


def test_the_cluster_config_and_secret_name_the_cluster_s_nodes_and_shards_over_its_masters():
    from veil.aggregator.store._redis import MAX_SHARDS

    pods = {f"redis-cluster-{i}.redis-cluster:6379" for i in range(6)}
    secret = dict(
        line.split("=", 1)
        for line in (KUBE_CLUSTER / "secret.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    url = urlsplit(secret["VEIL_STORE_URL"])
    assert url.scheme == "redis+cluster" and url.password == secret["REDIS_PASSWORD"]
    assert set(url.netloc.rpartition("@")[2].split(",")) <= pods
    config = veil_config(KUBE_CLUSTER / "veil.toml")
    assert set(urlsplit(config.store_url).netloc.split(",")) <= pods
    shards = config.store_options["shards"]
    assert shards % 3 == 0 and shards <= MAX_SHARDS  # the same number on every master
    assert config.store_options["wait_replicas"] == 1


# --- the Grafana dashboard ----------------------------------------------------------------------

GRAFANA = DEPLOY / "grafana" / "veil-dashboard.json"


def grafana_queries() -> list[str]:
    """Every PromQL expression of the dashboard (panels and template variables), its variables
    replaced by values, as Grafana would."""
    board = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            exprs.append(re.fullmatch(r"label_values\((.*), \w+\)", query).group(1))
    values = {"$metric": "browser", "$window": "1h", "$category": "chrome|edge", "$job": "veil"}
    return [re.sub(r"\$\w+", lambda m: values[m.group(0)], e) for e in exprs]


def test_the_grafana_dashboard_is_valid_promql_over_metrics_the_aggregator_serves(tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from veil.aggregator.config import parse_config
    from veil.aggregator.daemon import _exported_registry
    from veil.aggregator.instruments import Instruments
    from veil.aggregator.live import LiveEstimates
    from veil.aggregator.store import MemoryStore

    board = json.loads(GRAFANA.read_text())
    assert board["uid"] and len({p["id"] for p in board["panels"]}) == len(board["panels"])
    queries = grafana_queries()
    # promtool parses each expression (as a recording rule) like Prometheus would.
    rules = {
        "groups": [{"name": "grafana", "rules": [{"record": f"veil:q{i}", "expr": e} for i, e in enumerate(queries)]}]
    }
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make promtool` installs Debian's prometheus package"
    done = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Every series name it asks for is one the aggregator's /metrics has.
    config = parse_config(
        {
            "store": {"url": "memory"},
            "metrics": [{"name": "browser", "labels": ["chrome", "edge"], "mechanism": "subset", "epsilon": 1.0}],
        }
    )
    instruments = Instruments()
    instruments.uploads.labels("browser", "accepted").inc()  # labelled series appear once used
    instruments.upload_seconds.labels("browser").observe(0.001)
    registry = _exported_registry(config, instruments, LiveEstimates(config, MemoryStore()))
    served = {s.name for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    served |= {"veil_estimate", "veil_estimate_stderr", "veil_estimate_rest", "veil_estimate_rest_stderr"}  # n = 0
    # Exported once a numeric or strings metric has an estimate (test_prometheus.py and
    # test_strings_estimates.py read them off /metrics with data).
    served |= {f"veil_numeric_mean{s}" for s in ("", "_stderr", "_lower", "_upper")}
    served |= {f"veil_numeric_quantile{s}" for s in ("", "_lower", "_upper")}
    served |= {f"veil_strings_share{s}" for s in ("", "_stderr", "_lower", "_upper")} | {"veil_strings_floor"}
    asked = {name for e in queries for name in re.findall(r"\b((?:veil|process)_[a-z_]+)\b", e)}
    assert asked and asked <= served, asked - served


# --- the examples' placeholder password ------------------------------------------------------------


EXAMPLE_ENVS = {
    KUBE / "secret.env.example": KUBE / "veil.toml",
    KUBE_CLUSTER / "secret.env.example": KUBE_CLUSTER / "veil.toml",
    SYSTEMD / "veil.env.example": SYSTEMD / "veil.toml",
}


def env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("example", list(EXAMPLE_ENVS), ids=rel)
def test_the_example_secrets_placeholder_password_is_refused_at_start(example, stand_ins, tmp_path):
    from veil.aggregator.config import PLACEHOLDER_PASSWORD

    values = env_file(example)
    assert urlsplit(values["VEIL_STORE_URL"]).password == PLACEHOLDER_PASSWORD
    assert values.get("REDIS_PASSWORD", PLACEHOLDER_PASSWORD) == PLACEHOLDER_PASSWORD
    config = with_secrets(EXAMPLE_ENVS[example], stand_ins, tmp_path)
    argv = [sys.executable, "-m", "veil.cli", "serve", "--config", str(config), "--check-config"]
    env = {k: v for k, v in os.environ.items() if k != "VEIL_CONFIG"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, **values})
    assert out.returncode == 2 and f"the password is '{PLACEHOLDER_PASSWORD}'" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1  # one sentence, no traceback
    # A password of one's own passes that check (the store is not reachable here: another error or none).
    own = values["VEIL_STORE_URL"].replace(f":{PLACEHOLDER_PASSWORD}@", ":0123456789abcdef@")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, "VEIL_STORE_URL": own})
    assert "placeholder" not in out.stderr
