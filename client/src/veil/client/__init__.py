"""veil.client: the Veil SDK. Randomize on the device, batch, send, retry; never break the app.

    from veil.client import Reporter

    reporter = Reporter("aggregator.example.com:443", token="...", queue_dir="/var/lib/myapp/veil")
    reporter.report("browser", "firefox")

Standard library, grpcio and protobuf only: importing it loads no numpy, numba or redis.
Settings fall back to the environment variables of ``veil.client.environment_variables``.
"""

from ._config import RETRY_HORIZON_SECONDS, is_loopback
from ._counters import Counters
from ._encoding import encode_batch, encode_batches
from ._errors import ConfigError, ReporterError, UnknownCategoryError, UnknownMetricError
from ._ledger import PrivacySpent
from ._reporter import Reporter
from ._specs import spec_from_proto, spec_to_proto
from ._transport import FINAL, TOKEN_REFUSED

__all__ = [
    "Reporter",
    "Counters",
    "PrivacySpent",
    "ReporterError",
    "ConfigError",
    "UnknownMetricError",
    "UnknownCategoryError",
    "RETRY_HORIZON_SECONDS",
    "spec_from_proto",
    "spec_to_proto",
    # For tools that speak the protocol beside the Reporter (veil simulate, the aggregator's checks):
    "encode_batch",
    "encode_batches",
    "is_loopback",
    "FINAL",
    "TOKEN_REFUSED",
]
