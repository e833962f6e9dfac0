"""`veil serve`: run the aggregator daemon until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", help="the config file (default: $VEIL_CONFIG)")
    parser.add_argument("--store", metavar="URL",
                        help="override [store] url: memory, memory:///path/snapshot.json, redis://host:port/db, "
                             "rediss://... (default: $VEIL_STORE_URL, then the config)")
    parser.add_argument("--check-config", action="store_true",
                        help="check the config file and the store URL, say whether the store answers from here, "
                             "and exit: 0 when the config is good")
    parser.add_argument("--log-format", choices=("json", "text"), default="json", help="log line format (default json)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.epilog = ("SIGTERM or Ctrl-C stops it gracefully: health turns NOT_SERVING, in-flight uploads get "
                     "server.grace_period seconds to finish, then it exits 0.")


def run(args: argparse.Namespace) -> int:
    from .._errors import StoreError
    from .._logging import configure_logging
    from ..config import load_config
    from ..daemon import Aggregator, open_configured_store

    configure_logging(args.log_format, args.log_level)
    config = load_config(args.config, store_url=args.store)
    if args.check_config:
        store = open_configured_store(config)
        try:
            store.ping()
            reach = "reachable"
        except StoreError as err:
            reach = f"not reachable from here ({err})"
        finally:
            store.close()
        print(f"{config.source}: OK ({len(config.metrics)} metrics; store {config.store_url.split('@')[-1]}: {reach})")
        print(f"access: {_access(config)}")
        return 0
    aggregator = Aggregator(config)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    aggregator.start()
    scheme = " with TLS" if config.tls else ""
    print(f"veil: serving gRPC{scheme} on port {aggregator.grpc_port}"
          + (f", HTTP{'S' if config.tls else ''} on port {aggregator.http_port}" if aggregator.http_port else "")
          + f" ({_access(config)})", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    aggregator.stop()
    return 0


def _access(config) -> str:
    """How the listeners are protected, in a few words (token names and counts, never values)."""
    tls = "TLS off" if config.tls is None else ("mutual TLS" if config.tls.mutual else "TLS")
    if not config.auth.enabled:
        return f"{tls}; authentication OFF: no tokens"
    uploads, reads = len(config.auth.of_role("upload")), len(config.auth.of_role("read"))
    return (f"{tls}; {uploads} upload token{'s' * (uploads != 1)}, {reads} read token{'s' * (reads != 1)}")
