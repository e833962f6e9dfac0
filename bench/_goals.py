"""The performance goals, as data: every number a benchmark or the report measures against,
with the issue that set it. The benchmarks report them, never fail on them (bench/README.md);
bench/report.py turns them into the targets list of latest.json (_targets).
"""

from __future__ import annotations

__all__ = [
    "CLIENT_KS",
    "CLI_START_GOAL_MS",
    "DEVICE_DAY_GOAL",
    "EFFICIENCY_GOAL",
    "ENCODING_GOAL",
    "EVEN_GOAL",
    "GET_P99_GOAL_MS",
    "LARGE_1024_GOAL",
    "LARGE_SMALL_K_GOAL",
    "LEDGER_REPORT_GOAL_US",
    "MERGED_P99_GOAL_MS",
    "RATIO_GOALS",
    "SERIES_P99_GOAL_MS",
    "SERIES_STORES",
    "SMALL_UPLOADS_GOAL",
    "SQLITE_SMALL_RATIO_GOAL",
]

# Issue 7: randomization and end-to-end ingest.
RATIO_GOALS = {"fast": 50.0, "AES": 20.0}  # Veil subset / multi-freq-ldpy SS, every cell
ENCODING_GOAL = 1_000_000  # q-subset reports/s at k = 1024, epsilon = 1, one core (strictly above)
LARGE_1024_GOAL = 1_000_000  # end-to-end reports/s at k = 1024, epsilon = 1, 1000-report uploads
LARGE_SMALL_K_GOAL = 3_000_000  # end-to-end reports/s at k <= 128, 1000-report uploads
SMALL_UPLOADS_GOAL = 25_000  # uploads/s of 10-report uploads
GET_P99_GOAL_MS = 5.0  # Estimates.Get p99 at k = 1024 with 3 windows
CLIENT_KS = (16, 128, 1024)  # report() median and p99 published for these k
LEDGER_REPORT_GOAL_US = 10.0  # report() median with the privacy ledger and the period bound, memoized
# Issue 14: the embedded store beside Redis.
SQLITE_SMALL_RATIO_GOAL = 0.8  # SQLite's 10-report uploads/s over Redis's, same run: within 20%
# Issue 16: series and merged estimates.
SERIES_P99_GOAL_MS = 50.0  # 720 hourly buckets at k = 1024, each estimated
MERGED_P99_GOAL_MS = 10.0  # a 7-day merged estimate at k = 1024
SERIES_STORES = ("sqlite", "redis")  # the stores these series goals apply to
# Issue 17: per-core efficiency.
EFFICIENCY_GOAL = 0.75  # 10-report uploads per aggregator CPU second / a do-nothing grpcio server's calls
EVEN_GOAL = 0.10  # a Redis Cluster's masters' CPU seconds even: (max - min) / mean at most this
# Issue 18: the command line.
CLI_START_GOAL_MS = 500.0  # `veil specs` and `veil estimates`, spawn to exit (median)
# Issue 26: the device-day.
DEVICE_DAY_GOAL = 0.75  # device-days per aggregator CPU second / a do-nothing server's, same calls and TLS
