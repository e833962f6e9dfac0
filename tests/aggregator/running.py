"""Running aggregators for the daemon tests: in-process (any store) or as a `veil serve` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from redis_server import free_port

from veil.wire.v1 import veil_pb2, veil_pb2_grpc

METRICS = [
    {"name": "browser", "labels": ["chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "other"],
     "mechanism": "subset", "epsilon": 1.0, "windows": ["total", "1h"]},
    {"name": "os", "labels": ["android", "ios", "windows", "macos", "linux", "other"], "mechanism": "krr",
     "epsilon": 2.0},
    {"name": "opted_in", "labels": ["no", "yes"], "mechanism": "warner", "epsilon": 1.0},
    {"name": "crash_screen", "labels": [f"screen-{i}" for i in range(8)], "mechanism": "rappor", "epsilon": 2.0},
    {"name": "feature", "labels": [f"f{i}" for i in range(8)], "mechanism": "rappor-admissible", "epsilon": 2.0},
]


def config_dict(store_url: str = "memory", grpc_port: int = 0, **server: object) -> dict:
    return {
        "server": {"grpc": f"127.0.0.1:{grpc_port}", "http": "127.0.0.1:0", "min_n": 100, "watch_interval": 0.1,
                   "grace_period": 2.0, **server},
        "store": {"url": store_url},
        "metrics": METRICS,
    }


class ServeProcess:
    """`python -m veil.aggregator --config FILE` on a fixed gRPC port, killable and restartable."""

    def __init__(self, directory: Path, store_url: str) -> None:
        self.grpc_port = free_port()
        self.config = directory / "veil.toml"
        self.log = directory / "serve.log"
        self.config.write_text(_toml(config_dict(store_url, self.grpc_port)))
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> ServeProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "veil.aggregator", "--config", str(self.config)],
                                            stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        channel = grpc.insecure_channel(self.endpoint)
        try:
            grpc.channel_ready_future(channel).result(timeout=30)
        finally:
            channel.close()
        return self

    def signal(self, signum: int) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.signal(signal.SIGKILL)


def _toml(data: dict) -> str:
    """Just enough TOML for config_dict's shape."""
    def value(v: object) -> str:
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for table in ("server", "store"):
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in data[table].items()]
    for metric in data["metrics"]:
        lines.append("[[metrics]]")
        lines += [f"{k} = {value(v)}" for k, v in metric.items()]
    return "\n".join(lines) + "\n"


def collector(endpoint: str) -> veil_pb2_grpc.CollectorStub:
    return veil_pb2_grpc.CollectorStub(grpc.insecure_channel(endpoint))


def estimates(endpoint: str, metric: str = "", window: str = "") -> veil_pb2.EstimatesResponse:
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(endpoint))
    return stub.Get(veil_pb2.EstimatesRequest(metric=metric, window=window), timeout=10)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


SPEC_NAMES = tuple(m["name"] for m in METRICS)
