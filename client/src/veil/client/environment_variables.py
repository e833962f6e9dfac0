"""The environment variables a Reporter reads, in its constructor (never at import time).

An explicit constructor argument wins over the variable, and the variable over the default.
A variable that does not parse is logged and ignored (the default applies); an explicit
argument that is invalid raises ConfigError.
"""

from __future__ import annotations

__all__ = [
    "VEIL_ENDPOINT",
    "VEIL_TRANSPORT",
    "VEIL_TOKEN",
    "VEIL_TLS",
    "VEIL_CA_FILE",
    "VEIL_CLIENT_CERT",
    "VEIL_CLIENT_KEY",
    "VEIL_QUEUE_DIR",
    "VEIL_MAX_QUEUE_SIZE",
    "VEIL_MAX_BATCH_SIZE",
    "VEIL_SCHEDULE_DELAY_MS",
    "VEIL_EXPORT_TIMEOUT_MS",
    "VEIL_SPEC_TTL_MS",
    "VEIL_MAX_DISK_BYTES",
    "VEIL_RETRY_INITIAL_BACKOFF_MS",
    "VEIL_RETRY_MAX_BACKOFF_MS",
]

VEIL_ENDPOINT = "VEIL_ENDPOINT"
"""The aggregator: its gRPC address, ``host:port``, or the URL of its HTTP listener,
``https://host[:port]`` (``http://`` for plaintext). No default: a Reporter needs one."""

VEIL_TRANSPORT = "VEIL_TRANSPORT"
"""``grpc`` or ``http``. Default: ``http`` for an ``http://`` or ``https://`` endpoint, else
``grpc`` (which needs ``pip install 'veil[grpc]'``); ``http`` with ``host:port`` reports to
``https://host:port`` (``http://`` when TLS is off)."""

VEIL_TOKEN = "VEIL_TOKEN"
"""A bearer token sent as ``authorization: Bearer <token>`` (gRPC call metadata or HTTP header).
Default: none."""

VEIL_TLS = "VEIL_TLS"
"""``true`` or ``false``: whether to use TLS, for a ``host:port`` endpoint (a URL's scheme says).
Default ``true`` (system roots unless a CA is given), but ``false`` on loopback unless a CA file or
client certificate is given."""

VEIL_CA_FILE = "VEIL_CA_FILE"
"""A PEM file of root certificates to trust instead of the system roots. Default: system roots."""

VEIL_CLIENT_CERT = "VEIL_CLIENT_CERT"
"""A PEM client certificate chain for mutual TLS (with VEIL_CLIENT_KEY). Default: none."""

VEIL_CLIENT_KEY = "VEIL_CLIENT_KEY"
"""The PEM private key of VEIL_CLIENT_CERT. Default: none."""

VEIL_QUEUE_DIR = "VEIL_QUEUE_DIR"
"""A directory for the device secret, the memo store, the spec cache and unsent batches, so
they survive restarts. Default: none (everything in memory)."""

VEIL_MAX_QUEUE_SIZE = "VEIL_MAX_QUEUE_SIZE"
"""The most randomized reports held in memory awaiting upload; beyond it the newest reports
are dropped and counted. Default 2048."""

VEIL_MAX_BATCH_SIZE = "VEIL_MAX_BATCH_SIZE"
"""The most reports in one upload. Default 512."""

VEIL_SCHEDULE_DELAY_MS = "VEIL_SCHEDULE_DELAY_MS"
"""The longest a report waits before it is batched and sent, in milliseconds. Default 5000."""

VEIL_EXPORT_TIMEOUT_MS = "VEIL_EXPORT_TIMEOUT_MS"
"""The deadline of one gRPC call (over HTTP: of each connect, send and read), in milliseconds.
Default 10000."""

VEIL_SPEC_TTL_MS = "VEIL_SPEC_TTL_MS"
"""How long fetched metric specs are fresh, in milliseconds; then they are fetched again (and
still used while fetching fails). Default 3600000 (one hour)."""

VEIL_MAX_DISK_BYTES = "VEIL_MAX_DISK_BYTES"
"""The most bytes of unsent batches kept under the queue directory; beyond it new batches are
dropped and counted. Default 16777216 (16 MiB)."""

VEIL_RETRY_INITIAL_BACKOFF_MS = "VEIL_RETRY_INITIAL_BACKOFF_MS"
"""The first retry's backoff ceiling, in milliseconds; it doubles per failure, with full jitter.
Default 1000."""

VEIL_RETRY_MAX_BACKOFF_MS = "VEIL_RETRY_MAX_BACKOFF_MS"
"""The largest backoff ceiling between retries, in milliseconds. Default 60000."""
