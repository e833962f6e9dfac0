"""The current estimates of every metric and window, recomputed only when their counts change.

Each bucket's counts carry a version (kept by the store, new with every write, never reused;
a tuple of one per shard where the store splits a bucket over shards), so one cheap round trip
tells which cached estimates are stale; only those are read and
recomputed. Several aggregator processes may share a store: the versions see their writes too.

Where the store says what this process's writes did (observe_applied: bucket, version before,
version after, counts added), the counts of each (metric, window) last read are kept with the
version they were read at (versioned_read: one atomic read) and carried forward by each write
that starts from exactly that version. A stale estimate whose bucket's version, read now, is
the one kept is computed from the kept counts, without reading them: the very counts the
store holds at that version. Anything else (a write by another process, a failed write, a
missed or out-of-order notice, a new bucket) leaves the versions unequal or the entry
forgotten, and the counts are read.

A numeric metric's part also carries what its estimate stands for, computed with it (once per
estimate kept): the mean of its values (mean part) or their quantiles (distribution part).

A metric whose estimate cannot be computed, for whatever reason, is served withheld with the
reason (logged once per metric and kind of error); every other metric is served as usual.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from veil.mechanism import MEAN, PROJECTION_NOTE, ROUNDS

from .config import STRINGS_WINDOW, AggregatorConfig, MetricConfig, StringsConfig, Window
from .counts import PERIOD_NOT_SAID, Counts
from .discovery import Discovery, discovered
from .errors import InvalidRange, UnknownCategory, UnknownMetric, UnknownWindow, quoted
from .estimate import Estimate, GroupEstimate, estimate_many, group_estimate, rest_estimate
from .numeric import MeanEstimate, QuantileEstimate, mean_estimate, quantile_estimates
from .rounds import Rounds
from .store import CountsKey, Store, Version
from .strings_estimates import metric_name, strings_json

__all__ = [
    "WindowEstimate",
    "LiveEstimates",
    "estimates_json",
    "estimand",
    "with_group",
    "with_rest",
    "MAX_BUCKETS",
]

MAX_BUCKETS = 10_000  # buckets one series or merged range may span: 416 days of hourly buckets
_PAST_KEPT = 1 << 21  # categories of the bucket estimates series() keeps (some 40 bytes each: 80 MB)
# Seconds after its end from which a bucket is read as settled (Store.settled_read): a batch's
# bucket is the one current when it arrives, so a late one (its write in flight at the end, an
# aggregator whose clock lags) can still land; then the versions show it, and nothing is lost.
_SETTLED_AFTER = 60

log = logging.getLogger("veil.aggregator")


@dataclass(frozen=True, eq=False)
class WindowEstimate:
    """The estimate of one metric over the current bucket of one window."""

    metric: MetricConfig
    window: Window
    start: int  # the bucket's start and end, Unix seconds (0, 0 for total)
    end: int
    version: Version  # the store's version of the bucket's counts (Store.versions)
    n: int
    estimate: Estimate | None  # None when withheld
    reason: str  # why it is withheld; "" otherwise
    reports_per_device: int = 1  # the most reports one device can have in the bucket so far
    estimand: str = ""  # what the estimates are shares of, in words
    group: GroupEstimate | None = None  # the share of a group of categories, where one was asked for
    periods: int = 1  # the reporting periods the estimate pools: those of its span with reports
    spanned: int = 1  # the reporting periods its span covers so far (for total: since counting began)
    provisional: bool = True  # the bucket is open, or ended less than max_lateness ago (total: always)
    data_periods: frozenset[int] = frozenset()  # the counts' periods (Counts.periods) it was computed from
    # A numeric metric's part: the mean (mean part) or the quantiles (distribution part), computed
    # once with the estimate (_numeric_estimates); None and () otherwise, and when withheld.
    mean: MeanEstimate | None = None
    quantiles: tuple[QuantileEstimate, ...] = ()
    # A strings metric's (metric.spec: its verification round): what the round found; None
    # otherwise, and when withheld.
    strings: Discovery | None = None

    @property
    def withheld(self) -> bool:
        return self.estimate is None

    def to_json(self) -> dict[str, object]:
        """The shape served at /v1/estimates (and printed by `veil estimates --json`). A fresh
        dict each call; its "categories" list is built once per WindowEstimate and shared, so
        treat it as read-only."""
        body = self._head()
        body["categories"] = self._categories
        return body

    def _head(self) -> dict[str, object]:
        """to_json() but for "categories" (its last key)."""
        spec = self.metric.spec
        return {
            "metric": metric_name(spec),
            "window": self.window.name,
            "start": self.start,
            "end": self.end,
            "n": self.n,
            "mechanism": spec.mechanism.name,
            "epsilon": spec.mechanism.epsilon,
            "spec_fingerprint": spec.fingerprint,
            "withheld": self.withheld,
            "reason": self.reason,
            "estimand": self.estimand,
            "period": spec.period,
            "reports_per_device": self.reports_per_device,
            "periods": self.periods,
            "provisional": self.provisional,
            **_numeric_json(self),
            **strings_json(self.strings),
            **(
                {}
                if self.group is None
                else {
                    "group": {
                        "labels": list(self.group.labels),
                        **dict(
                            zip(
                                ("estimate", "stderr", "lower", "upper"),
                                _finite(
                                    np.array(
                                        [self.group.estimate, self.group.stderr, self.group.lower, self.group.upper]
                                    )
                                ),
                            )
                        ),
                    }
                }
            ),
        }

    @functools.cached_property
    def _categories(self) -> list[dict[str, object]]:
        if self.estimate is None or self.metric.spec.strings is not None:  # a round's candidates are no categories
            return []
        e = self.estimate
        assert e.projection is not None  # live estimates are always projected (see _compute_many)
        columns = [_finite(x) for x in (e.estimate, e.stderr, e.lower, e.upper, e.projection)]
        return [
            {
                "label": label,
                "estimate": estimate,
                "stderr": stderr,
                "lower": lower,
                "upper": upper,
                "projected": projected,
            }
            for label, estimate, stderr, lower, upper, projected in zip(self.metric.spec.labels, *columns)
        ]

    @functools.cached_property
    def json_text(self) -> str:
        """json.dumps(self.to_json(), allow_nan=False), computed once: /v1/estimates joins these.

        Written without the per-category dicts: each number column goes through json.dumps as
        one list (the same float repr and null as in the dicts), the labels' JSON is cached per
        label set, and the records are formatted from those pieces: byte for byte the same text
        (tests compare), a little faster, and no thousands of long-lived dicts for the garbage
        collector to track (each fresh HTTP read at k = 1024 would add some 3000 per window)."""
        e = self.estimate
        if e is None or e.projection is None or self.metric.spec.strings is not None:
            return json.dumps(self.to_json(), allow_nan=False)
        head = json.dumps(self._head(), allow_nan=False)  # "categories" goes where its closing brace was
        columns = [
            json.dumps(_finite(x), allow_nan=False)[1:-1].split(", ")
            for x in (e.estimate, e.stderr, e.lower, e.upper, e.projection)
        ]
        records = ", ".join([_RECORD % fields for fields in zip(_labels_json(self.metric.spec.labels), *columns)])
        return head[:-1] + ', "categories": [' + records + "]}"


def _numeric_json(e: WindowEstimate) -> dict[str, object]:
    """A numeric part's "numeric", "mean" and "quantiles" keys (docs/protocol.md 9); none for a
    metric of categories."""
    numeric = e.metric.spec.numeric
    if numeric is None:
        return {}
    body: dict[str, object] = {"numeric": numeric.canonical()}  # the NumericSpec message's fields
    if e.mean is not None:
        m = e.mean
        body["mean"] = dict(zip(_MEAN_KEYS, _finite(np.array([m.estimate, m.stderr, m.lower, m.upper]))))
    if e.quantiles:
        rows = _finite(np.array([[x.q, x.estimate, x.lower, x.upper] for x in e.quantiles]).ravel())
        body["quantiles"] = [dict(zip(_QUANTILE_KEYS, rows[i : i + 4])) for i in range(0, len(rows), 4)]
    return body


_MEAN_KEYS = ("estimate", "stderr", "lower", "upper")
_QUANTILE_KEYS = ("q", "estimate", "lower", "upper")


def _numeric_estimates(
    metric: MetricConfig, e: Estimate | None
) -> tuple[MeanEstimate | None, tuple[QuantileEstimate, ...]]:
    """What a numeric part's estimate stands for: the mean (mean part) or the quantiles
    (distribution part); nothing for a metric of categories or a withheld estimate."""
    numeric = metric.spec.numeric
    if numeric is None or e is None:
        return None, ()
    if numeric.part == MEAN:
        return mean_estimate(metric.spec, e), ()
    return None, quantile_estimates(metric.spec, e)


_RECORD = '{"label": %s, "estimate": %s, "stderr": %s, "lower": %s, "upper": %s, "projected": %s}'


@functools.lru_cache(maxsize=256)
def _labels_json(labels: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(json.dumps(label) for label in labels)


def _finite(x: np.ndarray) -> list[float | None]:
    """JSON has no NaN: an undefined number (e.g. a standard error from one report) is null."""
    x = np.asarray(x, dtype=np.float64)
    values = x.tolist()
    for j in np.flatnonzero(~np.isfinite(x)).tolist():
        values[j] = None
    return values


def estimates_json(current: list[WindowEstimate], generated_at: float) -> bytes:
    """The body of GET /v1/estimates, byte for byte json.dumps({"generated_at": generated_at,
    "projection": PROJECTION_NOTE, "estimates": [e.to_json() for e in current]},
    allow_nan=False).encode(), from each window's cached JSON text."""
    head = json.dumps({"generated_at": generated_at, "projection": PROJECTION_NOTE}, allow_nan=False)
    return (head[:-1] + ', "estimates": [' + ", ".join(e.json_text for e in current) + "]}").encode()


