"""What the subcommands that talk to a running aggregator share: where it is, how to reach it
(TLS, client certificate, token), and the channel.

    with channel(args) as ch:
        response = call(args, veil_pb2_grpc.CollectorStub(ch).GetMetricSpecs, request)

Options fall back to the SDK's environment variables, so one environment serves both:
--token $VEIL_TOKEN, --ca-file $VEIL_CA_FILE, --client-cert $VEIL_CLIENT_CERT, --client-key
$VEIL_CLIENT_KEY, --tls $VEIL_TLS. TLS is on with --tls, a CA file or a client certificate
(given or from the environment), or VEIL_TLS=true; otherwise plaintext (the local demo). A
token is sent as `authorization: Bearer <token>` and never printed.
"""

from __future__ import annotations

import argparse
import os
import sys

_DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ENDPOINT = "VEIL_ENDPOINT"  # the SDK's variables: the same aggregator, the same credentials
ENV_TOKEN = "VEIL_TOKEN"
ENV_TLS = "VEIL_TLS"
ENV_CA_FILE = "VEIL_CA_FILE"
ENV_CLIENT_CERT = "VEIL_CLIENT_CERT"
ENV_CLIENT_KEY = "VEIL_CLIENT_KEY"

_TRUE = {"1", "true", "yes", "on"}


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help=f"the aggregator's gRPC address (default: ${ENV_ENDPOINT}, then {_DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the aggregator (default 10)",
    )
    add_tls_arguments(parser)
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help=f"a token of the aggregator's (an upload token to upload, a read token to read "
        f"estimates; default: ${ENV_TOKEN})",
    )


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS")
    group.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help=f"connect with TLS, trusting the system's roots unless --ca-file (default: on when "
        f"a CA file or client certificate is given, or ${ENV_TLS} is true)",
    )
    group.add_argument("--ca-file", metavar="PEM", help=f"trust this CA for the aggregator (default: ${ENV_CA_FILE})")
    group.add_argument(
        "--client-cert",
        metavar="PEM",
        help=f"present this client certificate, for mutual TLS (default: ${ENV_CLIENT_CERT})",
    )
    group.add_argument("--client-key", metavar="PEM", help=f"the client certificate's key (default: ${ENV_CLIENT_KEY})")


def address(args: argparse.Namespace) -> str:
    """--address, else $VEIL_ENDPOINT, else the default; CliError unless it is host:port."""
    from . import CliError

    value = args.address or os.environ.get(ENV_ENDPOINT) or _DEFAULT_ADDRESS
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or not _is_utf8(value):
        raise CliError(f"--address: expected HOST:PORT (e.g. {_DEFAULT_ADDRESS}), got {value!r}.")
    return value


def text_argument(value: str, what: str) -> str:
    """A command-line text as given; CliError when it is not UTF-8 (it could not go on the wire)."""
    from . import CliError

    if not _is_utf8(value):
        raise CliError(f"{what}: not UTF-8 text.")
    return value


def _is_utf8(value: str) -> bool:
    try:  # bytes of argv that are not UTF-8 arrive as lone surrogates
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _setting(args: argparse.Namespace, name: str, variable: str) -> str | None:
    return getattr(args, name, None) or os.environ.get(variable) or None


def token(args: argparse.Namespace) -> str | None:
    """The token to send (--token, else $VEIL_TOKEN), or None."""
    from . import CliError

    value = _setting(args, "token", ENV_TOKEN)
    if value is not None and not all(0x20 < ord(c) < 0x7F for c in value):
        raise CliError("--token: expected printable ASCII without spaces.")  # never the value
    return value


def metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...] | None:
    value = token(args)
    return (("authorization", f"Bearer {value}"),) if value else None


def credentials(args: argparse.Namespace):
    """grpc.ChannelCredentials for TLS as the options ask, or None for plaintext."""
    import grpc

    from . import CliError

    ca_file = _setting(args, "ca_file", ENV_CA_FILE)
    cert_file = _setting(args, "client_cert", ENV_CLIENT_CERT)
    key_file = _setting(args, "client_key", ENV_CLIENT_KEY)
    if (cert_file is None) != (key_file is None):
        raise CliError("--client-cert and --client-key go together.")
    tls = (
        getattr(args, "tls", None)
        or bool(ca_file or cert_file)
        or (os.environ.get(ENV_TLS, "").strip().lower() in _TRUE)
    )
    if not tls:
        return None

    def read(path: str | None, option: str, marker: bytes, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as err:
            raise CliError(f"{option}: cannot read {path} ({err.strerror or err}).") from None
        if marker not in data:  # else gRPC fails later, with C-core noise instead of a reason
            raise CliError(f"{option}: {path} holds no PEM {what}.")
        return data

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_file, "--ca-file", b"-----BEGIN CERTIFICATE-----", "certificate"),
        private_key=read(key_file, "--client-key", b"PRIVATE KEY-----", "private key"),
        certificate_chain=read(cert_file, "--client-cert", b"-----BEGIN CERTIFICATE-----", "certificate"),
    )


def channel(args: argparse.Namespace, *, target: str | None = None, options: list | tuple = ()):
    """A channel to the aggregator (`target`, else address(args)), with TLS when asked for."""
    import grpc

    from veil.client import is_loopback

    target = target or address(args)
    secure = credentials(args)
    if secure is None:
        if getattr(args, "token", None) is not None or (hasattr(args, "token") and os.environ.get(ENV_TOKEN)):
            if not is_loopback(target):
                print(f"veil: warning: the token travels without TLS to {target}; use --tls.", file=sys.stderr)
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, secure, options=list(options))


def call(args: argparse.Namespace, method, request):
    """Call a unary method with the token; a transport failure becomes one CliError line."""
    import grpc

    from . import CliError

    try:
        return method(request, timeout=args.timeout, metadata=metadata(args))
    except grpc.RpcError as err:
        raise CliError(f"{address(args)}: {err.code().name}: {err.details()}") from None
