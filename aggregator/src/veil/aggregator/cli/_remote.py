"""What the subcommands that talk to a running aggregator share: where it is, and the channel."""

from __future__ import annotations

import argparse
import os

_DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ENDPOINT = "VEIL_ENDPOINT"  # the SDK's variable: the same aggregator


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", metavar="HOST:PORT",
                        help=f"the aggregator's gRPC address (default: ${ENV_ENDPOINT}, then {_DEFAULT_ADDRESS})")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for the aggregator (default 10)")


def address(args: argparse.Namespace) -> str:
    return args.address or os.environ.get(ENV_ENDPOINT) or _DEFAULT_ADDRESS


def call(args: argparse.Namespace, method, request):
    """Call a unary method; a transport failure becomes one CliError line."""
    import grpc

    from . import CliError

    try:
        return method(request, timeout=args.timeout)
    except grpc.RpcError as err:
        raise CliError(f"{address(args)}: {err.code().name}: {err.details()}") from None
