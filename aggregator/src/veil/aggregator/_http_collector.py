"""The Collector over HTTP (docs/protocol.md, section 5): POST /v1/upload and GET /v1/specs.

The same calls as gRPC's, through the same parts: the AccessInterceptor's token, rate limits
and upload checks (admit_upload_unread before the body is read, then admit_upload; admit_specs),
then the CollectorService itself. Those end a
refused call with context.abort; here a CallContext turns that into the HTTP status of the
documented table, with the retry-after-ms hint as a header (and Retry-After in seconds).
Bodies are binary protobuf (application/x-protobuf) or the proto3 JSON mapping (the default).
"""

from __future__ import annotations

import json
import math

import grpc
from google.protobuf import json_format

from veil.wire.v1 import veil_pb2

from ._auth import BUDGET_REFUSAL, BUDGET_RETRY_MS, RETRY_AFTER_KEY, AccessInterceptor, Reservation
from ._calls import CallContext, Refused
from .decode import parse_upload
from .service import CollectorService

__all__ = ["HttpCollector", "PROTOBUF", "STATUS"]

PROTOBUF = "application/x-protobuf"

STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INTERNAL: 500,
}

Answer = tuple[int, str, bytes, dict]


def _wants_protobuf(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == PROTOBUF


class HttpCollector:
    def __init__(self, access: AccessInterceptor, collector: CollectorService) -> None:
        self._access, self._collector = access, collector

    def admit(self, authorization: list[str]) -> tuple[str, None] | tuple[None, Answer]:
        """An upload before its body is read: its token and upload rate. The token's name (for
        reservation and upload), or the refusal."""
        context = CallContext()
        try:
            return self._access.admit_upload_unread(authorization, context), None
        except Refused as refused:
            return None, _refusal(refused, context)

    def reservation(self, name: str) -> Reservation:
        """The in-flight budget the body of an upload admitted as `name` is read within."""
        return self._access.reservation(name)

    @staticmethod
    def budget_refusal() -> Answer:
        """The answer to an upload that found no room in the budget: 429, retry after a second."""
        context = CallContext()
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(BUDGET_RETRY_MS)),))
        return _refusal(Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, BUDGET_REFUSAL), context)

    def upload(self, name: str, content_type: str, body: bytes) -> Answer:
        """The upload admitted as token `name`, its body read."""
        binary = _wants_protobuf(content_type)
        if binary:
            request = parse_upload(body)
        else:
            try:
                request = json_format.Parse(body, veil_pb2.UploadRequest())
            except (json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError):
                request = body  # the interceptor answers it: not a valid UploadRequest
        context = CallContext()  # read whole before the call: one that leaves retries the same id
        try:
            response = self._access.admit_upload(self._collector.Upload, name, request, context)
        except Refused as refused:
            return _refusal(refused, context)
        if binary:
            return 200, PROTOBUF, response.SerializeToString(), {}
        return _json(200, {"accepted": response.accepted, "duplicate": response.duplicate})

    def specs(self, authorization: list[str], metrics: list[str], accept: str) -> Answer:
        binary = _wants_protobuf(accept)
        context = CallContext()
        try:
            response = self._access.admit_specs(
                self._collector.GetMetricSpecs, authorization, veil_pb2.GetMetricSpecsRequest(metrics=metrics), context
            )
        except Refused as refused:
            return _refusal(refused, context)
        if binary:
            return 200, PROTOBUF, response.SerializeToString(), {}
        return 200, "application/json", json_format.MessageToJson(response, indent=None).encode(), {}


def _json(status: int, body: dict, headers: dict | None = None) -> Answer:
    return status, "application/json", json.dumps(body).encode(), headers or {}


def _refusal(refused: Refused, context: CallContext) -> Answer:
    """The refusal as JSON, whatever the request's format: it is for people and logs."""
    headers = {}
    for key, value in context.trailers:
        if key == RETRY_AFTER_KEY:
            headers[RETRY_AFTER_KEY] = value
            headers["Retry-After"] = str(math.ceil(int(value) / 1000))
    if refused.code == grpc.StatusCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="veil"'
    return _json(STATUS.get(refused.code, 500), {"error": refused.message, "code": refused.code.name}, headers)
