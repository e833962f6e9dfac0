"""How the worker talks to an aggregator, whatever the wire: gRPC (_grpc, the `veil[grpc]`
extra, imported only when chosen) or HTTP (_http, the standard library's http.client).

Both send the stored UploadRequest bytes as they are (no re-encoding), so a retried batch is
byte for byte the batch first sent, batch id included, and both return a call in flight, so the
worker keeps batching (and spooling) reports while one is. A failed call's status is named
by the transport's ``refusal`` and handled by the policy of _status, the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from veil.wire.v1 import veil_pb2

from ._config import Config
from ._errors import ConfigError
from ._status import Refusal

__all__ = ["Call", "Transport", "open_transport"]

_Response = TypeVar("_Response", covariant=True)


class Call(Protocol[_Response]):
    """A call in flight (a grpc.Future or a concurrent.futures.Future)."""

    def add_done_callback(self, fn: Callable[[Any], None], /) -> None: ...

    def result(self, timeout: float | None = None) -> _Response: ...


class Transport(Protocol):
    batches: bool  # False once the aggregator answered UploadBatches UNIMPLEMENTED (revision 1)

    def fetch_specs(self, timeout: float, if_version: str = "") -> Call[veil_pb2.GetMetricSpecsResponse]: ...

    def upload(self, payload: bytes, timeout: float) -> Call[veil_pb2.UploadResponse]: ...

    def upload_batches(self, payload: bytes, timeout: float) -> Call[veil_pb2.UploadBatchesResponse]: ...

    def refusal(self, error: BaseException) -> Refusal: ...

    def close(self) -> None: ...

    def forget(self) -> None: ...


def open_transport(config: Config) -> Transport:
    """The transport of the config's endpoint (not connected yet)."""
    if config.transport == "http":
        from ._http import HttpTransport

        return HttpTransport(config)
    try:
        from ._grpc import GrpcTransport
    except ImportError:
        raise ConfigError(
            f"Reporting to {config.endpoint} over gRPC needs grpcio: pip install 'veil[grpc]', "
            "or report over HTTP (an http:// or https:// endpoint)."
        ) from None
    return GrpcTransport(config)
