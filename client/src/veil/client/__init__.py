"""veil.client: the Veil SDK. Randomize on the device, batch, send, retry; never break the app.

    from veil.client import Reporter

    reporter = Reporter("https://aggregator.example.com", token="...", queue_dir="/var/lib/myapp/veil")
    reporter.report("browser", "firefox")
    reporter.report("load_ms", 412.7)  # a numeric metric: a number

An http:// or https:// endpoint reports over HTTP (standard library and protobuf only); a
host:port endpoint over gRPC (grpcio: ``pip install 'veil[grpc]'``, imported by the Reporter that
uses it). Importing it loads no grpc, numpy, numba or redis.
Settings fall back to the environment variables of ``veil.client.environment_variables``.
"""

from ._config import RETRY_HORIZON_SECONDS, is_loopback
from ._counters import Counters
from ._encoding import encode_batch, encode_batches
from ._errors import ConfigError, InvalidNumberError, ReporterError, UnknownCategoryError, UnknownMetricError
from ._ledger import PrivacySpent
from ._reporter import Reporter
from ._specs import numeric_to_proto, spec_from_proto, spec_to_proto
from ._status import FINAL, TOKEN_REFUSED

__all__ = [
    "Reporter",
    "Counters",
    "PrivacySpent",
    "ReporterError",
    "ConfigError",
    "UnknownMetricError",
    "UnknownCategoryError",
    "InvalidNumberError",
    "RETRY_HORIZON_SECONDS",
    "spec_from_proto",
    "spec_to_proto",
    "numeric_to_proto",
    # For tools that speak the protocol beside the Reporter (veil simulate, the aggregator's checks):
    "encode_batch",
    "encode_batches",
    "is_loopback",
    "FINAL",  # status names (grpc.StatusCode names, and HTTP-only final ones) the SDK never retries
    "TOKEN_REFUSED",
]
