"""TLS with a given CA and a client certificate; fork (over both transports); the SDK's import
weight."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys

import grpc
import pytest
from loopback_collector import FAST, CollectorServer

from veil.client import Counters, Reporter

HEAVY = ("numpy", "numba", "redis", "scipy", "cryptography")
# grpcio before 1.80 cannot open a channel in a child forked from a process that used gRPC (the
# docs/sdk.md, "Processes"); `make test-oldest` runs these tests on such a grpcio.
fork_safe_grpc = pytest.mark.skipif(
    tuple(int(part) for part in grpc.__version__.split(".")[:2]) < (1, 80),
    reason=f"grpcio {grpc.__version__} cannot open a channel in a forked child (1.80 can)",
)


@pytest.fixture(params=[pytest.param("grpc", marks=fork_safe_grpc), "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """The fork tests run over both transports (an HTTP child opens its own connection and thread)."""
    return request.param


def _certificates(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def make(name, issuer=None, issuer_key=None, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert, key, cert.public_bytes(serialization.Encoding.PEM), pem_key

    ca, ca_key, ca_pem, _ = make("veil test CA", ca=True)
    _, _, server_pem, server_key = make(
        "localhost",
        ca.subject,
        ca_key,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    _, _, client_pem, client_key = make("device", ca.subject, ca_key)
    paths = {}
    for name, data in dict(
        ca=ca_pem, server=server_pem, server_key=server_key, client=client_pem, client_key=client_key
    ).items():
        paths[name] = tmp_path / f"{name}.pem"
        paths[name].write_bytes(data)
    return paths


@pytest.fixture
def tls_collector(state, tmp_path):
    paths = _certificates(tmp_path)
    credentials = grpc.ssl_server_credentials(
        [(paths["server_key"].read_bytes(), paths["server"].read_bytes())],
        root_certificates=paths["ca"].read_bytes(),
        require_client_auth=True,
    )
    server = CollectorServer(state, credentials)
    server.start()
    yield server, paths
    server.stop()


def test_mutual_tls_with_a_given_ca_and_a_bearer_token(tls_collector, state):
    server, paths = tls_collector
    state.token = "tls-token"
    settings = {**FAST, "tls": True}
    with Reporter(
        server.endpoint,
        token="tls-token",
        ca_file=paths["ca"],
        client_cert=paths["client"],
        client_key=paths["client_key"],
        **{k: v for k, v in settings.items() if k != "tls"},
    ) as reporter:
        assert reporter.wait_for_specs(10)
        reporter.report("browser", "edge")
        assert reporter.force_flush(10)
    assert state.total("browser") == 1
    # Without the client certificate, or trusting only the system roots, the handshake fails.
    for extra in ({"ca_file": paths["ca"]}, {}):
        with Reporter(
            server.endpoint, token="tls-token", **extra, **{k: v for k, v in settings.items() if k != "tls"}
        ) as refused:
            assert not refused.wait_for_specs(0.5)


def test_a_forked_child_reports_through_its_own_channel(ready_reporter, state):
    reporter = ready_reporter()
    reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    reporter.report("country", "c1")  # queued in the parent at fork time: the child must not send it
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            for _ in range(5):
                reporter.report("opt_in", "yes")
            ok = reporter.force_flush(10)
            counters = reporter.counters()
            code = 0 if ok and counters == Counters(accepted=5, sent=5) else 2
            reporter.shutdown(5)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reporter.force_flush(10)
    assert state.total("opt_in") == 5 and state.total("country") == 1 and state.total("browser") == 1
    reporter.report("browser", "edge")  # the parent is unharmed
    assert reporter.force_flush(10) and state.total("browser") == 2


@pytest.mark.parametrize(
    "endpoint, heavy", [("127.0.0.1:1", HEAVY), ("http://127.0.0.1:1", (*HEAVY, "grpc"))], ids=["grpc", "http"]
)
def test_a_reporters_life_loads_nothing_heavy(endpoint, heavy):
    code = (
        "import sys, veil.client as c\n"
        f"r = c.Reporter({endpoint!r}, tls=False); r.report('m', 'v'); r.shutdown(1)\n"
        f"print(','.join(x for x in {heavy!r} if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_forked_child_shares_the_device_memo_with_its_parent(ready_reporter, state, tmp_path):
    reporter = ready_reporter(queue_dir=tmp_path)
    reporter.report("page", "p1")  # memoized before the fork: the child inherits it
    assert reporter.force_flush(10)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            reporter.report("page", "p1")
            reporter.report("page", "p40")  # first drawn in the child, appended under the file lock
            code = 0 if reporter.force_flush(10) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reporter.report("page", "p40")  # the parent finds the child's response instead of drawing one
    assert reporter.force_flush(10)
    assert sorted(state.distinct("page").values()) == [2, 2]
