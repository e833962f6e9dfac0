"""Longitudinal privacy: a device secret and the memo of randomized responses.

The randomized response to (metric, spec fingerprint, category index) is drawn once and
reused, so reporting the same value again sends the same response and spends no new privacy
(RAPPOR's permanent randomized response). The memo is keyed by
HMAC-SHA256(device secret, canonical(metric, fingerprint, index)), so the store itself names
no value; whoever holds both the secret and the store can still recompute which categories
this device reported (docs/sdk.md, "Repeated reports").

With a queue directory the secret (32 random bytes, created once) and the memo persist there,
owner-only (0600). The memo is an append-only log of records
``key (32) | n (uint32) | n indices (uint32) | crc32``, all little-endian; a torn tail is cut
off at load. A new entry is appended under an exclusive file lock after re-reading what other
processes appended, so processes sharing the directory agree on one response per key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

from veil.mechanism import ROUNDS

from ._fs import FILE_MODE, DeviceFileOwner, DeviceLog, create_once, write_atomic
from ._log import LogOnce

__all__ = [
    "MemoStore",
    "SECRET_BYTES",
    "memo_key",
    "alpha_message",
    "rounding_alpha",
    "round_message",
    "device_round",
    "strings_memo_message",
    "strings_memo_key",
]

SECRET_BYTES = 32
_KEY = 32
_HEAD = struct.Struct("<I")
_DOMAIN = b"veil.memo.v1\x00"
_ALPHA_DOMAIN = b"veil.alpha.v1\x00"
_ROUND_DOMAIN = b"veil.round.v1\x00"
_STRINGS_DOMAIN = b"veil.strings.memo.v1\x00"
_ALPHA_BITS = 53  # a double holds them exactly: alpha is a multiple of 2^-53 in [0, 1)

Report = tuple[int, ...]


def memo_key(secret: bytes, metric: str, fingerprint: str, index: int) -> bytes:
    """HMAC-SHA256(secret, domain | u32 len | metric | u32 len | fingerprint | u32 index): lengths
    in bytes of UTF-8, little-endian (docs/protocol.md section 6; memo_keys.json)."""
    name, print_ = metric.encode(), fingerprint.encode()
    message = b"".join((_DOMAIN, _HEAD.pack(len(name)), name, _HEAD.pack(len(print_)), print_, _HEAD.pack(index)))
    return hmac.new(secret, message, hashlib.sha256).digest()


def alpha_message(metric: str, fingerprint: str) -> bytes:
    """domain | u32 len | metric | u32 len | fingerprint (lengths in bytes of UTF-8, little-endian)."""
    name, print_ = metric.encode(), fingerprint.encode()
    return b"".join((_ALPHA_DOMAIN, _HEAD.pack(len(name)), name, _HEAD.pack(len(print_)), print_))


def rounding_alpha(secret: bytes, metric: str, fingerprint: str) -> float:
    """The device's alpha-point rounding threshold for a numeric mean part (docs/protocol.md
    section 9; numeric_alphas.json): the first 8 bytes of HMAC-SHA256(secret, alpha_message) as a
    little-endian uint64, its top 53 bits over 2^53. Uniform on [0, 1) across devices, so rounding
    is unbiased over the population; fixed for one device and spec, so a value that stays put keeps
    its point, and its memoized response."""
    digest = hmac.new(secret, alpha_message(metric, fingerprint), hashlib.sha256).digest()
    return (int.from_bytes(digest[:8], "little") >> (64 - _ALPHA_BITS)) / (1 << _ALPHA_BITS)


def round_message(metric: str) -> bytes:
    """domain | u32 len | metric (the length in bytes of UTF-8, little-endian)."""
    name = metric.encode()
    return b"".join((_ROUND_DOMAIN, _HEAD.pack(len(name)), name))


def device_round(secret: bytes, metric: str) -> int:
    """The one round of a strings metric this device answers (docs/protocol.md section 10;
    strings_rounds.json): the first 8 bytes of HMAC-SHA256(secret, round_message) as a
    little-endian uint64 x, and floor(x * ROUNDS / 2^64). Chosen without regard to the value, so
    each round hears from a seventh of the devices, and a device's answers never combine."""
    digest = hmac.new(secret, round_message(metric), hashlib.sha256).digest()
    return (int.from_bytes(digest[:8], "little") * ROUNDS) >> 64


def strings_memo_message(round_name: str, design: str, prefix: bytes) -> bytes:
    """domain | u32 len | round name | u32 len | design | u32 len | prefix (lengths in bytes,
    little-endian)."""
    name, design_ = round_name.encode(), design.encode()
    return b"".join(
        (
            _STRINGS_DOMAIN,
            _HEAD.pack(len(name)),
            name,
            _HEAD.pack(len(design_)),
            design_,
            _HEAD.pack(len(prefix)),
            prefix,
        )
    )


