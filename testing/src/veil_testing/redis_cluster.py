"""A real Redis Cluster for tests: 6 redis-server processes (3 masters, 3 replicas) on free ports.

    with RedisClusterServers() as cluster:
        cluster.url                 # redis+cluster://127.0.0.1:<port>,127.0.0.1:<port>,...
        cluster.masters()           # the RedisServer of each master now, by CLUSTER NODES
        cluster.replica_of(master)  # its replica
        cluster.wait_ok()           # every live node says cluster_state:ok and agrees on the masters
        cluster.flush()             # FLUSHALL on every master (between tests sharing a cluster)

    with RedisClusterServers(tls=TlsFiles(ca, cert, key, client_cert, client_key)) as cluster:
        cluster.tls_url             # rediss+cluster://127.0.0.1:<tls port>,...?ssl_ca_certs=<ca>

With ``tls`` every node also listens with TLS (``--tls-port``, the certificate and key given;
no client certificates asked), and the cluster bus and
replication speak TLS only (``tls-cluster yes``, ``tls-replication yes``): a client connected
with TLS is told the nodes' TLS ports (CLUSTER SLOTS answers by the asking connection's kind),
so it reaches every node with TLS. The plaintext ports stay, for this harness's own commands.

Each node is a redis_server.RedisServer (free port, own directory, SIGKILL when the
starting thread dies); the cluster is made with `redis-cli --cluster create ... --cluster-replicas
1 --cluster-yes`. No redis-py, as redis_server.py.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from veil_testing.processes import Started, free_port
from veil_testing.redis_server import RedisServer

__all__ = ["RedisClusterServers", "TlsFiles"]

NODE_TIMEOUT_MS = 1500  # how long a master may be silent before its replica takes over


class TlsFiles(NamedTuple):
    """PEM files for TLS nodes, all from one CA: a server certificate (for 127.0.0.1) and a
    client certificate, which a node shows when it connects to another (the cluster bus and
    replication always ask for one, whatever tls-auth-clients says)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


