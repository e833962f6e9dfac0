"""Owner-only files under the queue directory, written atomically (tmp + fsync + rename)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from ._log import LogOnce, logger

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it owner-only (0700)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        try:
            path.chmod(DIR_MODE)
        except OSError:
            logger.warning("The Veil queue directory is readable by others and cannot be made owner-only.")
    return path


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _written_temp(path: Path, data: bytes) -> Path:
    """A temporary file beside ``path`` holding ``data``, on disk (fsynced)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    tmp = _written_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(path.parent)


def create_once(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, complete or not at all, unless it exists already
    (another process may race us). True when this call created it."""
    tmp = _written_temp(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        _remove(tmp)


class FileLock:
    """An exclusive flock on an open file for the duration of a with-block (POSIX only; elsewhere
    one process per queue directory)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        if fcntl is not None and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if fcntl is not None and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class DeviceLog:
    """An owner-only append-only file under the queue directory that the processes of one
    device share (the memo, the privacy ledger): each appends under ``lock()`` after reading
    what the others appended since its ``offset``. Raises OSError where the file cannot be used;
    the owner then keeps its state in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = self._open()
        self.offset = 0  # bytes already read by the owner
        self._dirty = False

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        if os.fstat(fd).st_mode & 0o077:  # made by an older version or by hand: owner-only again
            os.fchmod(fd, FILE_MODE)
        return fd

    def lock(self) -> FileLock:
        return FileLock(self.fd)

    def unread(self) -> bytes:
        """What was appended past ``offset`` (by any process). One pread where nothing was: this
        runs under the lock for every appended record, so each system call counts."""
        assert self.fd is not None
        chunks: list[bytes] = []
        while chunk := os.pread(self.fd, 1 << 16, self.offset + sum(map(len, chunks))):
            chunks.append(chunk)
            if len(chunk) < 1 << 16:
                break
        return b"".join(chunks)

    def cut(self, offset: int) -> None:
        """Cut a torn tail off at ``offset`` (under the lock)."""
        assert self.fd is not None
        os.ftruncate(self.fd, offset)

    def append(self, data: bytes) -> None:
        """Append under the lock, right after the owner read everything (``offset`` is the end)."""
        assert self.fd is not None
        if os.write(self.fd, data) != len(data):
            raise OSError(f"A short write to {self.path.name}.")
        self.offset += len(data)
        self._dirty = True

    def sync(self) -> bool:
        """fsync what was appended since the last sync; False when the disk refused."""
        if self._dirty and self.fd is not None:
            self._dirty = False
            try:
                os.fsync(self.fd)
            except OSError:
                return False
        return True

    def after_fork(self) -> None:
        """flock belongs to the open file description, which parent and child share after fork:
        the child opens its own, so that their locks exclude each other. OSError: unusable."""
        inherited, self.fd = self.fd, None
        try:
            self.fd = self._open()
        finally:
            if inherited is not None:
                os.close(inherited)

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class DeviceFileOwner:
    """What the memo and the privacy ledger share: a device's state kept in memory and mirrored
    in a DeviceLog under the queue directory when there is one (``_file``; None: memory only),
    synced before anything that depends on it leaves the device, reopened after fork."""

    _KIND = ""  # "memo", "ledger": the key of its log lines
    _WHAT = ""  # "The Veil memo store": how its log lines name it
    _IN_MEMORY = ""  # what happens without its file

    def __init__(self, log: LogOnce) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._file: DeviceLog | None = None

    def sync(self) -> None:
        """Make what was appended durable; the worker calls this before anything that depends on
        it leaves the device."""
        if self._file is not None and not self._file.sync():
            self._log.warning(f"{self._KIND}:sync", f"{self._WHAT} cannot be synced to disk.")

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._file is not None:
            try:
                self._file.after_fork()
            except OSError:
                self._log.warning(
                    f"{self._KIND}:open", f"{self._WHAT} cannot be reopened after fork; {self._IN_MEMORY}"
                )
                self._file = None

    def close(self) -> None:
        with self._lock:  # never while an entry is being appended
            self.sync()
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
