"""The RESP fast path of RedisStore's script calls: a script call's field, increment pairs
(some 2000 arguments at k = 1024) encoded from cached pieces and spliced into redis-py's command
packer, which would encode them one Python object at a time.

Packer wraps redis-py's *private* RESP serializers (redis.connection.HiredisRespSerializer,
PythonRespSerializer) and is handed to its connections through their private command_packer
argument and _command_packer attribute. Only redis-py versions in SUPPORTED_REDIS_PY whose
private API has the shape checked by private_api_problem get it (tests/aggregator/store/
test_store_resp.py pins both); any other redis-py sends the same arguments as plain ones,
slower, and says so once in the log.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import redis

from ...counts import Counts
from .fields import field_names, increments

__all__ = [
    "SUPPORTED_REDIS_PY",
    "Packer",
    "Resp",
    "command_packer",
    "field_resp",
    "increments_resp",
    "joined",
    "private_api_problem",
]

log = logging.getLogger("veil.aggregator.store")

# The redis-py versions (major, minor), from and up to before, the fast path is known to fit:
# 5.0 made redis._parsers and these serializers (private_api_problem checks their shape at run
# time); 8.1 is the version tested. A new major version
# is checked (test_store_resp.py) before this range grows.
SUPPORTED_REDIS_PY = ((5, 0), (9, 0))


class Resp:
    """Command arguments already encoded in RESP: how many, and their bytes. Packer splices
    them in as they are. A script call carries some 2000 field and increment arguments at
    k = 1024, which redis-py and hiredis encode one Python object at a time (about 0.5 ms);
    from cached pieces the same bytes take a join."""

    __slots__ = ("count", "data")

    def __init__(self, count: int, data: bytes) -> None:
        self.count = count
        self.data = data


class _CommandPacker(Protocol):
    def pack(self, *args: object) -> list[bytes]: ...


class Packer:
    """redis-py's own command packer, except for a command whose last argument is a Resp:
    that one is written here, the Resp's bytes spliced in after the other arguments."""

    def __init__(self, inner: _CommandPacker) -> None:
        self._inner = inner

    def pack(self, *args: object) -> list[bytes]:
        if not args or not isinstance(args[-1], Resp):
            return self._inner.pack(*args)
        tail = args[-1]
        head = b"".join(_bulk(arg) for arg in args[:-1])
        return [b"*%d\r\n" % (len(args) - 1 + tail.count) + head + tail.data]


def _bulk(arg: object) -> bytes:
    if isinstance(arg, str):
        arg = arg.encode()
    elif isinstance(arg, int):
        arg = b"%d" % arg
    elif not isinstance(arg, bytes):
        raise TypeError(f"cannot encode {type(arg).__name__} for Redis")
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def command_packer() -> Packer | None:
    """The packer redis-py would use, wrapped; None (the increments then go as plain arguments,
    the same bytes made more slowly) where this redis-py is not one whose private serializers
    are known to fit, with a warning saying why once."""
    problem = _problem_of(redis.__version__)
    if problem is not None:
        _warn_once(problem)
        return None
    from redis._parsers import Encoder
    from redis.connection import HiredisRespSerializer, PythonRespSerializer
    from redis.utils import HIREDIS_AVAILABLE

    if HIREDIS_AVAILABLE:
        return Packer(HiredisRespSerializer())  # type: ignore[arg-type]  # redis-py types pack()'s arguments as lists
    return Packer(PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode))


