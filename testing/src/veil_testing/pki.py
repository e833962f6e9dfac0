"""A throwaway PKI for TLS tests: a CA, server and client certificates, made in a directory."""

from __future__ import annotations

from pathlib import Path

import grpc

__all__ = ["Pki"]


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
        now = datetime.datetime.now(datetime.UTC)

        def name(common: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

        def certificate(subject, key, issuer, issuer_key, *, ca: bool, usage=None, sans=None, days: int = 30):
            builder = (
                x509.CertificateBuilder()
                .subject_name(subject)
                .issuer_name(issuer)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(min(now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days - 1)))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            )
            if ca:
                builder = builder.add_extension(
                    x509.KeyUsage(
                        digital_signature=True,
                        key_cert_sign=True,
                        crl_sign=True,
                        content_commitment=False,
                        key_encipherment=False,
                        data_encipherment=False,
                        key_agreement=False,
                        encipher_only=False,
                        decipher_only=False,
                    ),
                    critical=True,
                )
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
            return key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )

        def pem(cert) -> bytes:
            return cert.public_bytes(serialization.Encoding.PEM)

        import ipaddress

        ca_key, other_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = certificate(name("veil test CA"), ca_key, name("veil test CA"), ca_key, ca=True)
        other_ca = certificate(name("unrelated CA"), other_ca_key, name("unrelated CA"), other_ca_key, ca=True)

        def issue_server(common_name: str, days: int = 30) -> tuple[bytes, bytes]:
            """A new server key and certificate from the CA, for localhost and 127.0.0.1 (PEM)."""
            key = ec.generate_private_key(ec.SECP256R1())
            cert = certificate(
                name(common_name),
                key,
                ca.subject,
                ca_key,
                ca=False,
                usage=ExtendedKeyUsageOID.SERVER_AUTH,
                sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                days=days,
            )
            return pem_key(key), pem(cert)

        server_key, server = issue_server("veil aggregator")
        client_key, other_client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        client = certificate(
            name("device"), client_key, ca.subject, ca_key, ca=False, usage=ExtendedKeyUsageOID.CLIENT_AUTH
        )
        other_client = certificate(
            name("device"),
            other_client_key,
            other_ca.subject,
            other_ca_key,
            ca=False,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        self.ca = write("ca.crt", pem(ca))
        self.other_ca = write("other-ca.crt", pem(other_ca))
        self.server_cert = write("server.crt", server)
        self.server_key = write("server.key", server_key, private=True)
        self.client_cert = write("client.crt", pem(client))
        self.client_key = write("client.key", pem_key(client_key), private=True)
        self.other_client_cert = write("other-client.crt", pem(other_client))
        self.other_client_key = write("other-client.key", pem_key(other_client_key), private=True)
        self._issue_server = issue_server

    def tls_section(self, mutual: bool = False) -> dict:
        section = {"cert_file": str(self.server_cert), "key_file": str(self.server_key)}
        return {**section, "client_ca_file": str(self.ca)} if mutual else section

    def reissue_server(self, common_name: str, *, days: int = 30, key_mode: int = 0o600) -> None:
        """Replace the server certificate and key (a rotation) with new ones from the same CA,
        valid for `days` from now (negative: expired that many days ago), the key of mode `key_mode`."""
        key, cert = self._issue_server(common_name, days)
        for path, data, mode in ((self.server_key, key, key_mode), (self.server_cert, cert, 0o600)):
            temporary = path.with_suffix(".new")
            temporary.write_bytes(data)
            temporary.chmod(mode)
            temporary.replace(path)  # atomic, as cert-manager and certbot do

    def channel_credentials(self, *, client: str | None = None, ca: Path | None = None) -> grpc.ChannelCredentials:
        """TLS credentials trusting `ca` (default the PKI's CA); with client="good" or "other",
        presenting that client certificate."""
        certs = {
            "good": (self.client_cert, self.client_key),
            "other": (self.other_client_cert, self.other_client_key),
            None: (None, None),
        }[client]
        return grpc.ssl_channel_credentials(
            root_certificates=(ca or self.ca).read_bytes(),
            private_key=certs[1].read_bytes() if certs[1] else None,
            certificate_chain=certs[0].read_bytes() if certs[0] else None,
        )

    def ssl_context(self, *, client: str | None = None):
        """An ssl.SSLContext for HTTPS to the aggregator, optionally with a client certificate."""
        import ssl

        context = ssl.create_default_context(cafile=str(self.ca))
        if client == "good":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif client == "other":
            context.load_cert_chain(self.other_client_cert, self.other_client_key)
        return context
