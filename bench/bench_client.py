"""The Veil SDK: report() latency and upload throughput against a local Collector.

report() latency, per call, for the subset design (the default) in every cell k in
{16, 128, 1024} x epsilon in {1, 4}:

  - server up:    a local Collector (a separate process, so it does not share the GIL) acknowledges
                  every batch while the app reports;
  - server down:  the same Collector killed after the specs were fetched; the worker keeps
                  retrying with backoff while the app reports.

Each with memoization off (every call draws a fresh randomized response with the OS CSPRNG:
the worst case) and on (steady state: every value was seen once before, so a call is an HMAC,
a dictionary lookup and the privacy ledger's admission). The metrics let a device send every
call (reports_per_period as large as the calls), so each call is admitted and queued; two more
series measure the device-level bounds: "memo on, queue_dir" (the ledger appends each admitted
report to its file under the queue directory) and "period bound" (the metric's default of one
report a day, reached: report() refuses the call on the device, the common case of an app that
reports its value again and again). Beside them, the bare ``spec.mechanism.randomize(value)`` of
veil.mechanism on the same values: the SDK's overhead is the difference. The queue is sized so
nothing is dropped (a dropped call would be cheaper than a real one). Garbage collection stays
on, as in an app.

Numbers (issue 27): report() of a number of a numeric metric beside report() of a category whose
spec has the same design, in the same run, for epsilon in {1, 4}, memoization off and on:

  - mean only:  a numeric metric with the mean part alone (k-RR over its rounding points) beside a
                metric of categories with the same k-RR spec (k = the points): a number costs
                no more than a category when the ratio is at most 1;
  - both parts: a numeric metric with the mean and a distribution over 6 buckets (subset), each
                with half the epsilon: one report() sends two reports, so beside the sum of a
                category of each part's shape (per part), and beside one category (whole call).

Numbers are drawn uniformly over the range, labels uniformly; memoization on is measured in the
steady state (every point and bucket reported before). The series take turns, 50 calls at a
time in a rotating order, so the worker's batches and drift on a shared machine fall on all alike.

Upload throughput: reports per second from the first report() to the end of force_flush()
(randomize, queue, batch, encode, upload, acknowledge), memoization on so that report() is
cheap and the pipeline is what is measured, default batch size (512 reports).

Usage:  .venv/bin/python bench/bench_client.py [--quick] [--calls N] [--throughput-reports N]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

from veil_testing.benchlib import RESULTS_DIR, machine_info, progress, write_results

KS = (16, 128, 1024)
EPSILONS = (1.0, 4.0)
MECHANISM = "subset"
NUMERIC_RANGE = (0.0, 10_000.0)
NUMERIC_BUCKETS = (100.0, 250.0, 500.0, 1000.0, 2500.0)
ROUNDS = 4  # the numeric series alternate with their category peers in this many rounds,
CHUNK = 50  # a few calls of each series at a time, in a rotating order


def metric_name(k: int, epsilon: float) -> str:
    return f"m_k{k}_e{epsilon:g}"


def daily_name(k: int, epsilon: float) -> str:
    """The same metric with the default reporting rule: one report per device and day."""
    return f"daily_k{k}_e{epsilon:g}"


def numeric_specs(epsilon: float) -> dict[str, list]:
    """The numeric metrics of one epsilon and their category peers, by series name: "mean only"
    (the mean part), "both parts" (mean and distribution, half the epsilon each), and per part
    a metric of categories with the part's spec but its own name."""
    from veil.mechanism import DISTRIBUTION, MEAN, MetricSpec, NumericSpec, mean_levels

    many = {"reports_per_period": 2**32 - 1}
    low, high = NUMERIC_RANGE

    def parts(metric: str, eps: float, both: bool) -> list:
        numeric = [NumericSpec(metric, MEAN, low, high, (), mean_levels(eps))]
        if both:
            numeric.append(NumericSpec(metric, DISTRIBUTION, low, high, NUMERIC_BUCKETS))
        return [MetricSpec.numeric_part(n, MECHANISM, eps, **many) for n in numeric]

    alone = parts(f"num_e{epsilon:g}", epsilon, both=False)
    both = parts(f"num2_e{epsilon:g}", epsilon / 2, both=True)

    def peer(spec, name: str):
        return MetricSpec(name, spec.labels, spec.mechanism, **many)

    return {
        "mean only": alone,
        "both parts": both,
        "category like mean only": [peer(alone[0], f"cat_alone_e{epsilon:g}")],
        "category like each part": [peer(s, f"cat_{s.numeric.part}_e{epsilon:g}") for s in both],
    }


