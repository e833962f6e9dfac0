"""The `veil` command: one entry point, a subcommand per job.

The command comes with the SDK, so it is there in every install; what a subcommand needs is
imported only when it runs. `veil privacy` needs nothing but the standard library; `veil specs`
and `veil estimates` need only gRPC (`pip install 'veil[grpc]'`); `serve`, `demo`, `simulate`,
`store` and `health` need the aggregator (`pip install 'veil[aggregator]'`), `release` needs
numpy (`veil[release]`), and without them they say so in one sentence.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module under veil.cli, one-line help)
_COMMANDS = {
    "privacy": ("_privacy", "what each mechanism costs and guarantees at a given k and epsilon, or a numeric metric"),
    "serve": ("_serve", "run the aggregator daemon (gRPC and HTTP) from a config file"),
    "simulate": ("_simulate", "send simulated devices' reports to a running aggregator (a load generator)"),
    "estimates": ("_estimates", "print the current estimates of a running aggregator"),
    "specs": ("_specs", "list the metric specs a running aggregator serves"),
    "health": ("_health", "ask an aggregator's gRPC health service (grpc.health.v1); exit 0 when SERVING"),
    "release": (
        "_release",
        "release a table of records you hold so no one can be re-identified: pram, dp-pram, mask, example",
    ),
    "demo": ("_demo", "the whole system on this machine: aggregator, simulated devices, live estimates"),
    "store": ("_store", "check a counter store (a SQLite file's integrity and schema, or Redis) and what it holds"),
}


# The extra that brings what a subcommand imports beyond the SDK, and the top-level modules of
# that extra's packages (pyproject.toml's lists; a test keeps the two the same). Each is looked
# up, not imported, before the subcommand runs, so a missing one is named before any other work.
_EXTRAS = {
    "serve": "aggregator",
    "demo": "aggregator",
    "simulate": "aggregator",
    "store": "aggregator",
    "health": "aggregator",
    "release": "release",
    "specs": "grpc",
    "estimates": "grpc",
}
EXTRA_MODULES = {
    "grpc": ("grpc",),
    "release": ("numpy",),
    "aggregator": (
        "grpc",
        "numpy",
        "numba",
        "redis",
        "hiredis",
        "cryptography",
        "grpc_health",
        "grpc_reflection",
        "prometheus_client",
        "aiohttp",
    ),
}


def _missing(extra: str) -> str | None:
    for name in EXTRA_MODULES[extra]:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:
            return name
    return None


class CliError(Exception):
    """A problem the user can fix, reported as one line and exit status 2."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """The errors reported as one line, of the packages the command loaded: loading them here
    would cost every command their import time (and an SDK-only install has no aggregator)."""
    errors: tuple[type[BaseException], ...] = (CliError,)
    if "veil.mechanism" in sys.modules:
        from veil.mechanism import MechanismError

        errors += (MechanismError,)
    if "veil.aggregator.errors" in sys.modules:
        from veil.aggregator.errors import AggregatorError, StoreError

        errors += (AggregatorError, StoreError)
    return errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veil",
        description="Veil: local-differential-privacy telemetry. Each subcommand has its own --help.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, summary) in _COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        importlib.import_module(f"{__name__}.{module}").add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    extra = _EXTRAS.get(args.command)
    missing = extra and _missing(extra)
    if missing:
        print(
            f"veil {args.command}: needs the {extra} packages ({missing} is not installed): "
            f"pip install 'veil[{extra}]'.",
            file=sys.stderr,
        )
        return 2
    try:
        return importlib.import_module(f"{__name__}.{args._module}").run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's own flush at
        # exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:
        if not isinstance(err, _user_errors()):
            raise
        print(f"veil {args.command}: {err}", file=sys.stderr)
        return 2
