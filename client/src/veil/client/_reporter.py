"""Reporter: what an app embeds. Two lines: ``reporter = Reporter(endpoint)`` once, then
``reporter.report(metric, value)`` wherever a category, a number or a string is observed."""

from __future__ import annotations

import atexit
import math
import numbers
import operator
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from veil.mechanism import HashedSpec, MetricSpec, RandomSource, SystemRandomSource, round_name, string_code

from ._clock import bounded_clock
from ._config import resolve_config
from ._counters import Counters
from ._errors import ConfigError, InvalidNumberError, UnknownCategoryError, UnknownMetricError
from ._fs import private_dir
from ._ledger import PERIOD, Ledger, PrivacySpent
from ._log import LogOnce, logger
from ._memo import MemoStore
from ._parts import DevicePart
from ._processor import BatchProcessor
from ._specs import SpecCache
from ._worker import run_worker

__all__ = ["Reporter"]

_DEFAULT_FLUSH_TIMEOUT_S = 30.0
_DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0  # also at interpreter exit
_TEXT = (str, bytes, bytearray)  # what a strings metric takes
_SYSTEM = SystemRandomSource()


class Reporter:
    """Randomizes categories and numbers on the device and sends them to a Veil aggregator.

    ``report(metric, value)`` raises only for a call that is wrong whatever the aggregator
    declares (UnknownMetricError for a metric name that is not a string, UnknownCategoryError
    for a value that is neither a string nor a number, InvalidNumberError, an
    UnknownCategoryError, for NaN and infinities; all ReporterError and so ValueError). A metric
    or category the aggregator's specs lack (removed or renamed by an operator, or misspelt) is
    dropped, counted and logged once, as is a label reported for a numeric metric or a number
    that is no index of a metric of categories, and every problem of the network, the
    aggregator or the disk (see ``counters()``). A number reported for a numeric metric is
    reported in each of its parts (docs/protocol.md section 9), clipped to its range (counted as
    ``clipped``). A string (or bytes) reported for a strings metric is reported in the one round
    of it this device answers (docs/protocol.md section 10), or waits until that round is served.
    Settings not given fall back to the VEIL_* environment variables
    (``veil.client.environment_variables``), then to defaults.

    ``endpoint`` is the aggregator's HTTP listener as a URL (``https://agg.example.com``, or
    ``http://127.0.0.1:8080`` for plaintext): standard library only; or its gRPC address,
    ``host:port``, which needs grpcio (``pip install 'veil[grpc]'``). ``transport`` ("grpc" or
    "http", or VEIL_TRANSPORT) overrides that choice. Both give the same guarantees.

    ``memoize`` (default True) reuses one randomized response per (metric, spec, value): a
    value reported again sends the same response and spends no new privacy. Pass False to draw
    a fresh response for every report of every metric, or a mapping of metric name to bool to
    choose per metric (unlisted metrics memoize; a numeric metric's name covers its parts, a
    strings metric's its rounds). Fresh
    responses compose: each spends the metric's epsilon.

    Each metric's spec carries its reporting rule, which the Reporter enforces: at most
    ``reports_per_period`` reports of the metric leave the device per reporting period (the
    first report() calls of the period are sent, at once; later ones are not, and are counted as
    ``limited``), and a report that would spend more epsilon than the metric's budget for the
    period or the lifetime is not sent either (counted as ``over_budget``): it still takes its place
    among the period's reports, so no later value of that period is sent instead. A report whose
    spending the ledger under ``queue_dir`` cannot record (a full disk) is not sent (counted as
    ``ledger_unavailable``). Periods follow the device's clock, but never reopen once the device
    reported in a later one (a clock set back), and never run ahead of the aggregator's clock by
    more than a few minutes (a clock set ahead). ``privacy_spent()`` shows what was spent.
    ``period_budget`` and ``lifetime_budget`` (epsilon, or a mapping of metric name to epsilon)
    lower the aggregator's budgets for this app; they never raise them.

    ``random_source``, ``clock`` and ``elapsed_clock`` are for simulation and tests only: reports
    are private only with the default source, the operating system's CSPRNG, and periods follow
    the wall clock. ``clock`` is the device's clock, which may jump; ``elapsed_clock`` measures
    time passing (by default one that cannot be set and counts sleep), by which the aggregator's
    clock has moved since its last answer: a simulation in which time passes moves both.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        transport: str | None = None,
        token: str | None = None,
        tls: bool | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        queue_dir: str | os.PathLike[str] | None = None,
        max_queue_size: int | None = None,
        max_batch_size: int | None = None,
        schedule_delay_ms: int | None = None,
        export_timeout_ms: int | None = None,
        spec_ttl_ms: int | None = None,
        max_disk_bytes: int | None = None,
        retry_initial_backoff_ms: int | None = None,
        retry_max_backoff_ms: int | None = None,
        memoize: bool | Mapping[str, bool] = True,
        period_budget: float | Mapping[str, float] | None = None,
        lifetime_budget: float | Mapping[str, float] | None = None,
        random_source: RandomSource | None = None,
        clock: Callable[[], float] | None = None,
        elapsed_clock: Callable[[], float] | None = None,
    ) -> None:
        config = resolve_config(
            endpoint=endpoint,
            transport=transport,
            token=token,
            tls=tls,
            ca_file=ca_file,
            client_cert=client_cert,
            client_key=client_key,
            queue_dir=queue_dir,
            max_queue_size=max_queue_size,
            max_batch_size=max_batch_size,
            schedule_delay_ms=schedule_delay_ms,
            export_timeout_ms=export_timeout_ms,
            spec_ttl_ms=spec_ttl_ms,
            max_disk_bytes=max_disk_bytes,
            retry_initial_backoff_ms=retry_initial_backoff_ms,
            retry_max_backoff_ms=retry_max_backoff_ms,
        )
        if isinstance(memoize, bool):
            self._memoize_default, self._memoize = memoize, {}
        elif isinstance(memoize, Mapping) and all(isinstance(v, bool) for v in memoize.values()):
            self._memoize_default, self._memoize = True, dict(memoize)
        else:
            raise ConfigError("memoize must be True, False or a mapping of metric name to True or False.")
        self._period_budget = _app_budget(period_budget, "period_budget")
        self._lifetime_budget = _app_budget(lifetime_budget, "lifetime_budget")
        if random_source is not None:
            logger.warning("This Veil Reporter uses an injected random source: for simulation and tests only.")
        self._source = random_source
        log = LogOnce()
        directory = self._queue_dir(config.queue_dir, log)
        if not config.tls and config.token and not config.loopback:
            logger.warning("The Veil token travels without TLS to a remote endpoint.")
        self._specs = SpecCache(directory, log, elapsed_clock)
        # Periods and made times: the device's clock, bounded by the aggregator's (see _clock).
        self._clock = bounded_clock(clock or time.time, self._specs.server_now)
        self._specs.load()
        self._memo = MemoStore(directory, log)
        self._parts: dict[str, DevicePart] = {}  # by fingerprint: this device's, of its secret
        self._rounds: dict[str, int] = {}  # strings metric -> the round this device answers (its secret's)
        self._ledger = Ledger(directory, log)
        self._processor = BatchProcessor(
            replace(config, queue_dir=directory), self._specs, self._memo, self._ledger, log, run_worker
        )
        ref = weakref.ref(self)
        self._exit_hook = lambda: (reporter := ref()) is not None and reporter.shutdown(_DEFAULT_SHUTDOWN_TIMEOUT_S)
        atexit.register(self._exit_hook)

    @staticmethod
    def _queue_dir(path: Path | None, log: LogOnce) -> Path | None:
        if path is None:
            return None
        try:
            return private_dir(path)
        except OSError:
            log.warning("queue_dir", "The Veil queue directory cannot be created; keeping everything in memory.")
            return None

    # --- the two-line API -----------------------------------------------------------------

    def report(self, metric: str, value: str | bytes | float) -> None:
        """Randomize ``value`` (a category label or index of ``metric``, a number of a numeric
        metric, reported in each of its parts, or a string or bytes of a strings metric, reported
        in this device's round of it) and queue the report.

        Never blocks on the network, never raises because of what the aggregator declares: a
        metric or category its specs lack drops the report and counts it; before any spec is
        known (a first start offline), or while a strings metric's round this device answers is
        not served, the call waits in the bounded queue, as made, and is randomized once specs
        bring it. Raises UnknownMetricError when ``metric`` is not a string,
        UnknownCategoryError when ``value`` is neither a string, bytes nor a number (a bool is
        not one), InvalidNumberError when it is NaN or an infinity."""
        if not isinstance(metric, str):
            raise UnknownMetricError("A metric name must be a string.")
        self._report(metric, value, self._clock())

    def _report(self, metric: str, value: object, now: float) -> None:
        """report() of a call made at ``now`` (Unix seconds): its period and its batch's made_unix."""
        entry = self._specs.entries.get(metric)
        if entry is not None:
            spec, labels = entry
            if isinstance(value, str):
                index = labels.get(value)
            elif isinstance(value, _TEXT):
                return self._processor.drop_logged("not-strings", metric=metric)
            else:
                index = _index(spec, value)
            if index is None:
                return self._processor.drop_logged("unknown-category", metric=metric)
            return self._send(spec, index, now)
        parts = self._specs.numeric.get(metric)
        if parts is None:
            rounds = self._specs.strings.get(metric)
            if rounds is not None:
                return self._report_string(metric, rounds, value, now)
            return self._report_unknown(metric, value, now)
        # A number, reported in each part as a category of it (docs/protocol.md section 9): the
        # work per part is what a category's report() does, plus its category from the number.
        if type(value) is float and value - value == 0.0:  # a finite float, the common case, without a call
            number = value
        elif isinstance(value, str):
            return self._processor.drop_logged("numeric-label", metric=metric)
        elif isinstance(value, _TEXT):
            return self._processor.drop_logged("not-strings", metric=metric)
        else:
            number = _number(value)
        clipped = False
        for spec, numeric in parts:
            part = self._parts.get(spec.fingerprint)
            if part is None or part.spec is not spec:  # first used, or served again (budgets may change)
                part = self._parts[spec.fingerprint] = DevicePart(
                    spec, numeric, self._memo, self._memoizes(spec), self._budgets(spec)
                )
            if numeric.low <= number <= numeric.high:  # the common case, without a call
                inside = number
            else:
                inside, clipped = numeric.clip(number)[0], True
            self._send(spec, numeric.category(inside, part.alpha), now, part)
        if clipped:
            self._processor.count_clipped()

    def _report_string(self, metric: str, rounds: Mapping[int, MetricSpec], value: object, now: float) -> None:
        """report() of a strings metric (docs/protocol.md section 10): the value's code, whose
        prefix is randomized under this device's round; the value waits while that round is not
        served, within its period."""
        if not isinstance(value, _TEXT):
            _number(value)  # misuse raises whatever the specs say
            return self._processor.drop_logged("strings-value", metric=metric)
        # The value itself is kept no longer (a code's code is the code); a bytearray may change.
        code = string_code(bytes(value) if isinstance(value, bytearray) else value)
        answered = self._rounds.get(metric)
        if answered is None:
            answered = self._rounds[metric] = self._memo.round(metric)
        spec = rounds.get(answered)
        if spec is None and round_name(metric, answered) in self._specs.refused:
            return self._processor.drop_logged("refused")
        # The rounds change every period, and a round counts only the values made in its own: the
        # specs held must have been the aggregator's in the value's period (not, say, yesterday's
        # cached on disk), or the value waits for an answer that is.
        period = spec if spec is not None else next(iter(rounds.values()))
        answered_at = self._specs.answered_at()
        if period.period_index(now) < period.period_index(self._clock()):
            # Its period is over: its round's counts chose the next round's parents already.
            return self._processor.drop_logged("strings-expired", metric=metric)
        if spec is None or answered_at is None or period.period_index(answered_at) < period.period_index(now):
            return self._processor.wait_for_round(weakref.WeakMethod(self._report), metric, code, now)
        assert spec.strings is not None
        self._send(spec, spec.strings.prefix_of(code), now)

    def _report_unknown(self, metric: str, value: object, now: float) -> None:
        """report() of a metric the specs do not declare, or of any before they are known."""
        if not isinstance(value, _TEXT):
            _number(value)  # misuse raises whatever the specs say
        if not self._specs.ready.is_set():
            if self._processor.hold(weakref.WeakMethod(self._report), metric, value, now):
                return
            return self._report(metric, value, now)  # the specs arrived meanwhile
        if metric in self._specs.refused:
            return self._processor.drop_logged("refused")
        named = self._specs.specs.get(metric)
        if named is not None:  # a numeric metric's part or a strings metric's round, by its own name
            return self._processor.drop_logged("numeric-part" if named.numeric else "strings-round", metric=metric)
        return self._processor.drop_logged("unknown-metric", metric=metric)

    def _send(self, spec: MetricSpec, value: int | bytes, now: float, part: DevicePart | None = None) -> None:
        """Admit, randomize (or resend the memoized response) and queue a report of a category
        index (of a numeric metric's ``part``, with what this device keeps for it), or of a
        prefix (``spec`` a strings metric's round)."""
        try:
            period = spec.period_index(now)
            if self._ledger.full(spec.name, period, spec.reports_per_period):
                return self._processor.refuse(PERIOD)  # the common case of a repeat: no lock, no disk
            if not self._processor.has_room():  # do not randomize what would be dropped
                return self._processor.drop_logged("closed" if self._processor.stopped else "full")
            if part is not None:
                memo_key = part.memo_key(value) if part.memoize and isinstance(value, int) else None
                budgets = part.budgets
            else:
                memo_key = self._memo_key(spec, value) if self._memoizes(spec) else None
                budgets = self._budgets(spec)
            # A new randomized response spends epsilon; one memoized before, nothing new.
            cost = 0.0 if memo_key is not None and self._memo.known(memo_key) else spec.mechanism.epsilon
            refused = self._ledger.admit(spec, period, cost, *budgets)
            if refused is not None:
                return self._processor.refuse(refused)
            self._processor.submit(spec, self._randomize(spec, value, memo_key), now)
        except Exception:  # noqa: BLE001 (never raised into the app: the report is dropped, counted)
            self._processor.drop_logged("error")

    def _memo_key(self, spec: MetricSpec, value: int | bytes) -> bytes:
        """The memo key of a category index, or of a strings round's prefix: keyed by the round's
        design, not its fingerprint, so a prefix's report outlives the round's parents."""
        if isinstance(value, int):
            return self._memo.key(spec.name, spec.fingerprint, value)
        return self._memo.strings_key(spec.name, spec.design, value)

    def _memoizes(self, spec: MetricSpec) -> bool:
        memoize = self._memoize.get(spec.name)
        if memoize is None:  # a numeric metric's name covers its parts, a strings metric's its rounds
            metric = _metric_of(spec)
            memoize = None if metric is None else self._memoize.get(metric)
        return self._memoize_default if memoize is None else memoize

    def _budgets(self, spec: MetricSpec) -> tuple[float | None, float]:
        """The metric's (period, lifetime) budgets: the aggregator's, or this app's where lower. A
        period budget of None: neither set one, and the period's reports are its only bound."""
        app, lifetime = self._period_budget(spec.name), self._lifetime_budget(spec.name)
        if spec.strings is not None:  # a strings metric's name covers its rounds (the lower wins)
            app = min(app, self._period_budget(spec.strings.metric))
            lifetime = min(lifetime, self._lifetime_budget(spec.strings.metric))
        period = spec.period_budget if spec.period_budget is not None and spec.period_budget <= app else app
        return None if math.isinf(period) else period, min(spec.epsilon_lifetime, lifetime)

    def _randomize(self, spec: MetricSpec, value: int | bytes, memo_key: bytes | None) -> tuple[int, ...]:
        mechanism, source = spec.mechanism, _SYSTEM if self._source is None else self._source

        def draw() -> tuple[int, ...]:
            if isinstance(value, int):
                return mechanism.randomize(value, source)
            assert isinstance(mechanism, HashedSpec)
            return mechanism.randomize_prefix(value, source)

        return draw() if memo_key is None else self._memo.response_for(memo_key, draw)

    # --- lifecycle ------------------------------------------------------------------------

    def force_flush(self, timeout: float | None = _DEFAULT_FLUSH_TIMEOUT_S) -> bool:
        """Send every queued report now; True when all were acknowledged (or failed for good)
        within ``timeout`` seconds."""
        return self._processor.force_flush(timeout)

    def shutdown(self, timeout: float | None = _DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Stop accepting reports and send what is queued, for at most ``timeout`` seconds.
        With a queue directory what is left stays on disk for the next Reporter (and no time
        is spent waiting out retries); without one it is dropped and counted. True when
        everything was delivered. Idempotent."""
        atexit.unregister(self._exit_hook)
        return self._processor.shutdown(timeout)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- what the app can read ------------------------------------------------------------

    def counters(self) -> Counters:
        """A snapshot of accepted, dropped, sent, retried, failed and queued reports."""
        return self._processor.counters()

    def wait_for_specs(self, timeout: float | None = None) -> bool:
        """Block until metric specs are known (from the queue directory or the aggregator);
        optional: report() never waits. True when they are."""
        return self._specs.ready.wait(timeout)

    def privacy_spent(self) -> dict[str, PrivacySpent]:
        """Per metric known to this device: the reports sent and the epsilon spent in the current
        reporting period and over the device's lifetime, beside the budgets in force. Lifetime
        means as long as this device's ledger lives: under ``queue_dir``, until its files are
        deleted; without one, this process."""
        now = self._clock()
        return {name: self._ledger.spent(spec, now, *self._budgets(spec)) for name, spec in self._specs.specs.items()}

    @property
    def metrics(self) -> Mapping[str, MetricSpec]:
        """The metric specs in use, by name (empty until specs are known)."""
        return self._specs.specs

    # --- simulation -----------------------------------------------------------------------

    def simulated_device(self) -> Reporter:
        """Another device, for simulations and demos of many devices in one process: a Reporter
        with its own device secret, memo and privacy ledger (in memory), whose report() applies
        the same rules, sending through this Reporter's specs, queue and connection. What leaves
        it is what would leave a device of its own: its reports within its own ledger's bounds,
        randomized with its own memo. counters(), force_flush() and shutdown() are the shared
        queue's (shutting any of them down shuts it down for all). With an injected
        ``random_source`` its device secret is drawn from it too, so a seeded simulation of many
        devices (their rounding thresholds and memo keys) is reproducible."""
        device = Reporter.__new__(Reporter)
        vars(device).update(vars(self))  # the settings, specs, queue and connection
        log = self._processor.log
        source = self._source
        secret = None if source is None else b"".join(source.bits64().to_bytes(8, "little") for _ in range(4))
        device._memo, device._ledger = MemoStore(None, log, secret), Ledger(None, log)
        device._parts, device._rounds = {}, {}  # its own secret's
        return device


def _metric_of(spec: MetricSpec) -> str | None:
    """The name apps report a numeric metric's part or a strings metric's round under."""
    if spec.numeric is not None:
        return spec.numeric.metric
    return None if spec.strings is None else spec.strings.metric


def _index(spec: MetricSpec, value: object) -> int | None:
    """The index ``value`` (not a string) names in ``spec``; None when the spec has no such index,
    or ``value`` is a number that is no index (a server-side matter: a metric may become numeric);
    UnknownCategoryError when it is neither an index nor a number of any metric."""
    try:
        # operator.index, not isinstance(value, SupportsIndex): a Protocol check costs more than
        # the rest of a report().
        index = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        index = None
    if index is None:
        _number(value)  # raises unless a number
        return None
    return index if 0 <= index < spec.k else None


def _number(value: object) -> float:
    """A reported number (not a string) as a float; UnknownCategoryError when it is not a number
    (a bool is not), InvalidNumberError when it is NaN or an infinity. The value is never repeated
    in the message: it may be private."""
    if isinstance(value, float):  # and its subclasses (numpy's float64): the common case first
        number = value
    elif isinstance(value, (int, numbers.Real)) and not isinstance(value, bool):  # numpy's others, Fraction
        try:
            number = float(value)  # an int or Fraction beyond any double: clipped like any number past the range
        except OverflowError:
            return sys.float_info.max if value > 0 else -sys.float_info.max  # type: ignore[operator]
    else:
        raise UnknownCategoryError(
            "A value is a category label (a string), a category index or a number (an int or a float, not a bool)."
        )
    if number - number != 0.0:  # NaN or an infinity: x - x is NaN for both
        raise InvalidNumberError("A number reported must be finite, not NaN or an infinity.")
    return number


def _app_budget(value: float | Mapping[str, float] | None, name: str) -> Callable[[str], float]:
    """An app's budget setting (an epsilon for every metric, or one per metric) as metric -> epsilon."""

    def checked(budget: object) -> float:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ConfigError(f"{name} must be an epsilon above 0, or a mapping of metric name to one.")
        return float(budget)

    if value is None:
        return lambda metric: math.inf
    if isinstance(value, Mapping):
        budgets = {str(metric): checked(budget) for metric, budget in value.items()}
        return lambda metric: budgets.get(metric, math.inf)
    budget = checked(value)
    return lambda metric: budget