# --- the local Collector (run as a subprocess: `bench_client.py --serve`) ----------------------


def serve() -> None:
    """A minimal Collector: specs for every cell; Upload parses, dedupes and counts. Prints the
    port on stdout, then serves until killed."""
    import grpc

    from veil.client import spec_to_proto
    from veil.mechanism import MetricSpec
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    specs = [
        MetricSpec.create(metric_name(k, e), [f"c{i}" for i in range(k)], MECHANISM, e, reports_per_period=2**32 - 1)
        for k in KS
        for e in EPSILONS
    ]
    specs += [
        MetricSpec.create(daily_name(k, e), [f"c{i}" for i in range(k)], MECHANISM, e) for k in KS for e in EPSILONS
    ]
    specs += [spec for e in EPSILONS for series in numeric_specs(e).values() for spec in series]
    response = veil_pb2.GetMetricSpecsResponse(specs=[spec_to_proto(s) for s in specs])
    seen: set[bytes] = set()

    class Collector(veil_pb2_grpc.CollectorServicer):
        def GetMetricSpecs(self, request, context):
            return response

        def Upload(self, request, context):
            duplicate = request.batch_id in seen
            seen.add(request.batch_id)
            return veil_pb2.UploadResponse(accepted=request.count, duplicate=duplicate)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    veil_pb2_grpc.add_CollectorServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def start_server() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    port = process.stdout.readline().strip()
    return process, f"127.0.0.1:{port}"


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- measurements --------------------------------------------------------------------------


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median_us": statistics.median(ordered) / 1000, "p99_us": p99 / 1000, "calls": len(ordered)}


def time_calls(call, metric: str, values: list, collect: bool = True) -> list[int]:
    if collect:
        gc.collect()  # start each series from the same heap; collections during it are counted
    clock = time.perf_counter_ns
    samples = []
    for value in values:
        start = clock()
        call(metric, value)
        samples.append(clock() - start)
    return samples


def latency(reporter, spec, values: list[str], memoize: bool) -> dict[str, float]:
    if memoize:  # the steady state: every value has its memoized response already
        for label in spec.labels:
            reporter.report(spec.name, label)
    samples = time_calls(reporter.report, spec.name, values)
    result = percentiles(samples)
    counters = reporter.counters()
    result["dropped"] = counters.dropped
    return result


def bounds(reporter, k: int, epsilon: float, values: list[str]) -> dict[str, dict[str, float]]:
    """report() with the ledger writing to its file under queue_dir (each call admitted), and
    with the period's one report sent already (each call refused on the device)."""
    admitted = latency(reporter, reporter.metrics[metric_name(k, epsilon)], values, memoize=True)
    reporter.force_flush(60)
    daily = reporter.metrics[daily_name(k, epsilon)]
    reporter.report(daily.name, values[0])  # the day's report
    refused = percentiles(time_calls(reporter.report, daily.name, values))
    refused["limited"] = reporter.counters().limited
    return {"memo on, queue_dir": admitted, "period bound": refused}


def bare_randomize(spec, values: list[str]) -> dict[str, float]:
    mechanism = spec.mechanism
    index = {label: i for i, label in enumerate(spec.labels)}  # as report() looks labels up
    return percentiles(time_calls(lambda _, label: mechanism.randomize(index[label]), spec.name, values))