def strings_memo_key(secret: bytes, round_name: str, design: str, prefix: bytes) -> bytes:
    """The memo key of a strings round's report of a prefix (docs/protocol.md section 10;
    strings_memo_keys.json): keyed by the round's design (MetricSpec.design), not its
    fingerprint, since a report does not depend on the candidates, which change every period."""
    return hmac.new(secret, strings_memo_message(round_name, design, prefix), hashlib.sha256).digest()


def _load_secret(path: Path, log: LogOnce) -> bytes:
    """The device secret under ``path``, created once."""
    for _ in range(3):
        try:
            secret = path.read_bytes()
        except FileNotFoundError:
            create_once(path, secrets.token_bytes(SECRET_BYTES))
            continue
        if len(secret) == SECRET_BYTES:
            if path.stat().st_mode & 0o077:
                path.chmod(FILE_MODE)
            return secret
        log.warning("memo:secret", "The Veil device secret is corrupt; a new one starts new responses.")
        write_atomic(path, secrets.token_bytes(SECRET_BYTES))
        try:
            (path.parent / MemoStore.FILE).unlink()
        except FileNotFoundError:
            pass
    raise OSError("The device secret cannot be created.")


class MemoStore(DeviceFileOwner):
    SECRET_FILE = "device.key"
    FILE = "memo.log"
    _KIND, _WHAT = "memo", "The Veil memo store"
    _IN_MEMORY = "responses are memoized in memory only."

    def __init__(self, directory: Path | None, log: LogOnce, secret: bytes | None = None) -> None:
        """The memo under ``directory`` (None: in memory); ``secret`` a device secret for one in
        memory (a simulated device's), by default a new random one."""
        super().__init__(log)
        self._memo: dict[bytes, Report] = {}
        if directory is not None:
            try:
                secret = _load_secret(directory / self.SECRET_FILE, log)
                self._file = DeviceLog(directory / self.FILE)
                with self._file.lock():
                    self._read_new()
            except OSError:
                log.warning(
                    "memo:open",
                    "The Veil memo store cannot be used under the queue directory; "
                    "responses are memoized in memory only.",
                )
                self._close()
        self._secret = secret if secret is not None else secrets.token_bytes(SECRET_BYTES)

    def __len__(self) -> int:
        return len(self._memo)

    def key(self, metric: str, fingerprint: str, index: int) -> bytes:
        return memo_key(self._secret, metric, fingerprint, index)

    def alpha(self, metric: str, fingerprint: str) -> float:
        """This device's rounding threshold for a numeric mean part (rounding_alpha)."""
        return rounding_alpha(self._secret, metric, fingerprint)

    def round(self, metric: str) -> int:
        """The round of strings metric ``metric`` this device answers (device_round)."""
        return device_round(self._secret, metric)

    def strings_key(self, round_name: str, design: str, prefix: bytes) -> bytes:
        return strings_memo_key(self._secret, round_name, design, prefix)

    def known(self, key: bytes) -> bool:
        """Whether a response is memoized under ``key`` (in this process's view)."""
        return key in self._memo

    def response(self, metric: str, fingerprint: str, index: int, randomize: Callable[[], Report]) -> Report:
        """The memoized response for the value, drawing it with ``randomize`` the first time."""
        return self.response_for(self.key(metric, fingerprint, index), randomize)

    def response_for(self, key: bytes, randomize: Callable[[], Report]) -> Report:
        """The response memoized under ``key`` (see ``key``), drawn the first time."""
        found = self._memo.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._memo.get(key)
            if found is not None:
                return found
            if self._file is None:
                found = self._memo[key] = randomize()
                return found
            try:
                with self._file.lock():
                    self._read_new()  # another process may have drawn it meanwhile
                    found = self._memo.get(key)
                    if found is None:
                        found = randomize()
                        self._append(key, found)
                        self._memo[key] = found
                return found
            except OSError:
                self._log.warning(
                    "memo:write",
                    "The Veil memo store cannot be written; a restart may draw new "
                    "responses for values first reported now.",
                )
                found = self._memo.setdefault(key, found if found is not None else randomize())
                return found

    # --- the log ------------------------------------------------------------------------

    def _append(self, key: bytes, report: Report) -> None:
        body = key + _HEAD.pack(len(report)) + struct.pack(f"<{len(report)}I", *report)
        assert self._file is not None
        self._file.append(body + _HEAD.pack(zlib.crc32(body)))

    def _read_new(self) -> None:
        """Read records appended since the last read; cut a torn or corrupt tail off."""
        assert self._file is not None
        data = self._file.unread()
        position = 0
        while position + _KEY + 8 <= len(data):
            (n,) = _HEAD.unpack_from(data, position + _KEY)
            end = position + _KEY + 4 + 4 * n
            if end + 4 > len(data):
                break
            (crc,) = _HEAD.unpack_from(data, end)
            if crc != zlib.crc32(data[position:end]):
                break
            key = data[position : position + _KEY]
            self._memo.setdefault(key, struct.unpack_from(f"<{n}I", data, position + _KEY + 4))
            position = end + 4
        self._file.offset += position
        if position < len(data):
            self._log.warning("memo:torn", "Cutting a torn record off the Veil memo log.")
            self._file.cut(self._file.offset)