class RedisClusterServers(Started):
    def __init__(self, masters: int = 3, *, appendonly: bool = False, tls: TlsFiles | None = None) -> None:
        self.cli = shutil.which("redis-cli")
        if self.cli is None:
            raise RuntimeError("redis-cli is not installed (Debian package redis-tools, with redis-server).")
        self.tls = tls
        self.tls_ports = [free_port() for _ in range(2 * masters)] if tls else []
        self.nodes = [
            RedisServer(
                appendonly=appendonly,
                appendfsync="always",
                args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    # The bus port defaults to port + 10000, which may be taken or past 65535.
                    "--cluster-port",
                    str(free_port()),
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    # A replica takes over however long it was cut off (a test kills masters at will).
                    "--cluster-replica-validity-factor",
                    "0",
                    *(_tls_args(tls, self.tls_ports[i]) if tls else ()),
                ),
            )  # fmt: skip
            for i in range(2 * masters)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def tls_url(self) -> str:
        """The cluster's TLS ports, trusting the CA of its certificates (with ``tls`` only)."""
        if self.tls is None:
            raise RuntimeError("this cluster was started without TLS")
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.tls_ports)
        return f"rediss+cluster://{hosts}?ssl_ca_certs={quote(str(self.tls.ca), safe='/')}"

    def start(self) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [self.cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
        self.wait_ok()
        return self

    def cluster_nodes(self, via: RedisServer | None = None) -> list[list[str]]:
        """CLUSTER NODES as seen by `via` (the first live node by default), one split line each."""
        via = via or next(node for node in self.nodes if node.running)
        text = self.call(via, "CLUSTER", "NODES")
        return [line.split() for line in text.splitlines() if line.strip()]

    def masters(self) -> list[RedisServer]:
        """The live masters that own slots, in port order."""
        ports = {
            int(fields[1].split(":")[1].split("@")[0])
            for fields in self.cluster_nodes()
            if "master" in fields[2] and "fail" not in fields[2] and len(fields) > 8
        }
        return [node for node in self.nodes if node.port in ports and node.running]

    def replica_of(self, master: RedisServer) -> RedisServer:
        lines = self.cluster_nodes()
        master_id = next(f[0] for f in lines if f[1].split("@")[0].endswith(f":{master.port}"))
        port = next(int(f[1].split(":")[1].split("@")[0]) for f in lines if f[3] == master_id)
        return next(node for node in self.nodes if node.port == port)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node reports cluster_state:ok, every slot has a live master and each
        master a replica done with its first sync (as many as the live nodes allow)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                live = [node for node in self.nodes if node.running]
                if all("cluster_state:ok" in self.call(node, "CLUSTER", "INFO") for node in live):
                    ports = {node.port for node in live}  # a killed master's slots are not served
                    owned = sum(
                        len(range(int(r.split("-")[0]), int(r.split("-")[-1]) + 1))
                        for f in self.cluster_nodes()
                        if "master" in f[2] and "fail" not in f[2] and int(f[1].split(":")[1].split("@")[0]) in ports
                        for r in f[8:]
                        if not r.startswith("[")
                    )
                    masters = self.masters()
                    synced = sum("state=online" in self.call(node, "INFO", "replication") for node in masters)
                    if owned == 16384 and synced >= min(len(masters), len(live) - len(masters)):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the Redis cluster did not become ok in time:\n"
                    + "\n".join(" ".join(f) for f in self.cluster_nodes())
                )
            time.sleep(0.1)

    def node_id(self, node: RedisServer) -> str:
        return self.call(node, "CLUSTER", "MYID").strip()

    def owner(self, slot: int) -> RedisServer:
        """The master serving a slot now."""
        for fields in self.cluster_nodes():
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for ranges in fields[8:]:
                if not ranges.startswith("[") and int(ranges.split("-")[0]) <= slot <= int(ranges.split("-")[-1]):
                    port = int(fields[1].split(":")[1].split("@")[0])
                    return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no master serves slot {slot}")

    def migrate_slot(self, slot: int, target: RedisServer, *, keys_per_step: int = 5, pause: float = 0.02) -> int:
        """Move a slot to another master as redis-cli --cluster reshard does (SETSLOT IMPORTING
        and MIGRATING, MIGRATE the keys a few at a time, SETSLOT NODE), slowly enough for
        clients to meet ASK and TRYAGAIN on the way; the keys moved."""
        source = self.owner(slot)
        source_id, target_id = self.node_id(source), self.node_id(target)
        self.call(target, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
        self.call(source, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
        moved = 0
        while True:
            keys = self.call(source, "CLUSTER", "GETKEYSINSLOT", str(slot), str(keys_per_step)).split()
            if not keys:
                break
            self.call(source, "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause)
        for node in (target, source, *(m for m in self.masters() if m not in (source, target))):
            self.call(node, "CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        return moved

    def flush(self) -> None:
        for node in self.masters():
            self.call(node, "FLUSHALL")

    @staticmethod
    def call(node: RedisServer, *args: str) -> str:
        """One command through redis-cli (whose replies, unlike RedisServer.command's, may span lines)."""
        done = subprocess.run(
            [shutil.which("redis-cli"), "-p", str(node.port), *args], check=True, capture_output=True, timeout=10
        )
        return done.stdout.decode()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


def _tls_args(tls: TlsFiles, port: int) -> tuple[str, ...]:
    return (
        "--tls-port", str(port),
        "--tls-cert-file", str(tls.cert),
        "--tls-key-file", str(tls.key),
        "--tls-ca-cert-file", str(tls.ca),
        "--tls-client-cert-file", str(tls.client_cert),
        "--tls-client-key-file", str(tls.client_key),
        "--tls-cluster", "yes",
        "--tls-replication", "yes",
        "--tls-auth-clients", "no",
    )  # fmt: skip
