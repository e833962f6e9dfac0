"""The SQLite store's files are owner-only (0600) whatever the umask, new or already there
(issue 26: they were created 0644 in an existing data directory): reports and batch ids are
nobody else's to read."""

from __future__ import annotations

import os
import stat

from veil.aggregator.store import open_store

FILES = ("veil.db", "veil.db-wal", "veil.db-shm", "veil.db.lock")


def modes(directory) -> dict[str, int]:
    return {name: stat.S_IMODE(os.stat(directory / name).st_mode) for name in FILES if (directory / name).exists()}


def test_the_sqlite_store_files_are_owner_only_whatever_the_umask(tmp_path):
    url = f"sqlite://{tmp_path / 'veil.db'}"
    umask = os.umask(0)  # the most open: files made under it would be 0666
    try:
        store = open_store(url)
        store.ping()
        found = modes(tmp_path)
        store.close()
        assert set(found) >= {"veil.db", "veil.db-wal", "veil.db.lock"}, found
        assert set(found.values()) == {0o600}, found
        for name in FILES:  # as an earlier version (or another hand) left them
            if (tmp_path / name).exists():
                os.chmod(tmp_path / name, 0o644)
        (tmp_path / "veil.db-wal").touch()
        store = open_store(url)
        store.ping()
        found = modes(tmp_path)
        store.close()
        assert set(found.values()) == {0o600}, found
    finally:
        os.umask(umask)
