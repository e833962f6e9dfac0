"""The `veil` command: one entry point, a subcommand per job.

Each subcommand's module is imported only when it runs, so `veil privacy` needs nothing but
the standard library and `veil --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from veil.mechanism import MechanismError

from .._errors import AggregatorError, StoreError

__all__ = ["main"]

# name -> (module under veil.aggregator.cli, one-line help)
_COMMANDS = {
    "privacy": ("_privacy", "what each mechanism costs and guarantees at a given k and epsilon"),
    "serve": ("_serve", "run the aggregator daemon (gRPC and HTTP) from a config file"),
    "simulate": ("_simulate", "send simulated devices' reports to a running aggregator (a load generator)"),
    "estimates": ("_estimates", "print the current estimates of a running aggregator"),
    "specs": ("_specs", "list the metric specs a running aggregator serves"),
    "health": ("_health", "ask an aggregator's gRPC health service (grpc.health.v1); exit 0 when SERVING"),
    "release": ("_release", "release a table of records you hold so no one can be re-identified: pram, dp-pram, mask, example"),
    "demo": ("_demo", "the whole system on this machine: aggregator, simulated devices, live estimates"),
    "store": ("_store", "check a counter store (a SQLite file's integrity and schema, or Redis) and what it holds"),
}


class CliError(Exception):
    """A problem the user can fix, reported as one line and exit status 2."""


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
    try:
        return importlib.import_module(f"{__name__}.{args._module}").run(args)
    except (CliError, MechanismError, AggregatorError, StoreError) as err:
        print(f"veil {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's own flush at
        # exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
