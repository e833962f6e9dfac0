"""Logging for the client: counts and reasons only, never report contents, values or tokens."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("veil.client")


class LogOnce:
    """Logs a problem the first time it happens, then stays quiet about it until re-armed, so
    a dead aggregator gives one warning rather than one per retry."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, *args: object, exc_info: bool = False) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        logger.warning(message, *args, exc_info=exc_info)

    def rearm(self, prefix: str) -> bool:
        """Forget the problems whose key starts with ``prefix``; True when there were any."""
        with self._lock:
            gone = {key for key in self._seen if key.startswith(prefix)}
            self._seen -= gone
        return bool(gone)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
