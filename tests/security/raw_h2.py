"""HTTP/2 written by hand, for the abuse tests: what no well-behaved client library sends (streams
opened and reset at once, streams that never send their message, a receive window of zero).
Frames per RFC 9113; headers as HPACK literals without indexing (RFC 7541 section 6.2.2), which
every decoder must take. A thread reads the server's frames, acknowledges its SETTINGS and PINGs
(an unacknowledged SETTINGS would end the connection), and notes GOAWAY and stream ends."""

from __future__ import annotations

import socket
import struct
import threading

__all__ = ["RawH2"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CANCEL = 0x8
INITIAL_WINDOW_SIZE = 0x4


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an n-bit prefix (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _integer(len(raw_name), 7) + raw_name + _integer(len(raw_value), 7) + raw_value


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def grpc_headers(path: str, authority: str, token: str | None = None) -> bytes:
    """The header block of a gRPC call to `path` (with a bearer token)."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if token:
        fields.append(("authorization", f"Bearer {token}"))
    return b"".join(_literal(name, value) for name, value in fields)


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class RawH2:
    """One client connection. window_zero: announce a receive window of 0 (the server may send
    no DATA until a WINDOW_UPDATE, which never comes)."""

    def __init__(self, port: int, *, window_zero: bool = False) -> None:
        self.authority = f"127.0.0.1:{port}"
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.goaway = threading.Event()
        self.closed = threading.Event()
        self.ended: set[int] = set()  # streams the server ended (END_STREAM on HEADERS or DATA, or RST_STREAM)
        self._next_stream = 1
        self._write_lock = threading.Lock()
        settings = struct.pack(">HI", INITIAL_WINDOW_SIZE, 0) if window_zero else b""
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def send(self, data: bytes) -> bool:
        """False once the connection is gone."""
        try:
            with self._write_lock:
                self.sock.sendall(data)
            return True
        except OSError:
            self.closed.set()
            return False

    def open_stream(self, path: str, token: str | None = None, *, end: bool = False, body: bytes = b"") -> int:
        """A new stream's HEADERS (and body, as one DATA frame; END_STREAM on the last frame when
        `end`); its id."""
        stream = self._next_stream
        self._next_stream += 2
        flags = END_HEADERS | (END_STREAM if end and not body else 0)
        data = frame(HEADERS, flags, stream, grpc_headers(path, self.authority, token))
        if body:
            data += frame(DATA, END_STREAM if end else 0, stream, body)
        self.send(data)
        return stream

    def reset(self, stream: int) -> bool:
        return self.send(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))

    def rapid_resets(self, path: str, count: int, token: str | None = None) -> int:
        """`count` streams opened and reset at once, written in large writes; how many were sent
        before the server ended the connection."""
        sent = 0
        while sent < count and not self.closed.is_set():
            chunk = []
            for _ in range(min(100, count - sent)):
                stream = self._next_stream
                self._next_stream += 2
                chunk.append(frame(HEADERS, END_HEADERS, stream, grpc_headers(path, self.authority, token)))
                chunk.append(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
            if not self.send(b"".join(chunk)):
                break
            sent += len(chunk) // 2
        return sent

    def close(self) -> None:
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    payload = buffer[9 : 9 + length]
                    buffer = buffer[9 + length :]
                    if kind == SETTINGS and not flags & ACK:
                        self.send(frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        self.send(frame(PING, ACK, 0, payload))
                    elif kind == GOAWAY:
                        self.goaway.set()
                    elif kind == RST_STREAM or (kind in (HEADERS, DATA) and flags & END_STREAM):
                        self.ended.add(stream)
        except OSError:
            pass
        finally:
            self.closed.set()
