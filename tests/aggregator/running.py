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
from config_toml import LOAD, config_toml
from redis_server import free_port

from veil.aggregator.config import parse_config
from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

# These tests load the aggregator through few Reporters that stand for many devices, so their
# metrics let one device send up to LOAD reports a day (config_toml.LOAD).
METRICS = [
    {"name": "browser", "labels": ["chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "other"],
     "mechanism": "subset", "epsilon": 1.0, "windows": ["total", "1h"], "reports_per_period": LOAD},
    {"name": "os", "labels": ["android", "ios", "windows", "macos", "linux", "other"], "mechanism": "krr",
     "epsilon": 2.0, "reports_per_period": LOAD},
    {"name": "opted_in", "labels": ["no", "yes"], "mechanism": "warner", "epsilon": 1.0, "reports_per_period": LOAD},
    {"name": "crash_screen", "labels": [f"screen-{i}" for i in range(8)], "mechanism": "rappor", "epsilon": 2.0,
     "reports_per_period": LOAD},
    {"name": "feature", "labels": [f"f{i}" for i in range(8)], "mechanism": "rappor-admissible", "epsilon": 2.0,
     "reports_per_period": LOAD},
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

    def __init__(self, directory: Path, store_url: str, *, sections: dict | None = None,
                 credentials: grpc.ChannelCredentials | None = None, server: dict | None = None) -> None:
        """sections: more tables of the config file (e.g. tls, auth); server: more [server] keys
        (e.g. processes, a fixed http address); credentials: how to reach a TLS listener when
        waiting for it to start."""
        self.grpc_port = free_port()
        self.config = directory / "veil.toml"
        self.log = directory / "serve.log"
        self.config.write_text(config_toml({**config_dict(store_url, self.grpc_port, **(server or {})),
                                      **(sections or {})}))
        self.config.chmod(0o600)  # tokens inline make it a secrets file
        self.credentials = credentials
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> ServeProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "veil.aggregator", "--config", str(self.config)],
                                            stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        channel = (grpc.secure_channel(self.endpoint, self.credentials) if self.credentials
                   else grpc.insecure_channel(self.endpoint))
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


class InProcessAggregators:
    """Starts in-process Aggregators on configs of config_dict(); stop_all() stops them all."""

    def __init__(self) -> None:
        self._started: list = []

    def start(self, store_url: str = "memory", *, sections: dict | None = None,
              clock: Callable[[], float] | None = None, **server: object):
        """A started Aggregator; sections adds tables to the config (e.g. {"tls": ..., "auth": ...}),
        clock replaces the wall clock its estimates and windows go by."""
        from veil.aggregator.config import parse_config
        from veil.aggregator.daemon import Aggregator

        config = parse_config({**config_dict(store_url, **server), **(sections or {})})
        aggregator = Aggregator(config) if clock is None else Aggregator(config, clock=clock)
        aggregator.start()
        self._started.append(aggregator)
        return aggregator

    def stop_all(self) -> None:
        for aggregator in self._started:
            aggregator.stop(grace=0)


def collector(endpoint: str) -> veil_pb2_grpc.CollectorStub:
    return veil_pb2_grpc.CollectorStub(grpc.insecure_channel(endpoint))


def estimates(endpoint: str, metric: str = "", window: str = "") -> veil_pb2.EstimatesResponse:
    stub = veil_pb2_grpc.EstimatesStub(grpc.insecure_channel(endpoint))
    return stub.Get(veil_pb2.EstimatesRequest(metric=metric, window=window), timeout=10)


def finish_reporters(threads, reporters) -> list:
    """Join the load threads, flush and shut down every Reporter; their final counters, after
    checking that none dropped or failed a report."""
    for thread in threads:
        thread.join()
    for reporter in reporters:
        assert reporter.force_flush(60), reporter.counters()
    counters = [r.counters() for r in reporters]
    for reporter in reporters:
        reporter.shutdown(5)
    assert all(c.dropped == 0 and c.failed == 0 for c in counters), counters
    return counters


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


SPEC_NAMES = tuple(m["name"] for m in METRICS)


# -- TLS and tokens (test_auth.py, test_tls.py, test_ratelimit.py) ---------------------------------

UPLOAD_TOKEN = "upload-token-app-a-0123456789abcdef"  # may report browser and os
OTHER_UPLOAD_TOKEN = "upload-token-app-b-fedcba9876543210"  # may report crash_screen only
READ_TOKEN = "read-token-dashboard-00112233445566"
TOKENS = (UPLOAD_TOKEN, OTHER_UPLOAD_TOKEN, READ_TOKEN)


def auth_section(**options: object) -> dict:
    """An [auth] table with two apps' upload tokens and a dashboard's read token."""
    return {
        "upload_tokens": [{"name": "app-a", "token": UPLOAD_TOKEN, "metrics": ["browser", "os"]},
                          {"name": "app-b", "token": OTHER_UPLOAD_TOKEN, "metrics": ["crash_screen"]}],
        "read_tokens": [{"name": "dashboard", "token": READ_TOKEN}],
        **options,
    }


class Pki:
    """A throwaway PKI made in a directory: a CA, a server certificate for 127.0.0.1 and
    localhost, a client certificate from the CA, and an unrelated second CA with a client
    certificate of its own. EC P-256 keys, written owner-only; nothing is committed."""

    def __init__(self, directory: Path) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)

        def name(common: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

        def certificate(subject, key, issuer, issuer_key, *, ca: bool, usage=None, sans=None, days: int = 30):
            builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(min(now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days - 1)))
                       .not_valid_after(now + datetime.timedelta(days=days))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
            if ca:
                builder = builder.add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                    decipher_only=False), critical=True)
            if usage:
                builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            return builder.sign(issuer_key, hashes.SHA256())

        def write(filename: str, data: bytes, private: bool = False) -> Path:
            path = directory / filename
            path.write_bytes(data)
            path.chmod(0o600 if private else 0o644)
            return path

        def pem_key(key) -> bytes:
            return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        def pem(cert) -> bytes:
            return cert.public_bytes(serialization.Encoding.PEM)

        import ipaddress

        ca_key, other_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = certificate(name("veil test CA"), ca_key, name("veil test CA"), ca_key, ca=True)
        other_ca = certificate(name("unrelated CA"), other_ca_key, name("unrelated CA"), other_ca_key, ca=True)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = certificate(name("veil aggregator"), server_key, ca.subject, ca_key, ca=False,
                             usage=ExtendedKeyUsageOID.SERVER_AUTH,
                             sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        client_key, other_client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        client = certificate(name("device"), client_key, ca.subject, ca_key, ca=False,
                             usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        other_client = certificate(name("device"), other_client_key, other_ca.subject, other_ca_key, ca=False,
                                   usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        self.ca = write("ca.crt", pem(ca))
        self.other_ca = write("other-ca.crt", pem(other_ca))
        self.server_cert = write("server.crt", pem(server))
        self.server_key = write("server.key", pem_key(server_key), private=True)
        self.client_cert = write("client.crt", pem(client))
        self.client_key = write("client.key", pem_key(client_key), private=True)
        self.other_client_cert = write("other-client.crt", pem(other_client))
        self.other_client_key = write("other-client.key", pem_key(other_client_key), private=True)
        self._issue = (certificate, name, ca, ca_key, pem, pem_key, ec, ExtendedKeyUsageOID, x509, ipaddress)

    def tls_section(self, mutual: bool = False) -> dict:
        section = {"cert_file": str(self.server_cert), "key_file": str(self.server_key)}
        return {**section, "client_ca_file": str(self.ca)} if mutual else section

    def reissue_server(self, common_name: str, *, days: int = 30, key_mode: int = 0o600) -> None:
        """Replace the server certificate and key (a rotation) with new ones from the same CA,
        valid for `days` from now (negative: expired that many days ago), the key of mode `key_mode`."""
        certificate, name, ca, ca_key, pem, pem_key, ec, usage, x509, ipaddress = self._issue
        key = ec.generate_private_key(ec.SECP256R1())
        cert = certificate(name(common_name), key, ca.subject, ca_key, ca=False, usage=usage.SERVER_AUTH,
                           sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                           days=days)
        for path, data, mode in ((self.server_key, pem_key(key), key_mode), (self.server_cert, pem(cert), 0o600)):
            temporary = path.with_suffix(".new")
            temporary.write_bytes(data)
            temporary.chmod(mode)
            temporary.replace(path)  # atomic, as cert-manager and certbot do

    def channel_credentials(self, *, client: str | None = None, ca: Path | None = None) -> grpc.ChannelCredentials:
        """TLS credentials trusting `ca` (default the PKI's CA); with client="good" or "other",
        presenting that client certificate."""
        certs = {"good": (self.client_cert, self.client_key), "other": (self.other_client_cert, self.other_client_key),
                 None: (None, None)}[client]
        return grpc.ssl_channel_credentials(
            root_certificates=(ca or self.ca).read_bytes(),
            private_key=certs[1].read_bytes() if certs[1] else None,
            certificate_chain=certs[0].read_bytes() if certs[0] else None)

    def ssl_context(self, *, client: str | None = None):
        """An ssl.SSLContext for HTTPS to the aggregator, optionally with a client certificate."""
        import ssl

        context = ssl.create_default_context(cafile=str(self.ca))
        if client == "good":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif client == "other":
            context.load_cert_chain(self.other_client_cert, self.other_client_key)
        return context


def specs_of(metrics: list[dict]) -> dict[str, MetricSpec]:
    """The MetricSpecs an aggregator serves for these [[metrics]] tables, through its own config
    parser (so period, reports_per_period and budgets are read as it reads them)."""
    config = parse_config({"metrics": metrics})
    return {m.name: m.spec for m in config.metrics}


def make_upload(metric: str, n: int, *, batch_id: bytes | None = None, seed: int = 1) -> veil_pb2.UploadRequest:
    """A valid batch of n randomized reports of `metric` (one of METRICS), as the SDK encodes it."""
    import random

    from veil.client._encoding import encode_batch
    from veil.mechanism import SeededRandomSource

    spec = specs_of(METRICS)[metric]
    source = SeededRandomSource(seed)
    reports = [spec.mechanism.randomize(i % spec.k, source) for i in range(n)]
    return veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, batch_id or random.randbytes(16)))


def counted(aggregator, metric: str) -> int:
    """Reports counted in the metric's total window, read from the aggregator's store directly
    (past any access checks)."""
    return next(e.n for e in aggregator.live.current(metric, "total"))


def bearer(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None
