"""Calls that arrive outside grpcio's server (the HTTP listener, the native collector) go through
the same access checks and servicer as gRPC's; those end a refused call with context.abort, and
a CallContext turns that into a Refused exception carrying the status and the trailers set."""

from __future__ import annotations

from typing import NoReturn

import grpc

__all__ = ["CallContext", "Refused"]


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class CallContext:
    """What the servicer and the interceptor use of a gRPC context. `active`: whether the caller
    still waits for the answer (False once it has left: nothing of its upload is written)."""

    def __init__(self, active: bool = True) -> None:
        self.trailers: tuple = ()
        self._active = active

    def abort(self, code: grpc.StatusCode, message: str) -> NoReturn:
        raise Refused(code, message)

    def set_trailing_metadata(self, metadata) -> None:
        self.trailers = tuple(metadata)

    def is_active(self) -> bool:
        return self._active
