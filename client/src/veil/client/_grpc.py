"""The gRPC transport: one channel per process (never reused across fork), TLS and bearer token.
Imported only when a Reporter chooses gRPC (grpcio is the `veil[grpc]` extra).

Uploads send the stored UploadRequest bytes as they are (no re-encoding), so a retried batch
is byte for byte the batch first sent, batch id included. Calls return futures, so the worker
keeps batching (and spooling) reports while one is in flight.

Several batches travel in one UploadBatches call (revision 2); a revision-1 aggregator answers
it UNIMPLEMENTED, and the channel then sends one Upload per batch for as long as it lives
(``batches`` is False; a new channel, after fork or close, asks again).
"""

from __future__ import annotations

import grpc

from veil.wire.v1 import veil_pb2

from ._config import Config
from ._status import TRANSPORT_MADE, Refusal, hint_seconds

__all__ = ["GrpcTransport"]

_SERVICE = "/veil.wire.v1.Collector/"
_USER_AGENT = "veil-client/0.1"
_RETRY_AFTER_KEY = "retry-after-ms"  # the aggregator's hint on a rate-limited upload


class GrpcTransport:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._metadata = (("authorization", f"Bearer {config.token}"),) if config.token else None
        self._channel: grpc.Channel | None = None
        self._get_specs: (
            grpc.UnaryUnaryMultiCallable[veil_pb2.GetMetricSpecsRequest, veil_pb2.GetMetricSpecsResponse] | None
        ) = None
        self._upload: grpc.UnaryUnaryMultiCallable[bytes, veil_pb2.UploadResponse] | None = None
        self._upload_batches: grpc.UnaryUnaryMultiCallable[bytes, veil_pb2.UploadBatchesResponse] | None = None
        self.batches = True  # False once this channel's aggregator answered UploadBatches UNIMPLEMENTED

    def _connect(self) -> None:
        config = self._config
        initial_ms = max(1, int(config.backoff_initial * 1000))
        options = [
            ("grpc.primary_user_agent", _USER_AGENT),
            # Reconnect no slower than the upload backoff, so a restarted aggregator is found.
            ("grpc.initial_reconnect_backoff_ms", initial_ms),
            ("grpc.max_reconnect_backoff_ms", max(initial_ms, int(config.backoff_max * 1000))),
        ]
        if config.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=config.root_certificates,
                private_key=config.client_key,
                certificate_chain=config.client_cert,
            )
            channel = grpc.secure_channel(config.endpoint, credentials, options=options)
        else:
            channel = grpc.insecure_channel(config.endpoint, options=options)
        self._get_specs = channel.unary_unary(
            _SERVICE + "GetMetricSpecs",
            request_serializer=veil_pb2.GetMetricSpecsRequest.SerializeToString,
            response_deserializer=veil_pb2.GetMetricSpecsResponse.FromString,
        )
        self._upload = channel.unary_unary(
            _SERVICE + "Upload",
            request_serializer=None,  # the payload is already a serialized UploadRequest
            response_deserializer=veil_pb2.UploadResponse.FromString,
        )
        self._upload_batches = channel.unary_unary(
            _SERVICE + "UploadBatches",
            request_serializer=None,  # serialized by encode_batches from the stored batches
            response_deserializer=veil_pb2.UploadBatchesResponse.FromString,
        )
        self._channel = channel
        self.batches = True

    def fetch_specs(self, timeout: float, if_version: str = "") -> grpc.Future[veil_pb2.GetMetricSpecsResponse]:
        """A future of the GetMetricSpecsResponse (``unchanged`` when ``if_version`` is current)."""
        if self._channel is None:
            self._connect()
        assert self._get_specs is not None
        request = veil_pb2.GetMetricSpecsRequest(if_version=if_version)
        return self._get_specs.future(request, timeout=timeout, metadata=self._metadata)

    def upload(self, payload: bytes, timeout: float) -> grpc.Future[veil_pb2.UploadResponse]:
        """A future of the UploadResponse."""
        if self._channel is None:
            self._connect()
        assert self._upload is not None
        return self._upload.future(payload, timeout=timeout, metadata=self._metadata)

    def upload_batches(self, payload: bytes, timeout: float) -> grpc.Future[veil_pb2.UploadBatchesResponse]:
        """A future of the UploadBatchesResponse of a serialized UploadBatchesRequest."""
        if self._channel is None:
            self._connect()
        assert self._upload_batches is not None
        return self._upload_batches.future(payload, timeout=timeout, metadata=self._metadata)

    @staticmethod
    def refusal(error: BaseException) -> Refusal:
        """A failed call's status name, retry-after-ms hint and details."""
        name, hint, detail = None, 0.0, ""
        try:
            name = error.code().name  # type: ignore[attr-defined]
            if name not in TRANSPORT_MADE:  # the aggregator's own message (it names no address)
                detail = error.details() or ""  # type: ignore[attr-defined]
            for key, value in error.trailing_metadata() or ():  # type: ignore[attr-defined]
                if key == _RETRY_AFTER_KEY:
                    hint = hint_seconds(value)
        except Exception:  # noqa: BLE001 (not a call, or one that says less: what it said)
            pass
        return Refusal(name, hint, detail)

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def forget(self) -> None:
        """Drop the channel without closing it: in a forked child it belongs to the parent."""
        self._channel = self._get_specs = self._upload = self._upload_batches = None
