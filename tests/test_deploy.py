"""deploy/: every file parses, every config passes `veil serve --check-config`, and the files agree
with each other (ports, grace periods, users, Redis durability). No Docker engine or cluster runs
here, so this is what keeps the image, compose file, manifests and unit honest.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
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

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
KUBE = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"

YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
TOML_FILES = sorted(DEPLOY.rglob("*.toml"))
VEIL_CONFIGS = [DOCKER / "veil.toml", KUBE / "veil.toml", SYSTEMD / "veil.toml"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


def veil_config(path: Path):
    from veil.aggregator.config import load_config

    return load_config(path, store_url=None)


def check_config(path: Path) -> subprocess.CompletedProcess:
    # The file's own [store] url, not one from the environment of whoever runs the tests.
    env = {k: v for k, v in os.environ.items() if k not in ("VEIL_STORE_URL", "VEIL_CONFIG")}
    return subprocess.run([sys.executable, "-m", "veil.aggregator.cli", "serve", "--config", str(path),
                           "--check-config"], capture_output=True, text=True, timeout=120, env=env)


def veil_argv(argv: list[str]):
    """argv parsed by the real `veil` parser, as the container or unit would run it."""
    from veil.aggregator.cli import build_parser

    assert argv[0] in ("veil", "/opt/veil/bin/veil"), argv
    return build_parser().parse_args(argv[1:])


# --- every file parses ----------------------------------------------------------------------

def test_deploy_has_the_expected_files():
    for name in ("README.md", "compose.yaml", "docker/Dockerfile", "docker/Dockerfile.dockerignore",
                 "docker/veil.toml", "docker/constraints.txt", "prometheus/prometheus.yml",
                 "kubernetes/kustomization.yaml", "kubernetes/aggregator.yaml", "kubernetes/redis.yaml",
                 "kubernetes/veil.toml", "kubernetes/secret.env.example", "systemd/veil-aggregator.service",
                 "systemd/veil.toml", "systemd/veil.env.example"):
        assert (DEPLOY / name).is_file(), name
    assert len(YAML_FILES) >= 5 and len(TOML_FILES) == 3


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_every_yaml_file_parses(path):
    docs = load_yaml(path)
    assert docs and all(isinstance(doc, dict) for doc in docs)


@pytest.mark.parametrize("path", TOML_FILES, ids=rel)
def test_every_toml_file_parses(path):
    assert tomllib.loads(path.read_text())


@pytest.mark.parametrize("path", VEIL_CONFIGS, ids=rel)
def test_every_veil_config_passes_check_config(path):
    out = check_config(path)
    # The stores these name (redis:6379, redis-0.redis:6379) do not exist here: a good config
    # still exits 0, and says so.
    assert out.returncode == 0, out.stderr
    assert re.search(r": OK \(\d+ metrics; store .*: (reachable|not reachable from here)", out.stdout), out.stdout


def test_every_veil_config_in_deploy_is_checked():
    assert {p for p in TOML_FILES if "metrics" in tomllib.loads(p.read_text())} == set(VEIL_CONFIGS)


def test_the_sample_configs_listen_where_the_deploy_files_expect():
    for path in VEIL_CONFIGS:
        config = veil_config(path)
        assert port(config.grpc_address) == 50051 and port(config.http_address) == 8080, path
    for path in (DOCKER / "veil.toml", KUBE / "veil.toml"):  # a container must bind every interface
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


def test_the_image_health_check_is_veil_health_within_dockers_timeout():
    (healthcheck,) = final_stage("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    args = veil_argv(exec_form(command))
    assert args.command == "health"
    docker_timeout = re.search(r"--timeout=(\d+)s", options)
    assert docker_timeout and args.timeout < int(docker_timeout.group(1))
    assert port(args.address) == 50051


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
    for left_out in (".venv/bin/python", ".git/HEAD", "tests/test_deploy.py", "bench/bench_randomize.py",
                     "aggregator/src/veil/aggregator/__pycache__/daemon.cpython-311.pyc"):
        assert ignored(left_out, patterns), left_out


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
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(src)], check=True)
    (wheel,) = tmp_path.glob("veil-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("veil/mechanism/__init__.py", "veil/client/__init__.py", "veil/aggregator/daemon.py",
                   "veil/aggregator/cli/_serve.py", "veil/aggregator/cli/_health.py", "veil/wire/v1/veil_pb2.py"):
        assert module in names
    assert not any("__pycache__" in n for n in names)


def test_the_constraints_pin_every_dependency_within_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    for spec in project["dependencies"] + project["optional-dependencies"]["aggregator"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
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
        "service_started", "service_healthy")
    assert seconds(aggregator["stop_grace_period"]) > veil_config(DOCKER / "veil.toml").grace_period
    build = aggregator["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    config = next(v for v in aggregator["volumes"] if v.split(":")[1] == "/etc/veil/veil.toml")
    assert (DEPLOY / config.split(":")[0]).resolve() == DOCKER / "veil.toml"
    assert urlsplit(veil_config(DOCKER / "veil.toml").store_url).hostname in compose()["services"]


def test_compose_publishes_the_configured_ports_on_loopback_only():
    config = veil_config(DOCKER / "veil.toml")
    published = compose()["services"]["aggregator"]["ports"]
    assert sorted(published) == sorted(f"127.0.0.1:{p}:{p}" for p in (port(config.grpc_address),
                                                                      port(config.http_address)))
    assert "ports" not in compose()["services"]["redis"]


def test_prometheus_scrapes_the_aggregators_http_port():
    service = compose()["services"]["prometheus"]
    mount = next(v for v in service["volumes"] if v.split(":")[1] == "/etc/prometheus/prometheus.yml")
    (prometheus,) = load_yaml((DEPLOY / mount.split(":")[0]).resolve())
    (job,) = prometheus["scrape_configs"]
    (target,) = [t for static in job["static_configs"] for t in static["targets"]]
    host, _, target_port = target.rpartition(":")
    assert host == "aggregator" and host in compose()["services"]
    assert int(target_port) == port(veil_config(DOCKER / "veil.toml").http_address)
    assert job.get("metrics_path", "/metrics") == "/metrics"


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


def test_kustomization_lists_every_manifest_and_generates_config_and_secret_from_files():
    manifests = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == manifests
    (config_map,) = kustomization()["configMapGenerator"]
    assert config_map["files"] == ["veil.toml"]
    (secret,) = kustomization()["secretGenerator"]
    assert secret["envs"] == ["secret.env"]
    assert "secret.env" in (KUBE / ".gitignore").read_text().split()


def test_the_deployment_probes_the_containers_grpc_port():
    container = aggregator_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = veil_config(KUBE / "veil.toml")
    assert ports == {"grpc": port(config.grpc_address), "http": port(config.http_address)}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], probe
        assert container[probe]["grpc"].get("service", "") == ""  # the one the daemon sets
    service = kube_object("Service", "veil-aggregator")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    selector = kube_object("Deployment", "veil-aggregator")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert selector.items() <= kube_object("Deployment", "veil-aggregator")["spec"]["template"]["metadata"][
        "labels"].items()


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
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


def test_the_store_url_and_redis_password_come_from_the_generated_secret():
    secret = kustomization()["secretGenerator"][0]["name"]
    assert secret_refs(aggregator_container()) == {"VEIL_STORE_URL": (secret, "VEIL_STORE_URL")}
    (redis,) = kube_object("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"]
    assert set(secret_refs(redis).values()) == {(secret, "REDIS_PASSWORD")}
    assert secret_keys() == {"VEIL_STORE_URL", "REDIS_PASSWORD"}
    # The example's URL names the StatefulSet's pod through its headless Service, as veil.toml does.
    example = dict(line.split("=", 1) for line in (KUBE / "secret.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
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
    out = subprocess.run(["sh", "-c", redis["args"][0]], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "REDIS_PASSWORD": "0123abcd"})
    lines = out.stdout.splitlines()
    assert lines[-2:] == ["arg -", 'stdin requirepass "0123abcd"']
    assert not any("0123abcd" in line for line in lines if line.startswith("arg"))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) is not installed")
def test_kustomize_renders_and_the_rendered_configmap_passes_check_config(tmp_path):
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy)
    shutil.copy(copy / "secret.env.example", copy / "secret.env")
    rendered = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True, check=True)
    objects = {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] in ("ConfigMap", "Secret")
                else o["metadata"]["name"]): o for o in yaml.safe_load_all(rendered.stdout)}
    config_map = objects["ConfigMap", "veil-config"]
    config = tmp_path / "veil.toml"
    config.write_text(config_map["data"]["veil.toml"])
    out = check_config(config)
    assert out.returncode == 0, out.stderr
    # kustomize wrote the generated names (with their hash) into every reference.
    pod = objects["Deployment", "veil-aggregator"]["spec"]["template"]["spec"]
    assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} == {config_map["metadata"]["name"]}
    secret = objects["Secret", "veil"]["metadata"]["name"]
    (redis,) = objects["StatefulSet", "redis"]["spec"]["template"]["spec"]["containers"]
    for container in (pod["containers"][0], redis):
        assert {name for name, _ in secret_refs(container).values()} == {secret}


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
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "veil-aggregator.service")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