def private_api_problem(version: str | None = None) -> str | None:
    """Why the fast path cannot use this redis-py, or None when it can: a version outside
    SUPPORTED_REDIS_PY, or any part of the private API Packer relies on missing or shaped
    otherwise (its serializers, their pack(), the connection's command_packer argument and
    the _command_packer attribute the cluster client's connections are given one through);
    `version` is redis-py's own unless given."""
    version = redis.__version__ if version is None else version
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"redis-py {version}: not a version number"
    low, high = SUPPORTED_REDIS_PY
    if not low <= major_minor < high:
        return (
            f"redis-py {version}: the RESP fast path is known to fit {low[0]}.{low[1]} up to before {high[0]}.{high[1]}"
        )
    try:
        from redis._parsers import Encoder
        from redis.connection import AbstractConnection, Connection, HiredisRespSerializer, PythonRespSerializer
        from redis.utils import HIREDIS_AVAILABLE  # noqa: F401 (its presence is checked)
    except ImportError as error:
        return f"redis-py {version}: {error}"
    if not (
        callable(getattr(HiredisRespSerializer, "pack", None)) and callable(getattr(PythonRespSerializer, "pack", None))
    ):
        return f"redis-py {version}: its RESP serializers have no pack()"
    if list(inspect.signature(PythonRespSerializer).parameters) != ["buffer_cutoff", "encode"]:
        return f"redis-py {version}: PythonRespSerializer takes {inspect.signature(PythonRespSerializer)}"
    # redis.Redis.from_url hands its command_packer on to every connection of its pool.
    if "command_packer" not in inspect.signature(AbstractConnection).parameters:
        return f"redis-py {version}: a connection takes no command_packer"
    marker = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    if getattr(Connection(command_packer=marker), "_command_packer", None) is not marker:
        return f"redis-py {version}: a connection keeps its command packer elsewhere than _command_packer"
    return None


_problem_of = functools.cache(private_api_problem)  # checked once per process, not per store


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning("the RESP fast path is off; script calls encode their counts the slower way", extra={"why": problem})


_SMALL = 1 << 14
_SMALL_VALUES = np.empty(_SMALL, object)  # b"$<digits>\r\n<v>\r\n" for v < _SMALL
_SMALL_VALUES[:] = [_bulk(v) for v in range(_SMALL)]
_FIELD_PIECES: dict[tuple[tuple[int, ...], int], np.ndarray] = {}


def increments_resp(counts: Counts) -> Resp:
    """increments(counts), RESP-encoded."""
    names = field_names(counts.weights, counts.k)
    if names is None:
        pairs = increments(counts)
        return Resp(len(pairs), b"".join(_bulk(arg) for arg in pairs))
    pieces = _FIELD_PIECES.get((counts.weights, counts.k))
    if pieces is None:
        pieces = np.empty(len(names), object)
        pieces[:] = [_bulk(name) for name in names.tolist()]
        if len(_FIELD_PIECES) >= 64:
            _FIELD_PIECES.clear()
        _FIELD_PIECES[counts.weights, counts.k] = pieces
    flat = np.concatenate([counts.n, counts.v.ravel()])
    (present,) = np.nonzero(flat)
    values = flat[present]
    out = np.empty(2 * present.size, object)
    out[0::2] = pieces[present]
    if values.size and values.max() < _SMALL:
        out[1::2] = _SMALL_VALUES[values]
    else:
        out[1::2] = [_bulk(v) for v in values.tolist()]
    return Resp(out.size, b"".join(out.tolist()))


def joined(args: Sequence[int | str | bytes | Resp]) -> Resp:
    """The arguments as one Resp: plain ones encoded, Resps spliced in as they are (a script
    call's arguments hold several groups' increments, and Packer splices only the last)."""
    count, parts = 0, []
    for arg in args:
        if isinstance(arg, Resp):
            count += arg.count
            parts.append(arg.data)
        else:
            count += 1
            parts.append(_bulk(arg))
    return Resp(count, b"".join(parts))


_FIELD_RESPS: dict[tuple[tuple[int, ...], int, bool], Resp] = {}


def field_resp(weights: tuple[int, ...], k: int, version: bool = False) -> Resp | None:
    """Every field name of the design, RESP-encoded (HMGET's arguments), then "version" and
    "periods" when asked; None as for field_names."""
    resp = _FIELD_RESPS.get((weights, k, version))
    if resp is None:
        names = field_names(weights, k)
        if names is None:
            return None
        listed = names.tolist() + ([b"version", b"periods"] if version else [])
        resp = Resp(len(listed), b"".join(_bulk(name) for name in listed))
        if len(_FIELD_RESPS) >= 64:
            _FIELD_RESPS.clear()
        _FIELD_RESPS[weights, k, version] = resp
    return resp
