"""TLS for the listeners: the same certificate, key and client CA serve gRPC and HTTP.

    files = ServerTls(config.tls)
    grpc_server.add_secure_port(address, files.grpc_credentials())
    context = files.ssl_context()           # for each new HTTP connection: the current files

The files are read again when they change on disk (checked at most once a second, at a new
connection), so a rotated certificate (cert-manager, certbot) is served without a restart.
A rotation caught half-written, or to a certificate that has expired (or is not yet valid),
keeps the last good files and logs an error. A change of mode alone (a key made owner-only
with chmod after a refused rotation) counts as a change.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ._secrets import check_private_file
from .errors import ConfigError

__all__ = ["TlsConfig", "TlsFiles", "ServerTls", "load_tls"]

log = logging.getLogger("veil.aggregator")

_RECHECK_SECONDS = 1.0


@dataclass(frozen=True)
class TlsConfig:
    """TLS for both listeners; mutual TLS (client certificates required) with client_ca_file."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None


@dataclass(frozen=True)
class TlsFiles:
    cert_chain: bytes
    key: bytes
    client_ca: bytes | None
    not_after: datetime.datetime  # the leaf certificate's expiry (UTC)


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{key}: cannot read {path} ({err.strerror or err}).") from None


def load_tls(config: TlsConfig) -> TlsFiles:
    """Read and check the files: a PEM certificate chain, its unencrypted PEM key (the two
    matching), a PEM CA bundle. A ConfigError names the key at fault."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    chain = _read(config.cert_file, "tls.cert_file")
    key = _read(config.key_file, "tls.key_file")
    try:
        certificates = x509.load_pem_x509_certificates(chain)
    except ValueError:
        raise ConfigError(f"tls.cert_file: {config.cert_file} holds no PEM certificate.") from None
    leaf, now = certificates[0], datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc <= now:
        raise ConfigError(
            f"tls.cert_file: the certificate in {config.cert_file} expired on "
            f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC."
        )
    if leaf.not_valid_before_utc > now:
        raise ConfigError(
            f"tls.cert_file: the certificate in {config.cert_file} is not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC."
        )
    try:
        serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"tls.key_file: {config.key_file} is not an unencrypted PEM private key.") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The stdlib loads from files only; the bytes already read are what gets checked.
        _load_chain(context, chain, key)
    except ssl.SSLError:
        raise ConfigError(
            f"tls.key_file: {config.key_file} is not the key of the certificate in tls.cert_file ({config.cert_file})."
        ) from None
    client_ca = None
    if config.client_ca_file is not None:
        client_ca = _read(config.client_ca_file, "tls.client_ca_file")
        try:
            x509.load_pem_x509_certificates(client_ca)
            context.load_verify_locations(cadata=client_ca.decode("ascii"))
        except (ValueError, ssl.SSLError, UnicodeDecodeError):
            raise ConfigError(f"tls.client_ca_file: {config.client_ca_file} holds no PEM CA certificate.") from None
    return TlsFiles(chain, key, client_ca, leaf.not_valid_after_utc)


def _load_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """SSLContext.load_cert_chain from bytes, through a private temporary file (the key never
    lands anywhere others may read)."""

    fd, name = tempfile.mkstemp(prefix="veil-tls-", suffix=".pem")  # created 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(chain.rstrip(b"\n") + b"\n" + key)
        context.load_cert_chain(name)
    finally:
        os.unlink(name)


def _ssl_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, files.cert_chain, files.key)
    if files.client_ca is not None:
        context.load_verify_locations(cadata=files.client_ca.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ServerTls:
    """The current TLS files, as gRPC server credentials and as an ssl.SSLContext."""

    def __init__(self, config: TlsConfig, files: TlsFiles | None = None) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._files = files or load_tls(config)
        self._version = 0
        self._stamps = self._mtimes()
        self._checked = time.monotonic()
        self._context = _ssl_context(self._files)
        self._context_version = 0

    @property
    def mutual(self) -> bool:
        return self.config.mutual

    @property
    def not_after(self) -> datetime.datetime:
        return self._files.not_after

    def _mtimes(self) -> tuple[tuple[int, int], ...]:
        paths = (self.config.cert_file, self.config.key_file, self.config.client_ca_file)
        stamps = []
        for path in paths:
            try:
                info = path.stat() if path else None
                # ctime too: chmod changes it and not the mtime.
                stamps.append((info.st_mtime_ns, info.st_ctime_ns) if info else (0, 0))
            except OSError:
                stamps.append((-1, -1))
        return tuple(stamps)

    def _refresh(self) -> tuple[TlsFiles, int]:
        """The current files and their version, reading them again when they changed."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= _RECHECK_SECONDS:
                self._checked = now
                stamps = self._mtimes()
                if stamps != self._stamps:
                    try:
                        check_private_file(self.config.key_file, "tls.key_file")
                        files = load_tls(self.config)
                    except ConfigError as err:
                        log.error(
                            "TLS files changed but cannot be used; serving the previous ones",
                            extra={"problem": str(err)},
                        )
                    else:
                        self._files, self._version = files, self._version + 1
                        log.info("TLS files reloaded", extra={"not_after": files.not_after.isoformat()})
                    self._stamps = stamps  # a broken rotation is looked at again when it changes
            return self._files, self._version

    def grpc_credentials(self):
        import grpc

        def configuration(files: TlsFiles):
            return grpc.ssl_server_certificate_configuration(
                [(files.key, files.cert_chain)], root_certificates=files.client_ca
            )

        served = [self._version]

        def fetch():  # called by gRPC before each new connection's handshake: cheap when unchanged
            files, version = self._refresh()
            if version == served[0]:
                return None
            served[0] = version
            return configuration(files)

        return grpc.dynamic_ssl_server_credentials(
            configuration(self._files), fetch, require_client_authentication=self.mutual
        )

    def ssl_context(self) -> ssl.SSLContext:
        files, version = self._refresh()
        if version != self._context_version:
            context = _ssl_context(files)
            with self._lock:
                self._context, self._context_version = context, version
        return self._context