def run_latency(endpoint: str, server: subprocess.Popen, calls: dict[int, int], seed: int, work: Path) -> dict:
    from veil.client import Reporter

    rng = random.Random(seed)
    results: dict[str, dict] = {"up": {}, "down": {}, "bare_randomize": {}, "bounds": {}}
    # One Reporter per (cell, memoize), built while the server is up so the specs are known.
    reporters = {}
    for k in KS:
        for epsilon in EPSILONS:
            for memoize in (False, True, "queue_dir"):
                directory = {"queue_dir": work / f"k{k}-e{epsilon:g}"} if memoize == "queue_dir" else {}
                reporters[k, epsilon, memoize] = Reporter(
                    endpoint,
                    tls=False,
                    memoize=bool(memoize),
                    max_queue_size=4 * calls[k] + 4096,
                    retry_initial_backoff_ms=100,
                    retry_max_backoff_ms=1000,
                    **directory,
                )
    for reporter in reporters.values():
        assert reporter.wait_for_specs(30), "the local Collector did not answer"
    values = {k: [f"c{rng.randrange(k)}" for _ in range(calls[k])] for k in KS}
    for phase in ("up", "down"):
        if phase == "down":
            stop_server(server)
            for reporter in reporters.values():
                reporter.force_flush(0.5)  # let every worker see the failure and start its backoff
        for k in KS:
            for epsilon in EPSILONS:
                cell = f"k={k} eps={epsilon:g}"
                for memoize in (False, True):
                    reporter = reporters[k, epsilon, memoize]
                    spec = reporter.metrics[metric_name(k, epsilon)]
                    key = "memo on" if memoize else "memo off"
                    results[phase].setdefault(cell, {})[key] = latency(reporter, spec, values[k], memoize)
                    if phase == "up":
                        reporter.force_flush(60)
                if phase == "up":
                    results["bare_randomize"][cell] = bare_randomize(spec, values[k])
                    results["bounds"][cell] = bounds(reporters[k, epsilon, "queue_dir"], k, epsilon, values[k])
                r = results[phase][cell]
                progress(
                    f"  server {phase:4} {cell:14} memo off median {r['memo off']['median_us']:8.1f} us "
                    f"p99 {r['memo off']['p99_us']:8.1f} us | memo on median {r['memo on']['median_us']:6.1f} us "
                    f"p99 {r['memo on']['p99_us']:6.1f} us"
                )
    for reporter in reporters.values():
        reporter.shutdown(0)
    return results


