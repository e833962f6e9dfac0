"""`veil store check`: check a counter store, and say what it holds.

For a SQLite store: that the file is a Veil database of a schema this Veil reads, PRAGMA
integrity_check, then sizes, batch ids, and per metric and window the buckets and reports. It
reads only, so it may run beside the aggregator serving the file. For Redis: that it answers.
Exit status 0 when the store is good, 1 when it is not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="check a store and summarize what it holds; exit 0 when it is good",
        description="Check a store (a SQLite file: schema and integrity_check; Redis: that it "
        "answers) and summarize what it holds. Exit 0 when good, 1 when not.",
    )
    check.add_argument(
        "--store",
        metavar="URL",
        help="the store: sqlite:///path/veil.db or redis://... (default: $VEIL_STORE_URL, then the "
        "config's, then SQLite in the data directory)",
    )
    check.add_argument("--config", metavar="PATH", help="take the store of this config file (default: $VEIL_CONFIG)")
    check.add_argument("--data-dir", metavar="PATH", help="the data directory of the default store (as veil serve)")


def run(args: argparse.Namespace) -> int:
    from veil.aggregator.config import ENV_CONFIG, ENV_STORE_URL, default_store_url, load_config

    url = args.store or os.environ.get(ENV_STORE_URL)
    if not url and (args.config or os.environ.get(ENV_CONFIG)):
        url = load_config(args.config, data_dir=args.data_dir).store_url
    if not url:
        url = default_store_url(args.data_dir)
    if url.startswith("sqlite:"):
        return _check_sqlite(url)
    from veil.aggregator.errors import StoreError
    from veil.aggregator.store import open_store

    try:
        store = open_store(url)
    except ValueError as err:
        from . import CliError

        raise CliError(f"--store: {err}") from None
    try:
        store.ping()
    except StoreError as err:
        print(f"{url.split('@')[-1]}: NOT OK: {err}")
        return 1
    finally:
        store.close()
    print(
        f"{url.split('@')[-1]}: OK (answers)"
        + (" (volatile: holds nothing once its process exits)" if url == "memory" else "")
    )
    return 0


def _check_sqlite(url: str) -> int:
    from urllib.parse import unquote, urlsplit

    from veil.aggregator.store import check_database, describe_database

    path = unquote(urlsplit(url).path)
    problem = check_database(path, integrity=True)
    if problem is not None:
        print(f"{path}: NOT OK: {problem}")
        return 1
    print(f"{path}: OK")
    for line in describe_database(path):
        print(f"  {line}")
    sys.stdout.flush()
    return 0
