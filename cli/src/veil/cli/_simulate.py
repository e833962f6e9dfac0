"""`veil simulate`: a load generator of simulated devices reporting to a running aggregator.

Two ways to make reports: `--mode batch` randomizes with the numba batch kernels and uploads
batches straight over gRPC (fast: load tests); `--mode sdk` runs many simulated devices, each a
real `veil.client.Reporter` (the path apps take).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent import futures
from typing import Any

from ._remote import add_address_argument, address, call, channel, metadata, text_argument

_ATTEMPTS = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_address_argument(parser)
    parser.add_argument("metric", help="the metric to report (as the aggregator declares it)")
    parser.add_argument("--reports", type=int, default=100_000, metavar="N", help="reports to send (default 100000)")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="PER_SECOND",
        help="target reports per second (default 0: as fast as possible)",
    )
    parser.add_argument(
        "--distribution",
        default="zipf:1.1",
        metavar="LAW",
        help="the hidden truth: uniform, zipf[:S] (default zipf:1.1), or comma-separated weights",
    )
    parser.add_argument(
        "--mode",
        choices=("batch", "sdk"),
        default="batch",
        help="batch: numba kernels, batches over gRPC (default); sdk: simulated devices, each a Reporter",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=20,
        help="sdk mode: simulated devices, each holding one true value drawn from the truth and "
        "calling report() --reports / --devices times; what leaves a device follows the "
        "metric's reporting rule (at most reports_per_period per period) (default 20)",
    )
    parser.add_argument(
        "--no-memoize",
        dest="memoize",
        action="store_false",
        help="sdk mode: devices draw a fresh response for every report (the SDK's default, "
        "memoization, resends one response per value)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        metavar="B",
        help="reports per upload (default 1000; in sdk mode the Reporter's max batch)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed the truth's draws and use the seeded fast generator (simulation only)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def truth(law: str, k: int) -> list[float]:
    """The distribution a --distribution string names, over k categories."""
    from . import CliError

    if law == "uniform":
        weights = [1.0] * k
    elif law.startswith("zipf"):
        exponent = law.partition(":")[2] or "1.1"
        try:
            s = float(exponent)
        except ValueError:
            raise CliError(f"--distribution: {exponent!r} is not a Zipf exponent.") from None
        weights = [1.0 / (i + 1) ** s for i in range(k)]
    else:
        try:
            weights = [float(x) for x in law.split(",")]
        except ValueError:
            raise CliError(f"--distribution: expected uniform, zipf[:S] or {k} comma-separated weights.") from None
        if len(weights) != k or min(weights) < 0 or sum(weights) <= 0:
            raise CliError(f"--distribution: expected {k} non-negative weights, not all zero.")
    total = sum(weights)
    return [w / total for w in weights]


class Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.started, self._drawn = total, enabled, time.monotonic(), 0.0

    def update(self, done: int, failed: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self._drawn < 0.2):
            return
        self._drawn = now
        share = done / self.total if self.total else 1.0
        bar = "#" * int(30 * share)
        rate = done / max(now - self.started, 1e-9)
        print(
            f"\r[{bar:<30}] {done:,}/{self.total:,} reports  {rate:,.0f}/s  {failed:,} failed",
            end="\n" if final else "",
            file=sys.stderr,
            flush=True,
        )


def _pace(started: float, sent: int, rate: float) -> None:
    if rate > 0:
        delay = started + sent / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from veil.client import spec_from_proto
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    from . import CliError

    if args.reports < 1 or args.batch_size < 1 or args.devices < 1 or args.rate < 0:
        raise CliError("--reports, --batch-size and --devices must be at least 1, and --rate at least 0.")
    with channel(args) as specs_channel:
        response = call(
            args,
            veil_pb2_grpc.CollectorStub(specs_channel).GetMetricSpecs,
            veil_pb2.GetMetricSpecsRequest(metrics=[text_argument(args.metric, "METRIC")]),
        )
    if not response.specs:
        raise CliError(f"The aggregator at {address(args)} declares no metric {args.metric!r}.")
    if response.max_batch and args.batch_size > response.max_batch:
        print(
            f"veil simulate: --batch-size {args.batch_size} is above the aggregator's max_batch; sending "
            f"{response.max_batch} reports per upload.",
            file=sys.stderr,
        )
        args.batch_size = response.max_batch
    spec = spec_from_proto(response.specs[0])
    law = truth(args.distribution, spec.k)
    values = np.random.default_rng(args.seed).choice(spec.k, size=args.reports, p=law)
    progress = Progress(args.reports, enabled=not args.json)
    started = time.monotonic()
    summary = (_run_batches if args.mode == "batch" else _run_devices)(args, spec, values, progress)
    elapsed = time.monotonic() - started
    summary.update(
        metric=spec.name,
        mode=args.mode,
        elapsed_seconds=round(elapsed, 3),
        reports_per_second=round(summary["acknowledged"] / elapsed, 1) if elapsed else None,
        truth=dict(zip(spec.labels, law)),
    )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        kept = (
            f"; {summary['limited']:,} kept on the devices by the reporting period's bound"
            if summary.get("limited")
            else ""
        )
        print(
            f"{spec.name}: {summary['acknowledged']:,} of {args.reports:,} reports acknowledged "
            f"({summary['failed']:,} failed{kept}) in {elapsed:.1f} s, {summary['reports_per_second'] or 0:,.0f}/s; "
            f"mode {args.mode}."
        )
        for code, details in summary.get("errors", {}).items():
            print(f"failed uploads: {code}: {details}")
    return 0 if summary["failed"] == 0 else 1


def _encode_batches(spec, reports, batch_size: int):
    """Serialized UploadRequests of randomized report arrays, in the SDK's encoding."""
    import os

    import numpy as np

    from veil.mechanism import BITMAPS, encoding
    from veil.wire.v1 import veil_pb2

    q = spec.mechanism.q
    for start in range(0, len(reports), batch_size):
        chunk = reports[start : start + batch_size]
        request = veil_pb2.UploadRequest(
            batch_id=os.urandom(16), metric=spec.name, spec_fingerprint=spec.fingerprint, count=len(chunk)
        )
        if q is None:
            request.bitmaps.bits = chunk.tobytes()
        elif encoding(spec.mechanism) == BITMAPS:
            rows = np.zeros((len(chunk), spec.k), dtype=np.uint8)
            np.put_along_axis(rows, chunk.astype(np.intp), 1, axis=1)
            request.bitmaps.bits = np.packbits(rows, axis=1, bitorder="little").tobytes()
        else:
            request.index_sets.set_size = q
            request.index_sets.indices = chunk.astype("<u4").tobytes()
        yield len(chunk), request.SerializeToString()