class LiveEstimates:
    """Estimates for the config's metrics, read from a store, cached per bucket and version."""

    def __init__(
        self,
        config: AggregatorConfig,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        rounds: Rounds | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._rounds = Rounds(config, store, clock) if rounds is None else rounds
        # strings metric -> (the buckets it may show, their versions, the estimate made of them)
        self._strings_cache: dict[str, tuple[list[CountsKey], list[Version], WindowEstimate]] = {}
        self._cache: dict[tuple[str, str], WindowEstimate] = {}
        self._changing: set[tuple[str, str]] = set()  # (metric, window) found changed by the last call
        # (metric, window) -> (key, version, counts): the bucket's counts at that version, from
        # an atomic read or carried forward by applied(). Never mutated: served estimates may
        # share the arrays. Guarded by _lock.
        self._known: dict[tuple[str, str], tuple[CountsKey, Version, Counts]] = {}
        self._since: dict[tuple[str, str], int] = {}  # (metric, fingerprint) -> Store.since, once known
        self._logged: set[tuple[str, str]] = set()  # (metric, error type) of failed estimates logged
        self._past: dict[CountsKey, WindowEstimate] = {}  # series(): each bucket's estimate at its version
        self._lock = threading.Lock()

    def applied(
        self, key: CountsKey, before: int | tuple | None, after: int | tuple | None, counts: Counts | None
    ) -> None:
        """A write of this process took bucket `key` from version `before` to `after` by adding
        `counts`, atomically (a store's observe_applied hook calls this). The known counts of
        that bucket at exactly `before` become those at `after`; any other known counts of the
        (metric, window) are forgotten, as they are when before is None (a failed write).
        A sharded store's write names its shard's versions only (None at the others): the
        known counts follow it when that shard was at `before`."""
        name = (key.metric, key.window)
        with self._lock:
            held = self._known.pop(name, None)  # forgotten unless carried forward below
            if held is None or before is None or after is None or counts is None:
                return
            held_key, version, known = held
            following = _following(version, before, after)
            if held_key != key or following is None or known.weights != counts.weights or known.k != counts.k:
                return
            added = Counts(known.weights, known.n + counts.n, known.v + counts.v, known.periods | counts.periods)
            self._known[name] = (key, following, added)
            self._changing.discard(name)  # followed: its counts need not be read along with the versions

    def select(self, metric: str | None = None, window: str | None = None) -> list[tuple[MetricConfig, Window]]:
        """The (metric, window) pairs a request names; empty names mean all."""
        metrics = self._config.metrics
        if metric:
            found = self._config.metric(metric)
            if found is None:
                raise UnknownMetric(f"No metric named {quoted(metric)} is declared.")
            metrics = (found,)
        pairs = [(m, w) for m in metrics for w in m.windows if not window or w.name == window]
        if window and not pairs:
            raise UnknownWindow(f"No window named {quoted(window)} is declared for {metric or 'any metric'}.")
        return pairs

    def current(self, metric: str | None = None, window: str | None = None) -> list[WindowEstimate]:
        """The estimates now, in config order, the strings metrics' last (_strings_current).
        Raises UnknownMetric for names not declared and StoreUnavailable when the store cannot
        be read."""
        strings = tuple(s for s in self._rounds.metrics if not metric or s.name == metric)
        if metric and strings:
            return self._strings_current(strings, window)
        declared_window = not window or any(w.name == window for m in self._config.metrics for w in m.windows)
        found = self._declared_current(metric, window) if declared_window or not strings else []
        if not metric and (not window or window == STRINGS_WINDOW):
            found += self._strings_current(strings, window)
        return found

    def _strings_current(self, strings: tuple[StringsConfig, ...], window: str | None) -> list[WindowEstimate]:
        """What each strings metric found: its verification round (ROUNDS - 1) of the period before now's
        (complete) when it has enough reports to show, else of now's (provisional);
        withheld with the reason until a first period gets that far (docs/protocol.md 10)."""
        if window and window != STRINGS_WINDOW:
            raise UnknownWindow(f"A strings metric has one window, {STRINGS_WINDOW!r}, not {quoted(window)}.")
        now = self._clock()
        found = []
        for s in strings:
            period = int(now // s.period)
            made_in = [(m, p) for p in (period - 1, period) if (m := self._rounds.round(s, p, ROUNDS - 1)) is not None]
            if not made_in:
                first = self._rounds.round(s, period, 0)
                assert first is not None  # round 0 is always served
                start = period * s.period
                reason = (
                    f"No period has reached round {ROUNDS - 1} yet: values are found {ROUNDS} periods of "
                    f"{duration_text(s.period)} after reports begin, then every period."
                )
                found.append(
                    self._made(first, s.window, (start, start + s.period), 0, None, (1, 1), now, None, reason, "")
                )
                continue
            keys = [Rounds.key(m, p) for m, p in made_in]
            # Which bucket is shown follows from their counts, so while neither has changed (the
            # same keys at the same versions) the estimate kept holds: a versions read, no counts.
            held = self._strings_cache.get(s.name)
            if (
                held is not None
                and held[0] == keys
                and held[1] == list(self._store.versions(keys))
                and not self._aged(held[2], now)
            ):
                found.append(held[2])
                continue
            requests = [(key, m.spec.mechanism.estimator.weights, m.spec.k) for key, (m, _) in zip(keys, made_in)]
            _, read = self._store.versioned_read((), requests)
            # The period before now's, complete, when it has enough reports to show; else now's.
            least = max(self._config.min_n, 2)
            i = next((i for i, (_, counts) in enumerate(read) if counts.total >= least), 0)
            (metric, _), key, (version, counts) = made_in[i], keys[i], read[i]
            made = self._compute(metric, s.window, key.bucket, key.bucket + s.period, version, counts, now)
            if made.estimate is not None:
                made = dataclasses.replace(made, strings=discovered(metric.spec, made.estimate))
            self._strings_cache[s.name] = (keys, [v for v, _ in read], made)
            found.append(made)
        return found

    def _declared_current(self, metric: str | None = None, window: str | None = None) -> list[WindowEstimate]:
        """The estimates of the declared metrics (not strings metrics) now.

        Every estimate computed here is of counts read together with their version, or of
        known counts (carried forward by applied()) at the version the store has now. A bucket
        whose counts had to be read last time, and were not followed since, is likely to change
        again (written by another process, say): its counts are read along with every version,
        in the same round trip, instead of in a second one once the versions are known."""
        pairs = self.select(metric, window)
        now = self._clock()
        buckets = [w.bucket(now) for _, w in pairs]
        keys = [CountsKey(m.name, m.spec.fingerprint, w.name, start) for (m, w), (start, _) in zip(pairs, buckets)]
        names = [(m.name, w.name) for m, w in pairs]
        with self._lock:
            known = [self._known.get(name) for name in names]
        # The shape of each metric's counts comes from its spec: one that cannot say it fails
        # alone, and its counts are never read.
        shapes: dict[int, tuple[tuple[int, ...], int]] = {}
        failed: dict[int, Exception] = {}
        for i, (m, _) in enumerate(pairs):
            try:
                shapes[i] = self._shape(m)
            except Exception as err:  # noqa: BLE001 (any failure is this metric's alone)
                failed[i] = err
        guess = [i for i, name in enumerate(names) if name in self._changing and i in shapes]
        versions, guessed = self._store.versioned_read(keys, [(keys[i], *shapes[i]) for i in guess])
        read: dict[int, tuple[Version, Counts]] = dict(zip(guess, guessed))
        results: list[WindowEstimate | None] = []
        stale = []
        for i, ((start, _), version) in enumerate(zip(buckets, versions)):
            cached = self._cache.get(names[i])
            if cached is None or cached.start != start or cached.version != version or self._aged(cached, now):
                stale.append(i)
                cached = None
            results.append(cached)
        source: dict[int, tuple[Version, Counts]] = {}
        unread = []
        changed = set()  # changed, and had to be read
        for i in stale:
            if i in failed:
                continue
            held = known[i]
            if held is not None and held[0] == keys[i] and held[1] == versions[i]:
                source[i] = (held[1], held[2])  # the counts at the version the store has now
                continue
            changed.add(names[i])
            if i in read:
                source[i] = read[i]
            else:
                unread.append(i)
        if unread:
            _, more = self._store.versioned_read((), [(keys[i], *shapes[i]) for i in unread])
            read.update(zip(unread, more))
            source.update(zip(unread, more))
        with self._lock:
            for i, (version, counts) in read.items():
                self._known[names[i]] = (keys[i], version, counts)
        for i in stale:
            (m, w), (start, end) = pairs[i], buckets[i]
            if i in failed:
                fresh = self._failed(m, w, start, end, versions[i], None, failed[i], (1, 1), now)
            else:
                version, counts = source[i]
                fresh = self._compute(m, w, start, end, version, counts, now)
            with self._lock:
                self._cache[names[i]] = fresh
            results[i] = fresh
        with self._lock:
            for name in names:
                if name in changed:
                    self._changing.add(name)
                else:
                    self._changing.discard(name)
        return results  # type: ignore[return-value]

    def series(
        self, metric: str, window: str, start: float | None = None, end: float | None = None
    ) -> list[WindowEstimate]:
        """The estimate of each retained bucket of a window that overlaps [start, end) (default:
        every retained bucket, the current one included), oldest first, each under the same
        rules as the current one.

        Past buckets rarely change, so their estimates are kept with their version: one store
        call reads the versions of the buckets whose estimates are kept (one round trip on
        Redis; none on a first read), a second reads, with their versions, the counts of the
        others and of those no longer at the version kept (those that ended a while ago as
        settled: see _read_buckets), and those are estimated together."""
        m, w, span, starts, now = self._buckets(metric, window, start, end)
        keys = [CountsKey(m.name, m.spec.fingerprint, w.name, b) for b in starts]
        with self._lock:
            held = [self._past.get(key) for key in keys]
        kept = [i for i, e in enumerate(held) if e is not None]  # only these need their versions compared
        versions = dict(zip(kept, self._store.versions([keys[i] for i in kept]))) if kept else {}
        found: list[WindowEstimate | None] = []
        for i, e in enumerate(held):
            fresh = e is not None and e.version == versions[i] and not self._aged(e, now)
            found.append(e if fresh else None)
        stale = [i for i, e in enumerate(found) if e is None]
        read = self._read_buckets(m, w, [keys[i] for i in stale], now)
        computed = self._compute_many(m, w, [(starts[i], starts[i] + span) for i in stale], read, now)
        for i, estimate_ in zip(stale, computed):
            found[i] = estimate_
        with self._lock:
            if len(self._past) + len(stale) > _PAST_KEPT // m.spec.mechanism.k:
                self._past.clear()  # buckets age out; forgetting them all now and then bounds the memory
            self._past.update(zip([keys[i] for i in stale], computed))
        return found  # type: ignore[return-value]

    def merged(self, metric: str, window: str, start: float | None = None, end: float | None = None) -> WindowEstimate:
        """One estimate of the buckets series() gives, their counts added (exactly: 7 daily
        buckets give the 7-day estimate), its reports_per_device that of the whole range."""
        m, w, span, starts, now = self._buckets(metric, window, start, end)
        if not starts:
            raise InvalidRange(f"No retained {w.name} bucket of {m.name} overlaps that range.")
        read = self._read_buckets(m, w, [CountsKey(m.name, m.spec.fingerprint, w.name, b) for b in starts], now)
        counts = [c for _, c in read]
        total = Counts.summed(counts)
        return self._compute_many(m, w, [(starts[0], starts[-1] + span)], [(0, total)], now, buckets=len(starts))[0]

    def _read_buckets(
        self, metric: MetricConfig, window: Window, keys: list[CountsKey], now: float
    ) -> list[tuple[Version, Counts]]:
        """Each bucket's counts with their version: the buckets that ended a while ago through
        Store.settled_read (a store may serve them from a compact copy), the others as usual."""
        weights, k = self._shape(metric)
        span = window.span
        assert span is not None  # a range's window has buckets (see _buckets)
        settled = [i for i, key in enumerate(keys) if key.bucket + span + _SETTLED_AFTER <= now]
        others = [i for i, key in enumerate(keys) if key.bucket + span + _SETTLED_AFTER > now]
        found: list[tuple[Version, Counts] | None] = [None] * len(keys)
        if settled:
            got = self._store.settled_read([(keys[i], weights, k, window.expiry(keys[i].bucket)) for i in settled])
            for i, each in zip(settled, got):
                found[i] = each
        if others:
            for i, each in zip(others, self._store.versioned_read((), [(keys[i], weights, k) for i in others])[1]):
                found[i] = each
        return found  # type: ignore[return-value]

    def _buckets(
        self, metric: str, window: str, start: float | None, end: float | None
    ) -> tuple[MetricConfig, Window, int, list[int], float]:
        """The metric, window, its span, the starts of its retained buckets overlapping [start, end), and now."""
        pairs = self.select(metric, window)
        if not metric or not window:
            raise InvalidRange("A range names one metric and one window.")
        m, w = pairs[0]
        if w.span is None or w.retention is None:  # (both None: the total window)
            raise InvalidRange(f"The {w.name} window has no buckets; ask for a window such as 1h.")
        now = self._clock()
        span = w.span
        first = (int(now - span - w.retention) // span + 1) * span  # the oldest not yet dropped
        last = w.bucket(now)[0]
        if start is not None:
            first = max(first, int(start // span) * span)
        if end is not None:
            last = min(last, int(-(-end // span)) * span - span)  # the last bucket starting before end
        starts = list(range(first, last + 1, span))
        if len(starts) > MAX_BUCKETS:
            raise InvalidRange(f"That range holds {len(starts)} {w.name} buckets; ask for at most {MAX_BUCKETS}.")
        return m, w, span, starts, now

    @staticmethod
    def _shape(metric: MetricConfig) -> tuple[tuple[int, ...], int]:
        """The report weights and k of the metric's counts, as a counts read asks for them."""
        spec = metric.spec.mechanism
        return spec.weight_law().weights, spec.k

    def _aged(self, e: WindowEstimate, now: float) -> bool:
        """Whether a kept estimate no longer holds for its counts at `now`: it has left its
        lateness (no longer provisional), or a period began within its span (its estimand
        names the periods spanned; where its counts do not say which periods they came from,
        one device can have sent more reports since)."""
        if e.provisional != self._provisional(e.window, e.end, now):
            return True
        return bool(e.n) and (e.periods, e.spanned) != self._pooled(
            e.metric, e.window, e.start, e.end, now, e.data_periods
        )

    def _provisional(self, window: Window, end: int, now: float) -> bool:
        """A bucket that has not ended, or ended less than max_lateness ago (reports made in it
        may still come); the all-time window never ends."""
        return window.span is None or now < end + self._config.max_lateness

    def _pooled(
        self, metric: MetricConfig, window: Window, start: int, end: int, now: float, periods: frozenset[int]
    ) -> tuple[int, int]:
        """The reporting periods a bucket's estimate pools, and the periods it spans: those from
        its start (or from when counting began, if later; for the all-time window, from then) to
        its end or now. The pooled ones are the periods with data (the store records each batch's),
        at least 1; where some batch did not say its period, every period it spans as well. A
        device sends at most reports_per_period reports in each, so reports_per_period times the
        pooled periods bounds one device's reports in the bucket (docs/math.md)."""
        spec = metric.spec
        since = self._since_of(metric, now)
        first = max(start, since) if window.span is not None else since
        last = min(end, now) if window.span is not None else now
        low, high = spec.period_index(first), spec.period_index(max(last - 1, first))
        spanned = max(1, high - low + 1)
        if PERIOD_NOT_SAID in periods or not periods:
            said = {p for p in periods if p != PERIOD_NOT_SAID and not low <= p <= high}
            return max(1, spanned + len(said)), spanned
        return len(periods), spanned

    def _since_of(self, metric: MetricConfig, now: float) -> int:
        name = (metric.name, metric.spec.fingerprint)
        since = self._since.get(name)
        if since is None:
            # Recorded by the first write of any aggregator (CollectorService); recorded here only
            # when counts exist without it (a store that lost it): then from now, and the
            # all-time window's intervals allow for fewer periods than they might span.
            since = self._since[name] = self._store.since(metric.name, metric.spec.fingerprint, int(now))
        return since

    def _compute(
        self, metric: MetricConfig, window: Window, start: int, end: int, version: Version, counts: Counts, now: float
    ) -> WindowEstimate:
        return self._compute_many(metric, window, [(start, end)], [(version, counts)], now)[0]

    def _compute_many(
        self,
        metric: MetricConfig,
        window: Window,
        spans: list[tuple[int, int]],
        read: list[tuple[Version, Counts]],
        now: float,
        buckets: int = 1,
    ) -> list[WindowEstimate]:
        """The estimate of each (start, end) span from its (version, counts), those with enough
        reports computed together (estimate_many: one pass over a (spans, k) matrix)."""
        spec = metric.spec.mechanism
        least = max(self._config.min_n, 2)
        found: list[WindowEstimate | None] = [None] * len(spans)
        shown = []
        m = metric.spec.reports_per_period
        pooled: list[tuple[int, int]] = []
        for i, ((start, end), (version, counts)) in enumerate(zip(spans, read)):
            n = counts.total
            pooled.append(self._pooled(metric, window, start, end, now, counts.periods) if n else (1, 1))
            per_device = m * pooled[i][0]
            if n >= least:
                shown.append((i, per_device))
                continue
            reason = (
                f"{n} reports so far; estimates are shown from {least} reports on, so that "
                "no small group is singled out and the error bars mean something."
            )
            what = estimand(metric, window, *pooled[i], buckets)
            found[i] = self._made(metric, window, (start, end), version, counts, pooled[i], now, None, reason, what)
        if shown:
            try:
                computed = estimate_many(
                    spec, [read[i][1] for i, _ in shown], project=True, reports_per_device=[c for _, c in shown]
                )
            except Exception as err:  # noqa: BLE001 (any failure is this metric's alone)
                for i, _ in shown:
                    (start, end), (version, counts) = spans[i], read[i]
                    found[i] = self._failed(metric, window, start, end, version, counts, err, pooled[i], now)
            else:
                said: dict[tuple[int, int], str] = {}  # estimand() of each (pooled, spanned): most buckets share one
                for (i, _), e in zip(shown, computed):
                    (start, end), (version, counts) = spans[i], read[i]
                    what = said.get(pooled[i]) or said.setdefault(
                        pooled[i], estimand(metric, window, *pooled[i], buckets)
                    )
                    try:
                        found[i] = self._made(
                            metric, window, (start, end), version, counts, pooled[i], now, e, "", what
                        )
                    except Exception as err:  # noqa: BLE001 (a numeric part's mean or quantiles: this metric's alone)
                        found[i] = self._failed(metric, window, start, end, version, counts, err, pooled[i], now)
        return found  # type: ignore[return-value]

    def _failed(
        self,
        metric: MetricConfig,
        window: Window,
        start: int,
        end: int,
        version: Version,
        counts: Counts | None,
        err: Exception,
        pooled: tuple[int, int],
        now: float,
    ) -> WindowEstimate:
        """The estimate withheld because computing it raised `err`; logged once per metric and
        kind of error (it is cached like any estimate, so tried again only when counts change)."""
        logged = (metric.name, type(err).__name__)
        with self._lock:
            first = logged not in self._logged
            self._logged.add(logged)
        if first:
            log.error(
                "estimate failed; the metric is served withheld, the others as usual",
                exc_info=err,
                extra={"metric": metric.name, "window": window.name},
            )
        reason = f"The estimate could not be computed ({type(err).__name__}: {err}); other metrics are unaffected."
        what = estimand(metric, window, *pooled)
        return self._made(metric, window, (start, end), version, counts, pooled, now, None, reason, what)

    def _made(
        self,
        metric: MetricConfig,
        window: Window,
        span: tuple[int, int],
        version: Version,
        counts: Counts | None,
        pooled: tuple[int, int],
        now: float,
        estimate_: Estimate | None,
        reason: str,
        what: str,
    ) -> WindowEstimate:
        """The WindowEstimate of a bucket's span and counts (None: none read), its pooled and
        spanned periods (_pooled), its estimate (None: withheld, for the reason) and estimand;
        a numeric part's mean or quantiles computed here, once per estimate kept."""
        mean, quantiles = _numeric_estimates(metric, estimate_)
        return WindowEstimate(
            metric,
            window,
            *span,
            version,
            0 if counts is None else counts.total,
            estimate_,
            reason,
            metric.spec.reports_per_period * pooled[0],
            what,
            periods=pooled[0],
            spanned=pooled[1],
            provisional=self._provisional(window, span[1], now),
            data_periods=frozenset() if counts is None else counts.periods,
            mean=mean,
            quantiles=quantiles,
        )


def estimand(metric: MetricConfig, window: Window, periods: int, spanned: int, buckets: int = 1) -> str:
    """What a bucket's (or a merged range of buckets') estimates are shares of (a numeric part's:
    the mean or distribution of), in words, under
    the SDK's reporting rule: a device sends the first reports_per_period report() calls of each
    period, at once; `periods` of the `spanned` periods (LiveEstimates._pooled) are pooled."""
    spec = metric.spec
    period, m = duration_text(spec.period), spec.reports_per_period
    numeric = spec.numeric
    if numeric is None:
        text = "share of devices by the value" if m == 1 else "share of reports"
    elif numeric.part == MEAN:
        text = f"mean of {numeric.metric}" + (" over devices, of the value" if m == 1 else " over reports")
    else:
        text = f"distribution of {numeric.metric}" + (" over devices, the value" if m == 1 else " over reports")
    if m == 1:
        text += f" each reported first in its {period} period"
    else:
        text += f", each device sending its first {m} values of each {period} period"
    scope = (
        "since counting began"
        if window.span is None
        else "in this bucket"
        if buckets == 1
        else f"in these {buckets} {window.name} buckets"
    )
    of = f" with reports of the {spanned} {scope}" if spanned > periods else f" {scope}"
    if periods > 1:
        text += (
            f", pooled over the {periods} periods{of} (a device counts once per period; the "
            f"intervals allow for one device's {m * periods} reports being alike)"
        )
    elif spanned > 1:
        text += f", from the one period{of}"
    return text


def with_group(e: WindowEstimate, labels: list[str]) -> WindowEstimate:
    """The window's estimate with the share of the categories named (GroupEstimate) added; the
    same when withheld. Raises UnknownCategory for a label the metric does not declare."""
    spec = e.metric.spec
    index = {label: j for j, label in enumerate(spec.labels)}
    labels = _rejoined(labels, index)
    missing = [label for label in labels if label not in index]
    if missing or not labels:
        raise UnknownCategory(
            f"{spec.name} has no category {missing[0]!r}." if missing else "A group names at least one category."
        )
    if e.estimate is None:
        return e
    return dataclasses.replace(
        e, group=group_estimate(spec.mechanism, e.estimate, [index[x] for x in labels], tuple(dict.fromkeys(labels)))
    )


def _rejoined(asked: list[str], declared: dict[str, int]) -> list[str]:
    """The labels asked for, pieces a list split at commas put back together where they make a
    declared label (a numeric part's bucket "[100, 250)" asked for as "[100, 250),[250, 500)"
    in a query or on the command line); pieces joined with "," as split, or with ", " when
    stripped."""
    if all(x in declared for x in asked):
        return asked
    most = 1 + max(label.count(",") for label in declared)  # pieces one label can have been split into
    out, i = [], 0
    while i < len(asked):
        for j in range(min(len(asked), i + most), i + 1, -1):
            pieces = asked[i:j]
            joined = next((x for x in (",".join(pieces), ", ".join(pieces)) if x in declared), None)
            if joined is not None:
                out.append(joined)
                i = j
                break
        else:
            out.append(asked[i])
            i += 1
    return out


def with_rest(e: WindowEstimate, top: int) -> WindowEstimate:
    """The window's estimate with the share of every category outside its `top` largest
    estimates added as its group (the dashboard's and /metrics's "other"; its interval allows
    for those categories being chosen by the same data: estimate.rest_estimate); the same when
    withheld or when no category is left out."""
    if e.estimate is None or top >= e.estimate.estimate.size:
        return e
    spec = e.metric.spec
    return dataclasses.replace(e, group=rest_estimate(spec.mechanism, e.estimate, max(top, 0), spec.labels))


def duration_text(seconds: int) -> str:
    """86400 -> "1-day", 3600 -> "1-hour", 90 -> "90-second"."""
    for unit, size in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            return f"{seconds // size}-{unit}"
    return f"{seconds}-second"


def _following(version: Version, before: int | tuple, after: int | tuple) -> Version | None:
    """The version after a write from `before` to `after` of a bucket known at `version`; None
    when the write did not start from it."""
    if not isinstance(before, tuple):
        return after if version == before else None
    if version == 0:  # no shard written yet
        version = (0,) * len(before)
    if not isinstance(version, tuple) or len(version) != len(before) or not isinstance(after, tuple):
        return None
    if any(b is not None and b != v for b, v in zip(before, version)):
        return None
    return tuple(v if a is None else a for v, a in zip(version, after))
