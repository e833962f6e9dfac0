"""`veil demo`: the whole system on one machine.

An aggregator on the embedded SQLite store (in a temporary directory removed at exit, or
--data-dir to keep the counts; Redis with --redis, under a key namespace drawn for the run and
removed at exit), simulated devices that report through the real SDK over gRPC, the dashboard on
the HTTP listener, and a terminal table of live estimates (read over gRPC) with their 95%
intervals beside the truth, made to fit an 80x24 terminal. Ctrl-C stops everything cleanly.

Each simulated device is a device of the SDK's own (Reporter.simulated_device: its own device
secret, memo and privacy ledger, the SDK's defaults: memoization on, the metric's reporting
period), and holds its own true value of each metric, drawn from a hidden distribution; at every
period's turn a few devices draw a new value. The devices share one Reporter's queue and gRPC
connection, as behind one gateway, so tens of thousands cost little more than their ledgers and
memos. The app calls report() again and again; what leaves each device is the metric's rule: one
randomized report per period. So the estimates are of the share of devices, as docs/estimates.md
describes, and the all-time window's intervals allow for each device
reporting in every period.

Beside the metrics of categories, a numeric one (LOAD_MS, page load time in milliseconds): each
device holds a number drawn from a known lognormal distribution and reports it with report(name,
number), which the SDK reports in both parts (docs/protocol.md 9); the screen shows the mean and
the quantiles beside the distribution's own. And a strings one (CRASHES, crash signatures): each
device holds a signature, a few common ones or one of its own, reports it with report(name,
text), and the aggregator finds the common ones seven periods in, a round a period
(docs/protocol.md 10); the screen shows what it found beside the truth (a value longer than 6
bytes, which the aggregator knows by its hash, as its text beside the hash)."""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import random
import secrets
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoMetric:
    name: str
    labels: tuple[str, ...]
    mechanism: str
    epsilon: float
    truth: tuple[float, ...]  # the hidden distribution the simulated devices draw from


def _zipf(k: int, s: float) -> tuple[float, ...]:
    weights = [1.0 / (i + 1) ** s for i in range(k)]
    total = sum(weights)
    return tuple(w / total for w in weights)


