"""The Collector over HTTP (docs/protocol.md, section 5): an adapter of the ingest core.

    POST /v1/upload    one batch (Collector/Upload)
    POST /v1/uploads   several batches (Collector/UploadBatches)
    GET /v1/specs      the specs (Collector/GetMetricSpecs); ETag, If-None-Match -> 304

The same calls as gRPC's, through the same parts: the access policy's token, rate limits and
upload checks (_access.Access: admit_unread before the body is read, then admit_read, for both
upload paths alike), then the ingest core (ingest.Ingest). A refusal (_access.Denied) is
answered with the HTTP status of ingest.STATUSES, the retry-after-ms hint as a header (and
Retry-After in seconds). Bodies are binary protobuf (application/x-protobuf) or the proto3 JSON mapping
(application/json, the default when no Content-Type is sent); any other Content-Type is 415,
before the token is checked. Refusals are JSON {"error", "code"}.
"""

from __future__ import annotations

import json
import math

from google.protobuf import json_format
from google.protobuf.message import Message

from veil.wire.v1 import veil_pb2

from ._access import RETRY_AFTER_KEY, SPECS, UPLOAD, UPLOAD_BATCHES, Access, Denied
from ._budget import BUDGET_REFUSAL, BUDGET_RETRY_MS, Reservation
from ._upload_json import parse_batches_json, parse_upload_json
from .decode import parse_batches, parse_upload
from .ingest import STATUSES, Ingest, Outcome, http_status

__all__ = ["HttpCollector", "PROTOBUF", "UPLOAD_PATHS"]

PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
UPLOAD_PATHS = ("/v1/upload", "/v1/uploads")

Answer = tuple[int, str, bytes, dict]


def _media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


class HttpCollector:
    def __init__(self, access: Access, ingest: Ingest) -> None:
        self._access, self._ingest = access, ingest

    def admit(self, path: str, authorization: list[str], content_type: str) -> tuple[str, None] | tuple[None, Answer]:
        """A POST of one of UPLOAD_PATHS before its body is read: its media type, then its token
        and upload rate. The token's name (for reservation and upload), or the refusal."""
        media = _media_type(content_type)
        if media not in ("", _JSON, PROTOBUF):
            return None, _refused(
                "unsupported_media_type",
                f"Send the body as {PROTOBUF} or {_JSON} (proto3 JSON), not {content_type[:64]!r}.",
            )
        try:
            return self._access.admit_unread(_method(path), authorization).name, None
        except Denied as denied:
            return None, _refusal(denied)

    def reservation(self, name: str) -> Reservation:
        """The in-flight budget the body of an upload admitted as `name` is read within."""
        return self._access.reservation(name)

    @staticmethod
    def budget_refusal() -> Answer:
        """The answer to an upload that found no room in the budget: 429, retry after a second."""
        return _refusal(Denied("RESOURCE_EXHAUSTED", BUDGET_REFUSAL, BUDGET_RETRY_MS))

    def upload(self, path: str, name: str, content_type: str, body: bytes) -> Answer:
        """The POST of one of UPLOAD_PATHS admitted as token `name`, its body read whole."""
        binary = _media_type(content_type) == PROTOBUF
        batches = path == "/v1/uploads"
        request: Message | bytes
        if binary:
            request = parse_batches(body) if batches else parse_upload(body)
        else:  # the body itself when not a valid message: the access checks answer it
            request = parse_batches_json(body) if batches else parse_upload_json(body)
        try:  # read whole before the call: one that leaves retries the same id
            admitted = self._access.admit_read(self._access.named(_method(path), name), request)
        except Denied as denied:
            return _refusal(denied)
        if isinstance(admitted, veil_pb2.UploadBatchesRequest):
            answer: Message | Outcome = self._ingest.upload_batches(admitted)
        else:
            answer = self._one(admitted)
        if isinstance(answer, Outcome):  # refused by the core
            return _refused(answer)
        if binary:
            return 200, PROTOBUF, answer.SerializeToString(), {}
        return _json(200, _as_dict(answer))

    def _one(self, request: veil_pb2.UploadRequest) -> veil_pb2.UploadResponse | Outcome:
        outcome = self._ingest.upload(request)
        return self._ingest.response(outcome) if outcome.counted else outcome

    def current(self, if_none_match: str) -> bool:
        """Whether If-None-Match names the current specs version: specs() then answers 304 (once
        the token is checked), which costs little enough to answer on the listener's loop."""
        return _matches(if_none_match, f'"{self._ingest.specs_version}"')

    def specs(self, authorization: list[str], metrics: list[str], accept: str, if_none_match: str = "") -> Answer:
        """GET /v1/specs: 304 when If-None-Match names the current version (its ETag)."""
        etag = f'"{self._ingest.specs_version}"'
        try:  # still the token's to ask: a 304 tells no more than an unchanged answer would
            identity = self._access.admit_unread(SPECS, authorization)
        except Denied as denied:
            return _refusal(denied)
        if_version = self._ingest.specs_version if _matches(if_none_match, etag) else ""
        response = self._access.scoped_specs(self._ingest.specs(metrics, if_version), identity)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if response.unchanged:
            return 304, _JSON, b"", headers
        if _media_type(accept) == PROTOBUF:
            return 200, PROTOBUF, response.SerializeToString(), headers
        return 200, _JSON, json_format.MessageToJson(response, indent=None).encode(), headers

    @staticmethod
    def oversize(limit: int) -> Answer:
        """The answer to a body above the upload size limit (413, final)."""
        return _refused(
            "oversize",
            f"The body is larger than the largest valid upload ({limit} bytes: server.max_batch reports); "
            "it is not counted, do not retry it: split the batch.",
        )


