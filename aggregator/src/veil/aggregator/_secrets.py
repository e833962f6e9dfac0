"""Files that hold secrets (the TLS key, the tokens file): refused when others may read them."""

from __future__ import annotations

import stat
from pathlib import Path

from .errors import ConfigError

__all__ = ["check_private_file"]


def check_private_file(path: Path, key: str) -> None:
    """Refuse a secrets file others may read or change: owner-only (0600 or less), or owned by
    root and at most group-readable (0640: a Kubernetes secret mounted with an fsGroup),
    as PostgreSQL requires of its key files."""
    try:
        info = path.stat()
    except OSError as err:
        raise ConfigError(f"{key}: cannot read {path} ({err.strerror or err}).") from None
    mode = stat.S_IMODE(info.st_mode)
    forbidden = 0o037 if info.st_uid == 0 else 0o077
    if mode & forbidden:
        raise ConfigError(
            f"{key}: {path} is open to group or others (mode {mode:04o}); make it owner-only "
            f"(chmod 600), or owned by root and at most group-readable (0640)."
        )
