"""`veil serve`: run the aggregator daemon until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", help="the config file (default: $VEIL_CONFIG)")
    parser.add_argument(
        "--store",
        metavar="URL",
        help="override [store] url: sqlite:///path/veil.db, redis://host:port/db, rediss://..., or "
        "memory (volatile: lost at exit) (default: $VEIL_STORE_URL, then the config, then "
        "SQLite in the data directory)",
    )
    parser.add_argument(
        "--data-dir",
        metavar="PATH",
        help="where the default store (SQLite, veil.db) goes when no store URL is given (default: "
        "$VEIL_DATA_DIR, else /var/lib/veil as root, else ~/.local/share/veil)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="check the config file and the store URL, say whether the store answers from here, "
        "and exit: 0 when the config is good",
    )
    parser.add_argument("--log-format", choices=("json", "text"), default="json", help="log line format (default json)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="override server.processes: N worker processes share the gRPC port (SO_REUSEPORT), "
        "about one per core; N > 1 needs a Redis store and a fixed gRPC port, and makes "
        "server.workers, max_concurrent_rpcs and max_streams per process and each token's "
        "rate limit 1/N per process (default: the config, else 1)",
    )
    # A worker of a `--processes N` supervisor; set by the supervisor only.
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # written to once the worker serves
    parser.epilog = (
        "SIGTERM or Ctrl-C stops it gracefully: health turns NOT_SERVING, in-flight uploads get "
        "server.grace_period seconds to finish, then it exits 0. SIGHUP reloads the tokens ([auth] and "
        "auth.tokens_file) without a restart; a config that fails its checks keeps the tokens in use "
        "and logs why, and other changes take a restart. With --processes N the supervisor forwards "
        "both signals to every worker, restarts a worker that dies, and exits when all have stopped."
    )


def run(args: argparse.Namespace) -> int:
    from veil.aggregator.config import load_config
    from veil.aggregator.errors import StoreError, StoreMisconfigured
    from veil.aggregator.logs import configure_logging

    configure_logging(args.log_format, args.log_level)

    def reload():  # the config as at the start: the same file, overrides and environment
        return load_config(args.config, store_url=args.store, processes=args.processes, data_dir=args.data_dir)

    config = reload()
    if args.worker_index is not None:
        from veil.aggregator.workers import label_worker_logs

        label_worker_logs(args.worker_index, args.log_format)
        return _serve(config, args.worker_index, reload, args.ready_fd)
    if config.processes > 1 and not args.check_config:
        from veil.aggregator.workers import supervise  # imports no gRPC: the workers are fresh interpreters

        return supervise(
            config,
            [
                sys.executable,
                "-m",
                "veil.aggregator",
                "--config",
                config.source,
                "--processes",
                str(config.processes),
                "--log-format",
                args.log_format,
                "--log-level",
                args.log_level,
            ],
        )
    from veil.aggregator.daemon import inflight_bytes, open_configured_store

    if args.check_config:
        inflight_bytes(config)  # a budget no upload fits in is a config error
        if config.store_url.startswith("sqlite:"):
            # Checked, never opened: opening would create the file (as whoever runs the check) and
            # a running aggregator holds its lock.
            from urllib.parse import unquote, urlsplit

            from veil.aggregator.store import check_database

            problem = check_database(unquote(urlsplit(config.store_url).path), full=False, missing_ok=True)
            reach = "usable" if problem is None else f"not usable ({problem})"
        else:
            try:
                store = open_configured_store(config)
                try:
                    store.ping()
                finally:
                    store.close()
                reach = "reachable"
            except StoreMisconfigured as err:
                print(f"{config.source}: store {config.store_url.split('@')[-1]}: {err}.", file=sys.stderr)
                return 1
            except StoreError as err:
                reach = f"not reachable from here ({err})"
        print(f"{config.source}: OK ({len(config.metrics)} metrics; store {config.store_url.split('@')[-1]}: {reach})")
        print(f"access: {_access(config)}" + (f"; {config.processes} worker processes" if config.processes > 1 else ""))
        return 0
    return _serve(config, None, reload)


def _serve(config, worker: int | None, reload, ready_fd: int | None = None) -> int:
    """Serve until SIGTERM or SIGINT, as the one daemon (worker None) or as worker `worker` of a
    supervisor (only worker 0 runs the HTTP listener: the store holds everything it shows);
    on SIGHUP take the tokens of the config `reload()` reads."""
    from dataclasses import replace

    from veil.aggregator.daemon import Aggregator
    from veil.aggregator.logs import say
    from veil.aggregator.tuning import freeze_startup_heap, keep_freed_memory

    stop, hangup = threading.Event(), threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: hangup.set())  # handled below, outside the signal handler
    if worker:
        config, load = replace(config, http_address=""), reload

        def reload():  # a reloaded config is this worker's as well: no HTTP listener
            return replace(load(), http_address="")

    keep_freed_memory()
    aggregator = Aggregator(config)
    aggregator.start()
    if ready_fd is not None:
        from veil.aggregator.workers import tell_supervisor_serving

        tell_supervisor_serving(ready_fd)
    freeze_startup_heap()
    scheme = " with TLS" if config.tls else ""
    say(
        f"veil: {'' if worker is None else f'worker {worker}: '}serving gRPC{scheme} on port {aggregator.grpc_port}"
        + (f", HTTP{'S' if config.tls else ''} on port {aggregator.http_port}" if aggregator.http_port else "")
        + f" ({_access(config)})"
    )
    while not stop.wait(0.2):
        if hangup.is_set():
            hangup.clear()
            aggregator.reload_tokens(reload)
    aggregator.stop()
    return 0


def _access(config) -> str:
    """How the listeners are protected, in a few words (token names and counts, never values)."""
    tls = "TLS off" if config.tls is None else ("mutual TLS" if config.tls.mutual else "TLS")
    if not config.auth.enabled:
        return f"{tls}; authentication OFF: no tokens"
    uploads, reads = len(config.auth.of_role("upload")), len(config.auth.of_role("read"))
    return f"{tls}; {uploads} upload token{'s' * (uploads != 1)}, {reads} read token{'s' * (reads != 1)}"
