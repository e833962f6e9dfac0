"""Structured logs: one JSON object a line (or plain text for a terminal).

Fields are the record's message and whatever the caller put in ``extra``: metric names, counts,
outcomes. Callers never pass reports, addresses or tokens, so neither does the log.
"""

from __future__ import annotations

import json
import logging
import sys

__all__ = ["configure_logging", "say"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            body["error"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Send the `veil` loggers to stderr in the given format ("json" or "text")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("veil")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def say(line: str) -> None:
    """One human-readable line on stderr in one write(): worker processes share this stderr,
    and print() writes a line and its newline apart when unbuffered (PYTHONUNBUFFERED), so
    another process's line could land between them."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