def _run_batches(args, spec, values, progress: Progress) -> dict:
    import grpc

    from veil.aggregator.simulate import AesCtrKeystream, FastKeystream, simulate_reports
    from veil.client import FINAL, TOKEN_REFUSED
    from veil.wire.v1 import veil_pb2

    keystream = FastKeystream(args.seed) if args.seed is not None else AesCtrKeystream()
    reports = simulate_reports(spec.mechanism, values, keystream=keystream)
    tally: dict[str, Any] = {"acknowledged": 0, "duplicates": 0, "failed": 0, "retries": 0, "batches": 0}
    lock = threading.Lock()

    sent_metadata = metadata(args)
    with channel(args) as upload_channel:
        upload = upload_channel.unary_unary(
            "/veil.wire.v1.Collector/Upload",
            request_serializer=None,
            response_deserializer=veil_pb2.UploadResponse.FromString,
        )

        def send(count: int, payload: bytes) -> None:
            for attempt in range(_ATTEMPTS):
                try:
                    reply = upload(payload, timeout=args.timeout, metadata=sent_metadata)
                    with lock:
                        tally["acknowledged"] += count
                        tally["duplicates"] += reply.duplicate
                    return
                except grpc.RpcError as err:
                    # The SDK's policy, except that a refused token fails at once: no operator
                    # is going to fix it within this run.
                    if err.code() in FINAL or err.code() in TOKEN_REFUSED or attempt == _ATTEMPTS - 1:
                        with lock:
                            tally["failed"] += count
                            tally.setdefault("errors", {}).setdefault(err.code().name, err.details())
                        return
                    with lock:
                        tally["retries"] += 1
                    time.sleep(min(0.1 * 2**attempt, 2.0))  # the same payload: the same batch id

        started, submitted = time.monotonic(), 0
        with futures.ThreadPoolExecutor(max_workers=4) as pool:
            pending = set()
            for count, payload in _encode_batches(spec, reports, args.batch_size):
                _pace(started, submitted, args.rate)
                pending.add(pool.submit(send, count, payload))
                submitted += count
                tally["batches"] += 1
                if len(pending) >= 16:  # bound what is in flight and in memory
                    _, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
                progress.update(tally["acknowledged"], tally["failed"])
            futures.wait(pending)
    progress.update(tally["acknowledged"], tally["failed"], final=True)
    return tally