@dataclass(frozen=True)
class DemoNumeric:
    """A numeric metric of the demo: each device's value is drawn from a lognormal distribution
    (median, sigma of its log), clipped to the range on the device, as docs/protocol.md 9 says."""

    name: str
    low: float
    high: float
    buckets: tuple[float, ...]
    epsilon: float  # both parts together; the mean and the distribution get half each
    median: float
    sigma: float

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median), self.sigma)

    @property
    def truth_mean(self) -> float:
        """The mean of the clipped values: E[min(X, high)] for X lognormal (low is 0 here)."""
        mu, s = math.log(self.median), self.sigma
        z = (math.log(self.high) - mu) / s
        below = math.exp(mu + s * s / 2) * _normal_cdf(z - s)  # E[X; X < high]
        return below + self.high * (1.0 - _normal_cdf(z))

    def truth_quantile(self, q: float) -> float:
        return min(self.high, self.median * math.exp(self.sigma * _normal_quantile(q)))


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _normal_quantile(q: float) -> float:
    """The standard normal's q-quantile (bisection on the CDF: the demo needs three, once)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _normal_cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class DemoStrings:
    """A strings metric of the demo: each device holds one of `common` (text, share) or, with
    the rest of the chance, a signature of its own that no other device holds."""

    name: str
    epsilon: float
    common: tuple[tuple[str, float], ...]

    def draw(self, rng: random.Random) -> str:
        x = rng.random()
        for text, share in self.common:
            if x < share:
                return text
            x -= share
        return f"crash at 0x{rng.getrandbits(48):012x}"

    def truth(self, shown: str) -> float:
        """The share of a found value, by how the aggregator shows it (a long one as its hash)."""
        return sum(share for text, share in self.common if _shown(text) == shown)

    def text(self, shown: str) -> str:
        """A found value as the demo, which knows the truth, can name it: a long one's text
        beside its hash (the aggregator knows only the hash)."""
        return next((f"{text[:19]}.. {shown[:7]}" for text, _ in self.common if _shown(text) == shown != text), shown)


def _shown(text: str) -> str:
    from veil.mechanism import code_text, string_code

    return code_text(string_code(text))


CRASHES = DemoStrings(
    "crash_signature",
    8.0,
    (
        ("SIGSEGV", 0.12),
        ("ANR", 0.07),
        ("OOM", 0.05),
        ("NullPointerException in FeedAdapter.bind", 0.03),
        ("SIGABRT", 0.02),
    ),
)

# Page load times in milliseconds: median 400 ms, a long tail (q99 about 3.2 s).
LOAD_MS = DemoNumeric("load_ms", 0.0, 10000.0, (100, 250, 500, 1000, 2500, 5000), 4.0, 400.0, 0.9)

DEMO_METRICS = (
    DemoMetric(
        "browser",
        ("chrome", "safari", "edge", "firefox", "samsung", "opera", "uc", "yandex", "brave", "other"),
        "subset",
        1.0,
        _zipf(10, 1.2),
    ),
    DemoMetric("country", tuple(f"country-{i:03d}" for i in range(100)), "subset", 2.0, _zipf(100, 1.1)),
    DemoMetric("crash_screen", tuple(f"screen-{i:02d}" for i in range(16)), "rappor", 2.0, _zipf(16, 0.8)),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop after this long and exit 0 (default 0: run until Ctrl-C)",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=20_000,
        help="simulated devices, each with its own values, device secret, memo and privacy ledger (default 20000)",
    )
    parser.add_argument(
        "--period",
        default="10s",
        metavar="DURATION",
        help="the demo metrics' reporting period: each device sends one report of each metric per "
        "period (default 10s, so that periods turn while you watch; real metrics use 1d)",
    )
    parser.add_argument(
        "--calls",
        type=float,
        default=5.0,
        metavar="N",
        help="report() calls of each metric per device and period, as an app makes them; all but "
        "the first are kept on the device (default 5)",
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.05,
        metavar="P",
        help="share of devices that draw a new value at each period's turn (default 0.05)",
    )
    parser.add_argument("--redis", metavar="URL", help="count in this Redis instead of the embedded SQLite store")
    parser.add_argument(
        "--data-dir",
        metavar="PATH",
        help="keep the SQLite store (veil.db) in this directory, and its counts across runs "
        "(default: a temporary directory, removed at exit)",
    )
    parser.add_argument(
        "--grpc",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="gRPC listener (default 127.0.0.1:50051; a free port if taken)",
    )
    parser.add_argument(
        "--http",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="HTTP listener with the dashboard (default 127.0.0.1:8080; a free port if taken)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between table refreshes (default 1)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed the hidden population's draws")


def _config(args: argparse.Namespace, store_url: str, grpc_address: str, http_address: str):
    from veil.aggregator.config import parse_config
    from veil.mechanism import parse_duration

    # The period's window, and the 1h and 1d ones the README's tour reads: by span, the
    # tour's names winning (a --period of 1h or 24h is one of them).
    windows = {parse_duration(span): span for span in (args.period, "1h", "1d")}
    return parse_config(
        {
            "server": {
                "grpc": grpc_address,
                "http": http_address,
                "min_n": 100,
                "watch_interval": 0.5,
                "grace_period": 2.0,
            },
            "store": {"url": store_url},
            "metrics": [
                {
                    "name": m.name,
                    "labels": list(m.labels),
                    "mechanism": m.mechanism,
                    "epsilon": m.epsilon,
                    "period": args.period,
                    "windows": ["total", *windows.values()],
                }
                for m in DEMO_METRICS
            ]
            + [
                {
                    "name": LOAD_MS.name,
                    "type": "numeric",
                    "range": [LOAD_MS.low, LOAD_MS.high],
                    "buckets": list(LOAD_MS.buckets),
                    "epsilon": LOAD_MS.epsilon,
                    "period": args.period,
                    "windows": ["total", *windows.values()],
                },
                {"name": CRASHES.name, "type": "strings", "epsilon": CRASHES.epsilon, "period": args.period},
            ],
        }
    )


def _start_aggregator(args: argparse.Namespace, store_url: str, store=None):
    """The aggregator on the asked-for ports, or free ones where those are taken; on the store
    store() opens, if given, else on the one the URL names."""
    from veil.aggregator.daemon import Aggregator
    from veil.aggregator.errors import ConfigError

    for grpc_address, http_address in ((args.grpc, args.http), ("127.0.0.1:0", "127.0.0.1:0")):
        try:
            aggregator = Aggregator(
                _config(args, store_url, grpc_address, http_address), store=None if store is None else store()
            )
        except ConfigError as err:
            if "cannot listen" not in str(err):
                raise
            print(f"({err} Using free ports.)", file=sys.stderr)
            continue
        aggregator.start()
        return aggregator
    raise ConfigError("Cannot find free ports for the demo.")


class _Population:
    """The simulated devices: each a device of the SDK's own (Reporter.simulated_device: its
    own device secret, memo and privacy ledger, the SDK's report()), all sending through one
    Reporter's queue and connection, as if behind one gateway; so twenty thousand cost about
    what one Reporter and their ledgers and memos do, not twenty thousand threads and channels.
    Each device holds its own true value of each metric, drawn from the hidden distribution."""

    def __init__(self, endpoint: str, args: argparse.Namespace) -> None:
        from veil.client import Reporter

        self.rng = random.Random(args.seed)
        # At exit the shared queue may still hold a period's reports: shutting down without
        # them is no news in a demo, and its warning would only follow the final line.
        logging.getLogger("veil.client").setLevel(logging.ERROR)
        self.uplink = Reporter(
            endpoint,
            tls=False,
            schedule_delay_ms=250,
            max_batch_size=10_000,  # the aggregator's max_batch caps it
            # every device's reports of one period: one per metric, one per part of the numeric one,
            # one of the strings one
            max_queue_size=(len(DEMO_METRICS) + 3) * args.devices,
        )
        self.devices = [self.uplink] + [self.uplink.simulated_device() for _ in range(args.devices - 1)]
        self.cumulative = [list(itertools.accumulate(m.truth)) for m in DEMO_METRICS]
        # values[m][d]: the value device d holds of metric m; numbers[d]: its page load time
        self.values = [self._draw(m, args.devices) for m in range(len(DEMO_METRICS))]
        self.numbers = [LOAD_MS.draw(self.rng) for _ in range(args.devices)]
        self.crashes = [CRASHES.draw(self.rng) for _ in range(args.devices)]

    def _draw(self, m: int, count: int) -> list[int]:
        return self.rng.choices(range(len(DEMO_METRICS[m].labels)), cum_weights=self.cumulative[m], k=count)

    def churn(self, share: float) -> None:
        """A period's turn: each device draws new values with chance `share`."""
        for d in _chosen(self.rng, len(self.devices), share):
            for m, held in enumerate(self.values):
                held[d] = self._draw(m, 1)[0]
            self.numbers[d] = LOAD_MS.draw(self.rng)
            self.crashes[d] = CRASHES.draw(self.rng)

    def calls(self, chance: float) -> None:
        """One tick of the apps: each device calls report() for each metric with this chance."""
        for metric, held in zip(DEMO_METRICS, self.values):
            for d in _chosen(self.rng, len(self.devices), chance):
                self.devices[d].report(metric.name, held[d])
        for d in _chosen(self.rng, len(self.devices), chance):
            self.devices[d].report(LOAD_MS.name, self.numbers[d])  # a number: the SDK reports both parts
        for d in _chosen(self.rng, len(self.devices), chance):
            self.devices[d].report(CRASHES.name, self.crashes[d])  # a string: the SDK answers its round


