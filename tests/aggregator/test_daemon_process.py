"""`veil serve` as a process: killed mid-load it loses and duplicates nothing; SIGTERM is graceful."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

from veil_testing.running import estimates, finish_reporters

from veil.client import Reporter
from veil.mechanism import SeededRandomSource

REPORTERS = 3
REPORTS_EACH = 6000


def test_sigkill_mid_load_with_sdk_retries_ends_with_exact_counts(make_redis_server, serve_process):
    redis = make_redis_server()
    serve = serve_process(redis.url).start()
    reporters = [
        Reporter(
            serve.endpoint,
            tls=False,
            memoize=False,
            random_source=SeededRandomSource(seed),
            max_queue_size=REPORTS_EACH + 1,
            max_batch_size=200,
            schedule_delay_ms=20,
            export_timeout_ms=1000,
            retry_initial_backoff_ms=20,
            retry_max_backoff_ms=200,
        )
        for seed in range(REPORTERS)
    ]

    def load(reporter: Reporter, seed: int) -> None:
        assert reporter.wait_for_specs(30)
        rng = random.Random(seed)
        for i in range(REPORTS_EACH):
            reporter.report("os", rng.randrange(6))
            if i % 100 == 99:
                time.sleep(0.01)  # a steady stream across the kills, not one burst

    threads = [threading.Thread(target=load, args=(r, s)) for s, r in enumerate(reporters)]
    for t in threads:
        t.start()
    rng = random.Random(3)
    kills = 0
    while any(t.is_alive() for t in threads) or kills < 3:
        time.sleep(rng.uniform(0.2, 0.8))
        assert serve.signal(signal.SIGKILL) == -signal.SIGKILL
        kills += 1
        time.sleep(rng.uniform(0.0, 0.3))
        serve.start()
    counters = finish_reporters(threads, reporters)
    acknowledged = sum(c.sent for c in counters)
    assert acknowledged == REPORTERS * REPORTS_EACH
    (total,) = estimates(serve.endpoint, "os", "total").estimates
    assert total.n == acknowledged, (total.n, acknowledged, kills)


def test_sigterm_stops_gracefully_and_logs_no_payloads(serve_process, tmp_path):
    serve = serve_process("memory").start()
    with Reporter(serve.endpoint, tls=False, token="s3cret-token-value") as reporter:
        assert reporter.wait_for_specs(30)
        for i in range(300):
            reporter.report("browser", i % 8)
        assert reporter.force_flush(30)
    assert serve.signal(signal.SIGTERM) == 0
    lines = [json.loads(line) for line in serve.log.read_text().splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert "aggregator started" in messages and messages[-1] == "aggregator stopped"
    text = serve.log.read_text()
    assert "s3cret-token-value" not in text and "127.0.0.1:" not in text.replace(serve.endpoint, "")