def run_numeric(endpoint: str, calls: int, seed: int) -> dict:
    """report() of a number beside report() of a category of the same design (see the module
    docstring): per epsilon and memoization, each series' median and p99 and their ratios."""
    from veil.client import Reporter

    rng = random.Random(seed)
    low, high = NUMERIC_RANGE
    numbers = [rng.uniform(low, high) for _ in range(calls)]
    results: dict[str, dict] = {}
    for epsilon in EPSILONS:
        series = numeric_specs(epsilon)
        for memoize in (False, True):
            # Room for every call's reports (two for both parts) and the warm-up: none dropped.
            reporter = Reporter(endpoint, tls=False, memoize=memoize, max_queue_size=4 * ROUNDS * calls + 4096)
            assert reporter.wait_for_specs(30), "the local Collector did not answer"
            calls_of = {
                "mean only": (series["mean only"][0].numeric.metric, numbers),
                "both parts": (series["both parts"][0].numeric.metric, numbers),
            }
            for spec in series["category like mean only"] + series["category like each part"]:
                calls_of[spec.name] = (spec.name, [rng.choice(spec.labels) for _ in range(calls)])
            if memoize:  # the steady state: every point, bucket and label has its response
                for spec in [s for specs in series.values() for s in specs]:
                    if spec.numeric is not None:
                        for x in (*spec.numeric.points, *spec.numeric.edges):
                            reporter.report(spec.numeric.metric, x)
                    else:
                        for label in spec.labels:
                            reporter.report(spec.name, label)
            names = list(calls_of)
            samples: dict[str, list[int]] = {name: [] for name in names}
            for round_ in range(ROUNDS):
                gc.collect()
                for chunk, start in enumerate(range(0, calls, CHUNK)):
                    shift = (round_ + chunk) % len(names)
                    for name in names[shift:] + names[:shift]:
                        metric, values = calls_of[name]
                        samples[name] += time_calls(reporter.report, metric, values[start : start + CHUNK], False)
                reporter.force_flush(60)
            counters = reporter.counters()
            reporter.shutdown(0)
            assert counters.dropped == 0, counters
            cell = f"eps={epsilon:g} {'memo on' if memoize else 'memo off'}"
            got = {name: percentiles(s) for name, s in samples.items()}
            mean_peer = got[series["category like mean only"][0].name]
            part_peers = [got[s.name] for s in series["category like each part"]]
            ratios = {}
            for stat in ("median_us", "p99_us"):
                ratios[f"mean only / category, {stat}"] = got["mean only"][stat] / mean_peer[stat]
                ratios[f"both parts / category per part, {stat}"] = got["both parts"][stat] / sum(
                    p[stat] for p in part_peers
                )
                ratios[f"both parts / one category, {stat}"] = got["both parts"][stat] / mean_peer[stat]
            results[cell] = {"series": got, "ratios": ratios}
            progress(
                f"  numbers {cell:18} mean only {got['mean only']['median_us']:6.1f} us "
                f"(category {mean_peer['median_us']:6.1f}), both parts {got['both parts']['median_us']:6.1f} us "
                f"(a category of each part {sum(p['median_us'] for p in part_peers):6.1f})"
            )
    return results


def run_throughput(reports: dict[int, int], seed: int) -> dict:
    from veil.client import Reporter
    from veil.mechanism import encoding, report_bytes

    rng = random.Random(seed)
    server, endpoint = start_server()
    results = {}
    try:
        for k in KS:
            for epsilon in EPSILONS:
                n = reports[k]
                # Room for the warm-up (one report per label) and the n measured: none dropped.
                with Reporter(endpoint, tls=False, max_queue_size=n + k + 1) as reporter:
                    assert reporter.wait_for_specs(30)
                    spec = reporter.metrics[metric_name(k, epsilon)]
                    values = [f"c{rng.randrange(k)}" for _ in range(n)]
                    for label in spec.labels:  # memoized responses exist: report() is cheap
                        reporter.report(spec.name, label)
                    assert reporter.force_flush(60)
                    before = reporter.counters()
                    start = time.perf_counter()
                    for label in values:
                        reporter.report(spec.name, label)
                    reported = time.perf_counter() - start
                    assert reporter.force_flush(120)
                    seconds = time.perf_counter() - start
                    after = reporter.counters()
                    sent = after.sent - before.sent
                cell = f"k={k} eps={epsilon:g}"
                size = report_bytes(spec.mechanism, encoding(spec.mechanism))
                results[cell] = {
                    "reports": n,
                    "sent": sent,
                    "dropped": after.dropped,
                    "seconds": seconds,
                    "report_loop_seconds": reported,
                    "reports_per_second": sent / seconds,
                    "batch_size": 512,
                    "bytes_per_report": size,
                    "upload_megabytes_per_second": sent * size / seconds / 1e6,
                }
                progress(
                    f"  throughput {cell:14} {sent / seconds:12,.0f} reports/s "
                    f"({results[cell]['upload_megabytes_per_second']:.1f} MB/s of reports)"
                )
    finally:
        stop_server(server)
    return results


