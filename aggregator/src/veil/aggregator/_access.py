"""Who may call what: bearer tokens, their scopes and rate limits. The policy alone, for both
listeners: the gRPC interceptor (_interceptor) and the HTTP collector (_http_collector) ask it and
translate its refusals (Denied: a gRPC status name, a message, maybe a retry hint) into their own.

    Collector/GetMetricSpecs   an upload token (answered with the specs of its metrics only)
                               or a read token (every spec)
    Collector/Upload           an upload token whose metrics include the request's metric
    Collector/UploadBatches    an upload token whose metrics include every batch's metric
    Estimates/Get, Watch, Series  a read token
    grpc.health.v1, reflection open (probes, grpcurl)

A missing, malformed or unknown token is UNAUTHENTICATED; a known token used for what it does
not grant (a read token uploading, an upload token reading, a metric outside its scope) is
PERMISSION_DENIED. Tokens arrive as `authorization: Bearer <token>` (gRPC metadata or an HTTP
header). Only SHA-256 digests are kept; a presented token's digest is compared with every
configured digest by hmac.compare_digest, so neither a token's length nor its position in the
config shows in the time taken. Logs, errors and metrics carry a token's name, never its value.

An upload's checks, in this order: the token (admit_unread, before the message is read), its
upload rate (one upload), its reservation of the in-flight budget (reservation, _budget: the
share rule), then once the message is read (admit_read): an undeclared metric goes on to the
ingest core (FAILED_PRECONDITION, as for every caller), a declared metric outside the token's
scope is PERMISSION_DENIED; then the token's report rate, charged with the reports the payload
holds (decode.reports_held), not the count it claims. UploadBatches passes the same checks as
one upload, with its batches' reports together, one upload of the upload rate per batch (the
rest taken once it is read), and one declared metric outside the token's scope refusing the
whole call. Nothing of a refused call is written.

With no tokens configured, authentication is off: every call is `anonymous`.

Tokens can be replaced while serving (`Access.reload`, on SIGHUP in `veil serve`): a call is
checked against the tokens of the moment it arrives. Turning authentication on or off takes a
restart, so that no reload can open a server by leaving its tokens out.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Mapping
from typing import NoReturn

from prometheus_client import CollectorRegistry, Counter

from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2

from ._budget import ByteBudget, Reservation
from ._ratelimit import RateLimiter
from .config import AuthConfig, TokenConfig, token_digest
from .decode import UNPARSEABLE, reports_held
from .errors import ConfigError, quoted

__all__ = [
    "ANONYMOUS",
    "Access",
    "Authenticator",
    "Denied",
    "Limits",
    "OPEN",
    "RETRY_AFTER_KEY",
    "SPECS",
    "UPLOAD",
    "UPLOAD_BATCHES",
    "UPLOADS",
    "token_limits",
]

ANONYMOUS = TokenConfig("anonymous", "any", b"")
RETRY_AFTER_KEY = "retry-after-ms"  # the retry hint: gRPC trailing metadata, an HTTP header

OPEN = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
SPECS = "/veil.wire.v1.Collector/GetMetricSpecs"
UPLOAD = "/veil.wire.v1.Collector/Upload"
UPLOAD_BATCHES = "/veil.wire.v1.Collector/UploadBatches"
UPLOADS = frozenset({UPLOAD, UPLOAD_BATCHES})
_READ = frozenset({"/veil.wire.v1.Estimates/Get", "/veil.wire.v1.Estimates/Watch", "/veil.wire.v1.Estimates/Series"})
_BEARER = "bearer "

# A token's limits: (reports per second, report burst, uploads per second, upload burst).
Limits = tuple[float, float, float, float]
Upload = veil_pb2.UploadRequest | veil_pb2.UploadBatchesRequest  # an upload's message, parsed


class Denied(Exception):
    """A call refused: `code` the gRPC status name (a row of ingest.STATUSES gives its HTTP
    status), `message` for the caller (never a token's value), `retry_after_ms` the retry hint
    when there is one."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after_ms = code, message, retry_after_ms


class Authenticator:
    """Finds the configured token a presented one matches, in constant time."""

    def __init__(self, auth: AuthConfig) -> None:
        self._tokens = tuple(auth.tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def replace(self, auth: AuthConfig) -> None:
        """Know auth's tokens from now on, instead of the ones before (one assignment: a check
        sees either set whole). ConfigError, and nothing changes, when that would turn
        authentication on or off."""
        if auth.enabled != self.enabled:
            state = "on" if self.enabled else "off"
            raise ConfigError(
                f"auth: authentication is {state} and a reload cannot turn it "
                f"{'off' if self.enabled else 'on'}; restart the aggregator for that."
            )
        self._tokens = tuple(auth.tokens)

    def identify(self, token: str) -> TokenConfig | None:
        digest = token_digest(token)
        found = None
        for candidate in self._tokens:  # every one, whichever matches
            match = hmac.compare_digest(digest, candidate.digest)
            found = candidate if match else found
        return found

    def named(self, name: str) -> TokenConfig | None:
        """The token of this name among those known now (ANONYMOUS with authentication off)."""
        if not self.enabled:
            return ANONYMOUS if name == ANONYMOUS.name else None
        return next((t for t in self._tokens if t.name == name), None)

    def from_bearer(self, values: list[str]) -> tuple[TokenConfig | None, str]:
        """The token of an `authorization` header or metadata (its every value), or None and
        why not. The reason never repeats what was sent."""
        if not values:
            return None, "No token: send `authorization: Bearer <token>`."
        if len(values) > 1:
            return None, "More than one authorization entry; send one."
        value = values[0]
        if not value[: len(_BEARER)].lower() == _BEARER:
            return None, "The authorization is not a bearer token: send `authorization: Bearer <token>`."
        token = self.identify(value[len(_BEARER) :].strip())
        return (token, "") if token else (None, "Unknown token.")


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def token_limits(auth: AuthConfig) -> dict[str, Limits]:
    """Each upload token's limits by name; with authentication off, the anonymous one's."""
    limits = {
        t.name: (t.rate_limit, t.rate_burst, t.upload_rate_limit, t.upload_rate_burst) for t in auth.of_role("upload")
    }
    if not auth.enabled:
        limits[ANONYMOUS.name] = (
            auth.anonymous_rate_limit,
            auth.anonymous_rate_burst,
            auth.anonymous_upload_rate_limit,
            auth.anonymous_upload_rate_burst,
        )
    return limits


def _reports(limits: Mapping[str, Limits]) -> dict[str, tuple[float, float]]:
    return {name: (rate, burst) for name, (rate, burst, _, _) in limits.items()}


def _uploads(limits: Mapping[str, Limits]) -> dict[str, tuple[float, float]]:
    return {name: (rate, burst) for name, (_, _, rate, burst) in limits.items()}


def _needed(method: str) -> str | None:
    """The role a method needs ("any": either), None for a method this table does not know:
    refused (fail closed)."""
    if method in UPLOADS:
        return "upload"
    if method == SPECS:
        return "any"
    if method in _READ:
        return "read"
    return None


class Access:
    def __init__(
        self,
        auth: AuthConfig,
        *,
        metrics: Mapping[str, MetricSpec | None],
        upload_bytes: int,
        budget: ByteBudget,
        limits: Mapping[str, Limits] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """metrics: the declared metrics' specs by name (None for a strings metric's rounds,
        whose specs change with the period); upload_bytes: what each read reserves
        of the budget (the largest valid upload); budget: with its share per token (_budget);
        limits: token_limits of this process's share."""
        self.authenticator = Authenticator(auth)
        limits = token_limits(auth) if limits is None else limits
        self._report_limiter = RateLimiter(_reports(limits))
        self._upload_limiter = RateLimiter(_uploads(limits))
        self._metrics = dict(metrics)
        self.upload_bytes = upload_bytes
        self.budget = budget
        registry = registry if registry is not None else CollectorRegistry()
        self._refused = Counter(
            "veil_calls_refused",
            "gRPC calls refused before their handler, by method and code.",
            ["method", "code"],
            registry=registry,
        )
        self._admitted = Counter(
            "veil_token_reports",
            "Reports in uploads admitted past authentication and rate limits (before validation), by token name.",
            ["token"],
            registry=registry,
        )
        self._limited = Counter(
            "veil_token_reports_rate_limited",
            "Reports in uploads refused by the rate limit, by token name.",
            ["token"],
            registry=registry,
        )

    def reload(self, auth: AuthConfig, limits: Mapping[str, Limits]) -> None:
        """Check calls against auth's tokens, and limit them by `limits` (token_limits of this
        process's share), from the next call on; calls in progress finish as they started.
        ConfigError, and nothing changes, when that would turn authentication on or off."""
        self.authenticator.replace(auth)
        self._report_limiter.set_limits(_reports(limits))
        self._upload_limiter.set_limits(_uploads(limits))

    def deny(self, method: str, code: str, message: str, retry_after_ms: int | None = None) -> NoReturn:
        """Count a refusal of `method` in veil_calls_refused and raise it."""
        self._refused.labels(method, code).inc()
        raise Denied(code, message, retry_after_ms)

    def identify(self, method: str, authorization: list[str]) -> TokenConfig:
        """Who calls `method` with these authorization values (its every value); Denied when
        no token, or one that does not grant it."""
        if not self.authenticator.enabled:
            return ANONYMOUS
        identity, problem = self.authenticator.from_bearer(authorization)
        if identity is None:
            self.deny(method, "UNAUTHENTICATED", problem)
        needed = _needed(method)
        if needed is None:
            self.deny(method, "PERMISSION_DENIED", f"No token grants {method}.")
        if needed != "any" and identity.role != needed:
            self.deny(
                method,
                "PERMISSION_DENIED",
                f"Token {identity.name!r} is {_a(identity.role)} token; this call needs {_a(needed)} token.",
            )
        return identity

    def holder(self, name: str) -> str | None:
        """Whose share of the budget a call of token `name` takes: none with authentication off,
        where callers cannot be told apart (_budget)."""
        return name if self.authenticator.enabled else None

    def reservation(self, name: str) -> Reservation:
        """The in-flight budget for a message token `name` reads (its share, see _budget)."""
        return Reservation(self.budget, self.upload_bytes, self.holder(name))

    def admit_unread(self, method: str, authorization: list[str]) -> TokenConfig:
        """The checks of a call before its message is read: its token, and for an upload one
        of the token's upload rate."""
        identity = self.identify(method, authorization)
        if method in UPLOADS:
            self.take_upload(identity)
        return identity

    def take_upload(self, identity: TokenConfig, n: int = 1) -> None:
        """n uploads of the token's upload rate, or Denied with its retry hint."""
        name = identity.name
        wait = self._upload_limiter.take(name, n)
        if wait > 0:
            limit = self._upload_limiter.limit(name)
            assert limit is not None  # a wait comes from a limit
            rate, burst = limit
            self._rate_limited(
                wait, f"Upload rate limit of token {name!r}: {rate:g} uploads per second, bursts of {burst:g}"
            )

    def named(self, method: str, name: str) -> TokenConfig:
        """The token admit_unread named, once the message is read (UNAUTHENTICATED when a reload
        has withdrawn it meanwhile)."""
        identity = self.authenticator.named(name)
        if identity is None:
            self.deny(method, "UNAUTHENTICATED", f"Token {name!r} was withdrawn by a reload.")
        return identity

    def admit_read(
        self, identity: TokenConfig, request: Upload | bytes, active: Callable[[], bool] | None = None
    ) -> Upload:
        """The rest of an upload's checks once its message is read (an UploadRequest, or an
        UploadBatchesRequest whose batches are checked together; its bytes when it does not
        parse), then the message, admitted. `active`: whether the caller still waits (one gone
        is CANCELLED: nothing is written, its retry carries the same id)."""
        name = identity.name
        if isinstance(request, bytes):
            self.deny(UPLOAD, "INVALID_ARGUMENT", UNPARSEABLE)
        batches = request.batches if isinstance(request, veil_pb2.UploadBatchesRequest) else (request,)
        if len(batches) > 1:
            # Each batch leaves its id in the store: the call's first was taken before reading.
            self.take_upload(identity, len(batches) - 1)
        for batch in batches:
            if identity.role == "upload" and batch.metric in self._metrics and batch.metric not in identity.metrics:
                self.deny(UPLOAD, "PERMISSION_DENIED", f"Token {name!r} may not report metric {quoted(batch.metric)}.")
        if active is not None and not active():
            self.deny(UPLOAD, "CANCELLED", "The call ended before the batch was counted.")
        held = sum(reports_held(batch, self._metrics.get(batch.metric)) for batch in batches)
        wait = self._report_limiter.take(name, held)
        if wait > 0:
            self._limited.labels(name).inc(held)
            limit = self._report_limiter.limit(name)
            assert limit is not None  # a wait comes from a limit
            rate, burst = limit
            self._rate_limited(wait, f"Rate limit of token {name!r}: {rate:g} reports per second, bursts of {burst:g}")
        self._admitted.labels(name).inc(held)
        return request

    @staticmethod
    def scoped_specs(
        response: veil_pb2.GetMetricSpecsResponse, identity: TokenConfig
    ) -> veil_pb2.GetMetricSpecsResponse:
        """The specs answer as `identity` may see it: an upload token the specs of its metrics
        only, the version, clock and limits as they are."""
        if identity.role != "upload":
            return response
        scoped = veil_pb2.GetMetricSpecsResponse()
        scoped.CopyFrom(response)
        del scoped.specs[:]
        scoped.specs.extend(s for s in response.specs if s.name in identity.metrics)
        return scoped

    def _rate_limited(self, wait: float, what: str) -> NoReturn:
        """Refuse an upload over a rate limit, with the retry hint."""
        milliseconds = max(1, math.ceil(wait * 1000))
        self.deny(
            UPLOAD,
            "RESOURCE_EXHAUSTED",
            f"{what}; retry after {milliseconds} ms with the same batch id. Nothing was counted.",
            milliseconds,
        )