def _matches(if_none_match: str, etag: str) -> bool:
    """Whether an If-None-Match header names this ETag (weak or strong), or is *."""
    tags = [t.strip() for t in if_none_match.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags if t)


def _as_dict(response: Message) -> dict:
    """The proto3 JSON of a response, its zero-valued fields included (clients need not know
    the mapping's defaults)."""
    if isinstance(response, veil_pb2.UploadResponse):
        return {"accepted": response.accepted, "duplicate": response.duplicate, "specsVersion": response.specs_version}
    assert isinstance(response, veil_pb2.UploadBatchesResponse)
    return {
        "results": [
            {"code": r.code, "message": r.message, "accepted": r.accepted, "duplicate": r.duplicate}
            for r in response.results
        ],
        "specsVersion": response.specs_version,
    }


def _json(status: int, body: dict, headers: dict | None = None) -> Answer:
    return status, _JSON, json.dumps(body).encode(), headers or {}


def _refused(outcome: Outcome | str, message: str = "") -> Answer:
    """The refusal of an ingest Outcome, or of a STATUSES row by name, as JSON."""
    if isinstance(outcome, str):
        outcome = Outcome(STATUSES[outcome], message)
    status = outcome.status
    assert status.http is not None
    return _json(status.http, {"error": outcome.message, **({"code": status.grpc} if status.grpc else {})})


def _method(path: str) -> str:
    """The Collector method one of UPLOAD_PATHS is."""
    return UPLOAD_BATCHES if path == "/v1/uploads" else UPLOAD


def _refusal(denied: Denied) -> Answer:
    """The refusal as JSON, whatever the request's format: it is for people and logs."""
    headers = {}
    if denied.retry_after_ms is not None:
        headers[RETRY_AFTER_KEY] = str(denied.retry_after_ms)
        headers["Retry-After"] = str(math.ceil(denied.retry_after_ms / 1000))
    if denied.code == "UNAUTHENTICATED":
        headers["WWW-Authenticate"] = 'Bearer realm="veil"'
    return _json(http_status(denied.code), {"error": denied.message, "code": denied.code}, headers)
