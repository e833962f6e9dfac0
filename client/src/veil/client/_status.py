"""The status policy of docs/protocol.md section 5, by gRPC status name, for both transports.

A status is its gRPC name ("OK", "UNAVAILABLE", ...): the gRPC transport names a call's status,
a BatchResult's code number is named by CODE_NAMES, and the HTTP transport names an HTTP status
by HTTP_NAMES (404 and 405 to POST /v1/uploads are UNIMPLEMENTED: a revision-1 aggregator). Only
what can never succeed with the same bytes is FINAL (the batch fails; a stale spec,
FAILED_PRECONDITION, also refetches the specs; TOO_LATE, reports older than the aggregator's
lateness, is counted as too_late). A refused token (TOKEN_REFUSED) is an operator's config error
that can be fixed, so its batches wait with backoff like any other retryable status: UNAVAILABLE,
a store refusing writes, CANCELLED by a draining server, INTERNAL, UNKNOWN, an HTTP status the
table does not name...
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "OK",
    "STALE_SPEC",
    "TOO_LATE",
    "UNIMPLEMENTED",
    "FINAL",
    "TOKEN_REFUSED",
    "TRANSPORT_MADE",
    "CODE_NAMES",
    "HTTP_NAMES",
    "http_name",
    "hint_seconds",
    "Refusal",
]

OK = "OK"
STALE_SPEC = "FAILED_PRECONDITION"
TOO_LATE = "OUT_OF_RANGE"
UNIMPLEMENTED = "UNIMPLEMENTED"

# The HTTP-only final answers (no gRPC status): oversize, an unserved method, an unknown body type.
_OVERSIZE, _METHOD_NOT_ALLOWED, _UNSUPPORTED_MEDIA_TYPE = "OVERSIZE", "METHOD_NOT_ALLOWED", "UNSUPPORTED_MEDIA_TYPE"

FINAL = frozenset({"INVALID_ARGUMENT", STALE_SPEC, TOO_LATE, _OVERSIZE, _METHOD_NOT_ALLOWED, _UNSUPPORTED_MEDIA_TYPE})
TOKEN_REFUSED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})
# Statuses a client's own transport makes up (no connection, a deadline, a reset): their details
# name addresses and hosts, which the SDK never logs, so only the status name is kept.
TRANSPORT_MADE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})

# gRPC status numbers (a BatchResult's code) -> names.
CODE_NAMES = {
    number: name
    for number, name in enumerate(
        (
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        )
    )
}

# An upload's HTTP status -> the status it stands for (docs/protocol.md section 5's table).
HTTP_NAMES = {
    200: OK,
    304: OK,
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: UNIMPLEMENTED,
    405: _METHOD_NOT_ALLOWED,
    409: STALE_SPEC,
    410: TOO_LATE,
    413: _OVERSIZE,
    415: _UNSUPPORTED_MEDIA_TYPE,
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def http_name(status: int) -> str:
    """The status an HTTP status stands for; one the table does not name is retried (HTTP_502...)."""
    return HTTP_NAMES.get(status, f"HTTP_{status}")


_MAX_RETRY_HINT = 300.0  # seconds: a retry-after-ms hint beyond this is not believed


def hint_seconds(value: str | bytes) -> float:
    """Seconds an aggregator's retry-after-ms hint asks to wait (0 when it does not parse)."""
    try:
        return min(max(int(value) / 1000.0, 0.0), _MAX_RETRY_HINT)
    except ValueError:
        return 0.0


class Refusal(NamedTuple):
    """What a failed call says: its status name (None when it names none), the aggregator's
    retry-after-ms hint in seconds (0 when none), and a short detail for the log."""

    name: str | None
    hint: float
    detail: str