def _run_devices(args, spec, values, progress: Progress) -> dict:
    import os

    from veil.client import Reporter
    from veil.mechanism import SeededRandomSource

    from ._remote import ENV_CA_FILE, ENV_CLIENT_CERT, ENV_CLIENT_KEY, credentials, token

    devices_count = min(args.devices, len(values))
    calls = -(-len(values) // devices_count)  # report() calls per device
    held = values[:devices_count].tolist()  # each device's own true value
    secure = credentials(args) is not None  # the same TLS decision as the CLI's own channel
    connection: dict[str, Any] = {"tls": secure, "token": token(args) or None}  # Reporter's keyword arguments
    if secure:
        for option, variable in (
            ("ca_file", ENV_CA_FILE),
            ("client_cert", ENV_CLIENT_CERT),
            ("client_key", ENV_CLIENT_KEY),
        ):
            path = getattr(args, option, None) or os.environ.get(variable)
            if path:
                connection[option] = path
    devices = [
        Reporter(
            address(args),
            **connection,
            memoize=args.memoize,
            max_batch_size=args.batch_size,
            max_queue_size=calls + 1,
            schedule_delay_ms=200,
            random_source=SeededRandomSource(args.seed * 1_000_003 + d) if args.seed is not None else None,
        )
        for d in range(devices_count)
    ]
    try:
        for device in devices:
            device.wait_for_specs(args.timeout)
        started = time.monotonic()
        for i in range(len(values)):
            _pace(started, i, args.rate)
            d = i % devices_count
            devices[d].report(spec.name, held[d])
            if i % 1000 == 0:
                progress.update(sum(d.counters().sent for d in devices), sum(d.counters().failed for d in devices))
        for device in devices:
            device.force_flush(max(args.timeout, 30.0))
        counters = [d.counters() for d in devices]
    finally:
        for device in devices:
            device.shutdown(1.0)
    # Why reports failed is on stderr: the SDK logs each reason once (a refused token, an outage...).
    tally = {
        "acknowledged": sum(c.sent for c in counters),
        "dropped": sum(c.dropped for c in counters),
        "unsent": sum(c.queued for c in counters),
        "failed": sum(c.failed + c.too_late + c.dropped + c.queued for c in counters),
        "too_late": sum(c.too_late for c in counters),
        "retries": sum(c.retried for c in counters),
        "devices": devices_count,
        "limited": sum(c.limited for c in counters),
        "over_budget": sum(c.over_budget for c in counters),
    }
    progress.update(tally["acknowledged"], tally["failed"], final=True)
    return tally
