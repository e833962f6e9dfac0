"""What the app can read about its Reporter: counts only."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Counters"]


@dataclass(frozen=True)
class Counters:
    """A snapshot of a Reporter's counts, in reports unless said otherwise.

    accepted: report() calls randomized and queued in this process.
    dropped:  reports discarded on the device without reaching the aggregator: a full queue,
              calls still waiting for the first specs (or strings for their round) at shutdown, a
              refused spec, a metric or category the aggregator does not declare, a value of the
              wrong kind, a string whose period ended before its round was served, a Reporter
              shut down, the disk cap, or batches held only in memory at shutdown.
    sent:     reports the aggregator acknowledged (a duplicate acknowledgement included: the
              batch was counted once, on an earlier attempt).
    retried:  upload attempts (batches, not reports) repeated after a retryable failure.
    failed:   reports in batches the aggregator refused for good (stale spec, invalid batch)
              or that stayed unacknowledged past the retry horizon.
    queued:   reports awaiting acknowledgement now, in memory and under the queue directory
              (batches left by an earlier process included), report() calls waiting for the
              first specs, and strings waiting for their round of a strings metric.
    limited:  report() calls not sent because this period's reports of the metric were sent
              already (the metric's reports_per_period), or because the period is before one the
              device reported in (its clock was set back): the device-level bound at work, not a
              failure, and not counted as dropped.
    over_budget: report() calls not sent because they would have spent more epsilon than the
              metric's period or lifetime budget allows (see Reporter.privacy_spent()).
    too_late: reports in batches the aggregator refused for good because they were made longer
              ago than it accepts (its max_lateness after their time slot ended): not counted.
    ledger_unavailable: report() calls not sent because the privacy ledger under the queue
              directory could not record their spending (a full disk, an unwritable directory).
    clipped:  report() calls of a numeric metric whose number was outside the metric's range and
              was reported as the nearer end of it (counted at the call, whatever happened to the
              report after: sent, limited or dropped; a number, never its value).
    """

    accepted: int = 0
    dropped: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    queued: int = 0
    limited: int = 0
    over_budget: int = 0
    too_late: int = 0
    ledger_unavailable: int = 0
    clipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