def table(results: dict) -> str:
    lines = [
        "report() latency, subset design, microseconds per call (median / p99)",
        "",
        f"{'cell':16}{'bare randomize':>18}{'up, memo off':>20}{'up, memo on':>18}"
        f"{'down, memo off':>20}{'down, memo on':>18}",
    ]
    for cell, bare in results["latency"]["bare_randomize"].items():
        row = f"{cell:16}{bare['median_us']:>9.1f} /{bare['p99_us']:>7.1f}"
        for phase in ("up", "down"):
            for key in ("memo off", "memo on"):
                r = results["latency"][phase][cell][key]
                width = 11 if key == "memo off" else 9
                row += f"{r['median_us']:>{width}.1f} /{r['p99_us']:>7.1f}"
        lines.append(row)
    lines += [
        "",
        "device-level bounds, server up, microseconds per call (median / p99)",
        "",
        f"{'cell':16}{'memo on, queue_dir':>22}{'period bound':>20}",
    ]
    for cell, r in results["latency"]["bounds"].items():
        a, b = r["memo on, queue_dir"], r["period bound"]
        lines.append(
            f"{cell:16}{a['median_us']:>13.1f} /{a['p99_us']:>7.1f}{b['median_us']:>11.1f} /{b['p99_us']:>7.1f}"
        )
    lines += [
        "",
        "report() of a number / of a category of the same design, server up (median / p99; <= 1: no dearer)",
        "",
        f"{'cell':20}{'mean only / category':>24}{'both / category per part':>28}{'both / one category':>24}",
    ]
    for cell, r in results["numeric"].items():
        row = f"{cell:20}"
        for key, width in (("mean only / category", 24), ("both parts / category per part", 28)):
            row += f"{r['ratios'][key + ', median_us']:>{width - 8}.2f} /{r['ratios'][key + ', p99_us']:>6.2f}"
        key = "both parts / one category"
        row += f"{r['ratios'][key + ', median_us']:>16.2f} /{r['ratios'][key + ', p99_us']:>6.2f}"
        lines.append(row)
    lines += ["", "upload throughput (report() .. force_flush(), memo on, batches of 512)", ""]
    for cell, r in results["throughput"].items():
        lines.append(
            f"{cell:16}{r['reports_per_second']:>14,.0f} reports/s  {r['upload_megabytes_per_second']:6.1f} MB/s"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with few calls (not a measurement)")
    parser.add_argument("--calls", type=int, default=20_000, help="report() calls per cell and mode (k <= 128)")
    parser.add_argument("--throughput-reports", type=int, default=200_000, help="reports per throughput cell (k=16)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    # The SDK logs each problem once per Reporter; killing the server on purpose is no news.
    logging.getLogger("veil.client").setLevel(logging.ERROR)
    calls = 500 if args.quick else args.calls
    # k = 1024 draws ~275 indices per fresh report: fewer calls keep the cell near a few seconds.
    per_k = {16: calls, 128: calls, 1024: max(100, calls // 4)}
    through = 5_000 if args.quick else args.throughput_reports
    per_k_through = {16: through, 128: through, 1024: max(1000, through // 8)}
    output = args.output or RESULTS_DIR / ("client-quick.json" if args.quick else "client.json")

    progress("report() latency (server up, then killed)")
    server, endpoint = start_server()
    try:
        progress("report() of numbers beside categories (server up)")
        numeric_results = run_numeric(endpoint, calls, args.seed)
        with tempfile.TemporaryDirectory(prefix="veil-bench-client-") as work:
            latency_results = run_latency(endpoint, server, per_k, args.seed, Path(work))
    finally:
        if server.poll() is None:
            stop_server(server)
    progress("upload throughput")
    throughput_results = run_throughput(per_k_through, args.seed)
    results = {
        "benchmark": "client",
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(("grpcio", "protobuf")),
        "settings": {
            "quick": args.quick,
            "mechanism": MECHANISM,
            "calls": per_k,
            "numeric_calls": calls * ROUNDS,
            "throughput_reports": per_k_through,
            "random_source": "OS CSPRNG (secrets)",
            "gc": "enabled",
            "pid": os.getpid(),
        },
        "latency": latency_results,
        "numeric": numeric_results,
        "throughput": throughput_results,
    }
    write_results(output, results)
    print(table(results))
    progress(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
