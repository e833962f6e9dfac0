"""`veil health`: ask an aggregator's gRPC health service (grpc.health.v1) how it is.

For container health checks and for people: prints one word on stdout (SERVING, NOT_SERVING,
UNKNOWN, SERVICE_UNKNOWN or UNREACHABLE), a reason on stderr when there is one, and exits
0 when SERVING, 1 otherwise, 2 for a usage error. The aggregator reports NOT_SERVING while
its counter store is unreachable and once it has begun to stop.
"""

from __future__ import annotations

import argparse
import math
import sys

from ._remote import ENV_ENDPOINT, add_tls_arguments, address, channel

DEFAULT_TIMEOUT = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help=f"the aggregator's gRPC listener (default: ${ENV_ENDPOINT}, then 127.0.0.1:50051, as every command)",
    )
    parser.add_argument(
        "--service",
        metavar="NAME",
        default="",
        help='the service to ask about, e.g. veil.wire.v1.Collector (default "": the whole server)',
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for the answer, connecting included (default {DEFAULT_TIMEOUT:g})",
    )
    add_tls_arguments(parser)  # health needs no token, but a TLS listener needs TLS (and mTLS a certificate)
    parser.epilog = (
        "Prints SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN or UNREACHABLE. "
        "Exit status: 0 SERVING, 1 anything else, 2 a usage error."
    )


def run(args: argparse.Namespace) -> int:
    from . import CliError

    target = address(args)  # --address, else $VEIL_ENDPOINT, else the default; checked: HOST:PORT
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise CliError(f"--timeout: expected a number of seconds above 0, got {args.timeout:g}.")

    # Imported here: grpc is the only heavy part, and `veil --help` should not pay for it.
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    # A health check asks the aggregator itself: an http_proxy in the environment (common in
    # containers) must not route it elsewhere.
    options = [("grpc.enable_http_proxy", 0)]
    with channel(args, target=target, options=options) as health_channel:
        stub = health_pb2_grpc.HealthStub(health_channel)
        try:
            # (types-grpcio-health-checking declares no methods on the stub)
            response = stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as err:
            code = err.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return _say("SERVICE_UNKNOWN", f"{target} has no health status for service {args.service!r}.")
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return _say("UNREACHABLE", f"{target}: {code.name} ({err.details()}).")
            return _say("UNKNOWN", f"{target} answered {code.name} ({err.details()}).")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(status)
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


def _say(word: str, reason: str) -> int:
    print(word)
    print(f"veil health: {reason}", file=sys.stderr)
    return 1