def _chosen(rng: random.Random, count: int, chance: float) -> Iterator[int]:
    """The indices below `count` that each come up with `chance`, in order: geometric gaps
    between them, so the cost is the number chosen rather than `count`."""
    if chance >= 1:
        yield from range(count)
        return
    if chance <= 0:
        return
    miss = math.log1p(-chance)
    i = -1
    while (i := i + 1 + int(math.log(1.0 - rng.random()) / miss)) < count:
        yield i


def _devices(endpoint: str, args: argparse.Namespace, period: int, stop: threading.Event) -> threading.Thread:
    """The simulated devices, made and driven by one thread: every tick each device calls
    report() for each metric with the chance that makes --calls calls a period, with the value
    it holds; at every period's turn --churn of them draw new values."""
    tick = 0.1
    chance = min(1.0, args.calls * tick / period)

    def drive() -> None:
        population = _Population(endpoint, args)
        try:
            population.uplink.wait_for_specs(10)
            turn = int(time.time() // period)
            while not stop.wait(tick):
                if int(time.time() // period) != turn:
                    turn = int(time.time() // period)
                    population.churn(args.churn)
                population.calls(chance)
        finally:
            population.uplink.shutdown(0.5)

    thread = threading.Thread(target=drive, name="veil-demo-devices", daemon=True)
    thread.start()
    return thread


WIDTH, HEIGHT = 80, 23  # an 80x24 terminal, its last line left for the cursor
_ROWS_SHOWN = 2  # each metric's categories with the largest truths


def frame(
    clock: str, dashboard: str, endpoint: str, devices: int, hint: str, windows, error: str = ""
) -> tuple[list[str], int, int]:
    """One screen of the demo, at most WIDTH x HEIGHT: where everything is (and `hint`), then
    each metric's largest categories, from `windows` (WindowEstimate messages by metric name)
    or, when they could not be read, `error`; and how many categories' truths lie inside their
    95% intervals (all categories, not only those shown), out of how many."""
    lines = [
        f"{clock}  Veil demo: dashboard {dashboard}  gRPC {endpoint}",
        f"{devices:,} simulated devices, each with its own ledger and memo. {hint}".rstrip(),
    ]
    if error:
        return [line[:WIDTH] for line in lines + [""] + textwrap.wrap(error, WIDTH, max_lines=3)], 0, 0
    said = f"Estimates of the {windows[DEMO_METRICS[0].name].estimand}."
    lines += textwrap.wrap(said, WIDTH, max_lines=2, placeholder=" ... (the dashboard says it all)")
    lines.append(f"{'in % (largest truths first)':<30}{'truth':>8}{'estimate':>10}   95% interval")
    inside = total = 0
    for metric in DEMO_METRICS:
        table, hits, count = render(metric, windows[metric.name])
        lines += table
        inside, total = inside + hits, total + count
    table, hits, count = render_numeric(
        LOAD_MS, windows[f"{LOAD_MS.name}.mean"], windows[f"{LOAD_MS.name}.distribution"]
    )
    lines += table
    inside, total = inside + hits, total + count
    table, hits, count = render_strings(CRASHES, windows.get(CRASHES.name))
    lines += table
    inside, total = inside + hits, total + count
    lines.append(f"{inside} of {total} truths inside their 95% intervals; every category on the dashboard.")
    return [line[:WIDTH] for line in lines], inside, total


def render(metric: DemoMetric, window) -> tuple[list[str], int, int]:
    """The lines of one metric (a WindowEstimate message): its head and its largest categories,
    and how many categories' truths lie inside their 95% intervals, out of how many."""
    head = (
        f"{metric.name}: {metric.mechanism}, k = {len(metric.labels)}, epsilon = {metric.epsilon:g}, n = {window.n:,}"
    )
    if window.withheld:
        reason = textwrap.wrap(f"withheld: {window.reason}", WIDTH, initial_indent="  ", subsequent_indent="  ")
        return [head, *reason[:_ROWS_SHOWN]], 0, 0
    inside = [c.lower <= t <= c.upper for c, t in zip(window.categories, metric.truth)]
    lines = [f"{head} ({sum(inside)}/{len(inside)} inside)"]
    for j in sorted(range(len(metric.labels)), key=lambda j: -metric.truth[j])[:_ROWS_SHOWN]:
        c = window.categories[j]
        lines.append(
            f"  {c.label:<28}{100 * metric.truth[j]:>8.1f}{100 * c.estimate:>10.1f}"
            f"   [{100 * c.lower:>5.1f}, {100 * c.upper:>5.1f}]" + ("" if inside[j] else "  outside")
        )
    return lines, sum(inside), len(inside)


def render_numeric(metric: DemoNumeric, mean, distribution) -> tuple[list[str], int, int]:
    """The lines of the numeric metric (its parts' WindowEstimate messages): its head, its mean
    and its quantiles beside their truths, in milliseconds, and how many of those truths lie
    inside their 95% intervals, out of how many."""
    n = max(mean.n, distribution.n)
    half = metric.epsilon / 2
    head = f"{metric.name}: numeric, in ms, epsilon = {metric.epsilon:g} ({half:g} + {half:g}), n = {n:,}"
    rows = []  # (name, truth, estimate, lower, upper)
    if not mean.withheld:
        rows.append(("mean", metric.truth_mean, mean.mean.estimate, mean.mean.lower, mean.mean.upper))
    for q in [] if distribution.withheld else distribution.quantiles:
        rows.append((f"q{100 * q.q:g}", metric.truth_quantile(q.q), q.estimate, q.lower, q.upper))
    if not rows:
        reason = mean.reason or distribution.reason
        return (
            [head, *textwrap.wrap(f"withheld: {reason}", WIDTH, initial_indent="  ", subsequent_indent="  ")[:2]],
            0,
            0,
        )
    inside = [lower <= truth <= upper for _, truth, _, lower, upper in rows]
    lines = [f"{head} ({sum(inside)}/{len(inside)} inside)"]
    for (name, truth, estimate, lower, upper), hit in zip(rows, inside):
        lines.append(
            f"  {name:<28}{truth:>8.0f}{estimate:>10.0f}   [{lower:>5.0f}, {upper:>5.0f}]"
            + ("" if hit else "  outside")
        )
    return lines, sum(inside), len(inside)


def render_strings(metric: DemoStrings, window) -> tuple[list[str], int, int]:
    """The lines of the strings metric (its WindowEstimate message, None before any): its head
    with the detection floor, and the values found with the largest shares beside their truths,
    and how many found values' truths lie inside their 95% intervals, out of how many found."""
    head = f"{metric.name}: strings, epsilon = {metric.epsilon:g}"
    if window is None or window.withheld or not window.HasField("strings"):
        reason = "" if window is None else window.reason
        wrapped = textwrap.wrap(f"{head}: {reason or 'no estimate yet'}", WIDTH, subsequent_indent="  ")
        return wrapped[:2], 0, 0
    found = window.strings.values
    inside = [v.lower <= metric.truth(v.text) <= v.upper for v in found]
    lines = [
        f"{head}, n = {window.n:,}, floor {100 * window.strings.floor:.1f}%: {sum(inside)}/{len(inside)} found inside"
    ]
    for v, hit in list(zip(found, inside))[:_ROWS_SHOWN]:
        lines.append(
            f"  {metric.text(v.text)[:28]:<28}{100 * metric.truth(v.text):>8.1f}{100 * v.estimate:>10.1f}"
            f"   [{100 * v.lower:>5.1f}, {100 * v.upper:>5.1f}]" + ("" if hit else "  outside")
        )
    return lines, sum(inside), len(inside)


def run(args: argparse.Namespace) -> int:
    from veil.mechanism import MechanismError, parse_duration

    from . import CliError

    if args.calls <= 0 or args.devices < 1 or args.interval <= 0 or args.duration < 0 or not 0 <= args.churn <= 1:
        raise CliError(
            "--calls and --interval must be above 0, --devices at least 1, --duration at least 0, --churn from 0 to 1."
        )
    try:
        period = parse_duration(args.period)
    except MechanismError as err:
        raise CliError(f"--period: {err}") from None
    if args.redis:
        return _run_on_redis(args, period)
    directory = Path(args.data_dir or tempfile.mkdtemp(prefix="veil-demo-")).absolute()
    temporary = None if args.data_dir else directory
    where = f"SQLite ({directory}/veil.db" + (", removed at exit)" if temporary else ")")
    try:
        return _run(args, f"sqlite://{directory.as_posix()}/veil.db", where, period)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _run_on_redis(args: argparse.Namespace, period: int) -> int:
    """The demo counting in Redis under a namespace of its own, drawn for this run: it starts
    from no counts, and at exit deletes its keys and no other (a shared Redis may hold others)."""
    from veil.aggregator.errors import StoreError
    from veil.aggregator.store import RedisStore

    from . import CliError

    namespace = f"demo-{secrets.token_hex(4)}"
    keys = f"veil:{{{namespace}:...}}"

    def store() -> RedisStore:
        try:
            return RedisStore(args.redis, namespace=namespace)
        except ValueError as err:
            raise CliError(f"--redis: {err}") from None

    store().close()  # a bad URL is one sentence now, before anything starts
    done = False
    try:
        code = _run(args, args.redis, f"Redis (keys {keys}, removed at exit)", period, store)
        done = True
        return code
    finally:
        leftover = store()
        try:
            leftover.remove_namespace()
        except StoreError as err:
            if done:  # a demo that never started (Redis unreachable) has said why already
                print(f"The demo's Redis keys ({keys}) stay: {err}.", file=sys.stderr)
        finally:
            leftover.close()


def _run(args: argparse.Namespace, store_url: str, where: str, period: int, store=None) -> int:
    import grpc

    from veil.aggregator.errors import StoreError
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    from . import CliError

    aggregator = _start_aggregator(args, store_url, store)
    endpoint = f"127.0.0.1:{aggregator.grpc_port}"
    if args.redis:
        try:  # at once, in one line: not an UNAVAILABLE from the first estimates read 10 s later
            aggregator.store.ping()
        except StoreError as err:
            aggregator.stop(grace=0)
            raise CliError(f"--redis: {err}.") from None
    stop = threading.Event()
    # A kill, or the terminal closed, stops the demo as Ctrl-C does: its temporary store or
    # Redis keys are removed all the same.
    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, lambda *_: stop.set())
    devices = [_devices(endpoint, args, period, stop)]
    live = sys.stdout.isatty()
    dashboard = f"http://127.0.0.1:{aggregator.http_port}/"
    print(f"Veil demo: aggregator on {where}, gRPC {endpoint}.")
    print(f"Dashboard: {dashboard}   (JSON: /v1/estimates, Prometheus: /metrics)")
    print(
        textwrap.fill(
            f"{args.devices:,} simulated devices, each with its own privacy ledger and memo, call report() about "
            f"{args.calls:g} times per metric and {args.period} period; each sends one randomized report per "
            "period. " + ("Ctrl-C stops." if not args.duration else ""),
            WIDTH,
        )
    )
    deadline = time.monotonic() + args.duration if args.duration else None
    hint = "" if args.duration else "Ctrl-C stops."
    inside = total = 0
    try:
        with grpc.insecure_channel(endpoint) as channel:
            stub = veil_pb2_grpc.EstimatesStub(channel)
            while not stop.wait(args.interval):
                try:
                    response = stub.Get(veil_pb2.EstimatesRequest(window="total"), timeout=10)
                    found = stub.Get(veil_pb2.EstimatesRequest(metric=CRASHES.name), timeout=10)
                except grpc.RpcError as err:  # e.g. Redis went away: say so and keep going
                    windows, error = {}, f"estimates unavailable: {err.code().name} ({err.details()})"
                else:
                    windows = {w.metric: w for w in (*response.estimates, *found.estimates)}
                    error = ""
                # The redrawn screen keeps where everything is (the ports may not be the defaults).
                lines, hits, count = frame(
                    time.strftime("%H:%M:%S"), dashboard, endpoint, args.devices, hint, windows, error
                )
                if not error:
                    inside, total = hits, count
                if live:
                    print("\x1b[H\x1b[2J", end="")  # redraw in place on a terminal
                print("\n".join(lines), flush=True)
                if deadline and time.monotonic() >= deadline:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for t in devices:
            t.join(timeout=5)
        aggregator.stop(grace=1.0)
    if total:
        print(f"final: {inside} of {total} truths (categories, the mean, quantiles) inside their 95% intervals.")
    return 0
