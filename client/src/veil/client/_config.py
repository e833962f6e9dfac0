"""Reporter settings: explicit argument, then the VEIL_* environment variable, then the default.

Read in the Reporter's constructor, never at import time. An explicit argument that is
invalid raises ConfigError; an environment variable that does not parse is logged (its name,
never its value) and the default applies, as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import environment_variables as env
from ._errors import ConfigError
from ._log import logger

__all__ = ["Config", "resolve_config", "RETRY_HORIZON_SECONDS"]

RETRY_HORIZON_SECONDS = 24 * 3600
"""A batch not acknowledged within this many seconds of its creation is dropped and counted as
failed. The aggregator must remember batch ids (its dedupe TTL) for at least this long, so a
late retry is never counted twice."""

_DEFAULT_MAX_QUEUE_SIZE = 2048
_DEFAULT_MAX_BATCH_SIZE = 512
_DEFAULT_SCHEDULE_DELAY_MS = 5000
_DEFAULT_EXPORT_TIMEOUT_MS = 10_000
_DEFAULT_SPEC_TTL_MS = 3_600_000
_DEFAULT_MAX_DISK_BYTES = 16 * 1024 * 1024
_DEFAULT_RETRY_INITIAL_BACKOFF_MS = 1000
_DEFAULT_RETRY_MAX_BACKOFF_MS = 60_000

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


_TRANSPORTS = ("grpc", "http")


@dataclass(frozen=True)
class Config:
    endpoint: str  # gRPC: host:port; HTTP: the aggregator's URL (http:// or https://, no trailing /)
    transport: str  # "grpc" or "http"
    token: str | None
    tls: bool
    root_certificates: bytes | None
    client_cert: bytes | None
    client_key: bytes | None
    client_cert_files: tuple[str, str] | None  # (certificate, key) paths: the ssl module reads files
    queue_dir: Path | None
    max_queue_size: int
    max_batch_size: int
    schedule_delay: float  # seconds
    export_timeout: float  # seconds
    spec_ttl: float  # seconds
    max_disk_bytes: int
    backoff_initial: float  # seconds
    backoff_max: float  # seconds

    @property
    def loopback(self) -> bool:
        """True when the endpoint names this machine (a token in clear then stays local)."""
        return is_loopback(urllib.parse.urlsplit(self.endpoint).netloc if "://" in self.endpoint else self.endpoint)


def is_loopback(address: str) -> bool:
    """True when host:port (or a bare host) names this machine only; a name other than
    localhost, "" or 0.0.0.0 may be reachable from elsewhere. The aggregator and the CLI ask
    the same question of their own addresses."""
    host = address.rpartition(":")[0].strip("[]") or address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _from_env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value not in (None, "") else None


def _integer(arg_name: str, explicit: object, environ: Mapping[str, str], var: str, default: int, minimum: int) -> int:
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < minimum:
            raise ConfigError(f"{arg_name} must be a whole number of at least {minimum}.")
        return explicit
    raw = _from_env(environ, var)
    if raw is not None:
        try:
            value = int(raw.strip())
        except ValueError:
            value = minimum - 1
        if value >= minimum:
            return value
        logger.warning("Ignoring %s: it must be a whole number of at least %d; using %d.", var, minimum, default)
    return default


def _flag(arg_name: str, explicit: object, environ: Mapping[str, str], var: str, default: bool) -> bool:
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise ConfigError(f"{arg_name} must be True or False.")
        return explicit
    raw = _from_env(environ, var)
    if raw is not None:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        logger.warning("Ignoring %s: it must be true or false; using %s.", var, str(default).lower())
    return default


def _text(arg_name: str, explicit: object, environ: Mapping[str, str], var: str) -> str | None:
    if explicit is not None:
        if not isinstance(explicit, (str, os.PathLike)) or not str(os.fspath(explicit)):
            raise ConfigError(f"{arg_name} must be a non-empty string.")
        return str(os.fspath(explicit))
    return _from_env(environ, var)


def _read(arg_name: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError:
        raise ConfigError(f"The {arg_name} file cannot be read.") from None


def _url(endpoint: str, transport: str, explicit_tls: object) -> tuple[str, bool]:
    """An http:// or https:// endpoint without its trailing slash, and whether it is TLS (its
    scheme says: VEIL_TLS does not apply, and a tls= that contradicts it is an error)."""
    parts = urllib.parse.urlsplit(endpoint)
    if transport != "http" or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "An endpoint URL must be http://host[:port] or https://host[:port], over HTTP "
            "(a gRPC endpoint is host:port)."
        )
    if parts.query or parts.fragment:
        raise ConfigError("An endpoint URL takes no query or fragment.")
    tls = parts.scheme == "https"
    if explicit_tls is not None and explicit_tls != tls:
        raise ConfigError(f"tls={explicit_tls} contradicts the endpoint's scheme, {parts.scheme}://.")
    return endpoint.rstrip("/"), tls


def resolve_config(environ: Mapping[str, str] | None = None, **explicit: object) -> Config:
    """The settings of one Reporter from its explicit arguments (None meaning "not given")."""
    environ = os.environ if environ is None else environ
    endpoint = _text("endpoint", explicit.get("endpoint"), environ, env.VEIL_ENDPOINT)
    if endpoint is None:
        raise ConfigError(f"A Reporter needs an endpoint: pass endpoint= or set {env.VEIL_ENDPOINT}.")
    transport = _text("transport", explicit.get("transport"), environ, env.VEIL_TRANSPORT)
    if transport is not None and transport.lower() not in _TRANSPORTS:
        if explicit.get("transport") is not None:
            raise ConfigError('transport must be "grpc" or "http".')
        logger.warning('Ignoring %s: it must be "grpc" or "http".', env.VEIL_TRANSPORT)
        transport = None
    transport = transport.lower() if transport else ("http" if "://" in endpoint else "grpc")
    token = _text("token", explicit.get("token"), environ, env.VEIL_TOKEN)
    if token is not None and not all(0x20 < ord(c) < 0x7F for c in token):
        raise ConfigError("The token must be printable ASCII without spaces.")
    ca_file = _text("ca_file", explicit.get("ca_file"), environ, env.VEIL_CA_FILE)
    cert_file = _text("client_cert", explicit.get("client_cert"), environ, env.VEIL_CLIENT_CERT)
    key_file = _text("client_key", explicit.get("client_key"), environ, env.VEIL_CLIENT_KEY)
    if (cert_file is None) != (key_file is None):
        raise ConfigError("A client certificate and its key must be given together.")
    if "://" in endpoint:
        endpoint, tls = _url(endpoint, transport, explicit.get("tls"))
    else:
        # TLS unless the endpoint is this machine and nothing asks for TLS: the local demo serves
        # plaintext on loopback, where TLS would fail with nothing but an SSL version error.
        default_tls = not is_loopback(endpoint) or ca_file is not None or cert_file is not None
        tls = _flag("tls", explicit.get("tls"), environ, env.VEIL_TLS, default_tls)
        if transport == "http":  # host:port over HTTP: the scheme TLS says
            endpoint = f"{'https' if tls else 'http'}://{endpoint}"
    if not tls and (ca_file or cert_file):
        raise ConfigError("A CA file or client certificate needs tls=True (an https:// endpoint over HTTP).")
    queue_dir = _text("queue_dir", explicit.get("queue_dir"), environ, env.VEIL_QUEUE_DIR)

    def integer(arg_name: str, var: str, default: int, minimum: int) -> int:
        return _integer(arg_name, explicit.get(arg_name), environ, var, default, minimum)

    max_queue_size = integer("max_queue_size", env.VEIL_MAX_QUEUE_SIZE, _DEFAULT_MAX_QUEUE_SIZE, 1)
    max_batch_size = integer("max_batch_size", env.VEIL_MAX_BATCH_SIZE, _DEFAULT_MAX_BATCH_SIZE, 1)
    schedule_delay = integer("schedule_delay_ms", env.VEIL_SCHEDULE_DELAY_MS, _DEFAULT_SCHEDULE_DELAY_MS, 1)
    export_timeout = integer("export_timeout_ms", env.VEIL_EXPORT_TIMEOUT_MS, _DEFAULT_EXPORT_TIMEOUT_MS, 1)
    spec_ttl = integer("spec_ttl_ms", env.VEIL_SPEC_TTL_MS, _DEFAULT_SPEC_TTL_MS, 1)
    max_disk = integer("max_disk_bytes", env.VEIL_MAX_DISK_BYTES, _DEFAULT_MAX_DISK_BYTES, 0)
    backoff_initial = integer(
        "retry_initial_backoff_ms", env.VEIL_RETRY_INITIAL_BACKOFF_MS, _DEFAULT_RETRY_INITIAL_BACKOFF_MS, 1
    )
    backoff_max = integer("retry_max_backoff_ms", env.VEIL_RETRY_MAX_BACKOFF_MS, _DEFAULT_RETRY_MAX_BACKOFF_MS, 1)
    return Config(
        endpoint=endpoint,
        transport=transport,
        token=token,
        tls=tls,
        root_certificates=_read("ca_file", ca_file),
        client_cert=_read("client_cert", cert_file),
        client_key=_read("client_key", key_file),
        client_cert_files=(cert_file, key_file) if cert_file is not None and key_file is not None else None,
        queue_dir=Path(queue_dir) if queue_dir is not None else None,
        max_queue_size=max_queue_size,
        max_batch_size=min(max_batch_size, max_queue_size),
        schedule_delay=schedule_delay / 1000,
        export_timeout=export_timeout / 1000,
        spec_ttl=spec_ttl / 1000,
        max_disk_bytes=max_disk,
        backoff_initial=backoff_initial / 1000,
        backoff_max=max(backoff_max, backoff_initial) / 1000,
    )
