"""The Python SDK over HTTP (an http:// endpoint) against a real aggregator's HTTP listener:
exactly-once across an aggregator restart with the batches kept under queue_dir, several
metrics in one POST /v1/uploads, 410 counted as too_late, the conditional specs check
(If-None-Match -> 304), and a refused token retried until it is fixed."""

from __future__ import annotations

import logging
import time

from veil_testing.processes import free_port
from veil_testing.running import UPLOAD_TOKEN, auth_section, counted

from veil.client import Counters, Reporter
from veil.client._config import resolve_config
from veil.client._transport import open_transport

FAST = dict(schedule_delay_ms=20, retry_initial_backoff_ms=5, retry_max_backoff_ms=50, export_timeout_ms=3000)


def url(aggregator) -> str:
    return f"http://127.0.0.1:{aggregator.http_port}"


def test_batches_kept_under_queue_dir_are_counted_once_across_an_aggregator_restart(start_aggregator, tmp_path):
    store, port = f"sqlite://{tmp_path}/veil.db", free_port()
    first = start_aggregator(store, http=f"127.0.0.1:{port}")
    queue_dir = tmp_path / "device"
    with Reporter(f"http://127.0.0.1:{port}", queue_dir=queue_dir, memoize=False, **FAST) as reporter:
        assert reporter.wait_for_specs(10)
        for i in range(300):
            reporter.report("os", i % 6)
            reporter.report("browser", i % 8)
        assert reporter.force_flush(10), reporter.counters()
        first.stop(grace=0)
        for i in range(200):  # the aggregator is down: the batches wait on disk
            reporter.report("os", i % 6)
        assert not reporter.force_flush(0.5)
    second = start_aggregator(store, http=f"127.0.0.1:{port}")
    with Reporter(f"http://127.0.0.1:{port}", queue_dir=queue_dir, memoize=False, **FAST) as reporter:
        assert reporter.force_flush(10), reporter.counters()
        assert reporter.counters() == Counters(sent=200)
    assert counted(second, "os") == 500 and counted(second, "browser") == 300


def test_reports_made_longer_ago_than_the_lateness_are_counted_as_too_late(start_aggregator):
    aggregator = start_aggregator()
    three_days_ago = time.time() - 3 * 86400  # the aggregator keeps 25 h by default
    with Reporter(url(aggregator), clock=lambda: three_days_ago, **FAST) as reporter:
        assert reporter.wait_for_specs(10)
        for _ in range(5):
            reporter.report("os", "linux")
        assert not reporter.force_flush(10), "reports were lost (too late)"
        assert reporter.counters() == Counters(accepted=5, too_late=5)
    assert counted(aggregator, "os") == 0


def test_the_specs_check_with_the_version_held_is_answered_304(start_aggregator):
    aggregator = start_aggregator()
    transport = open_transport(resolve_config(endpoint=url(aggregator)))
    try:
        full = transport.fetch_specs(5).result()
        assert full.specs and full.specs_version and full.server_time_unix
        again = transport.fetch_specs(5, full.specs_version).result()
        assert again.unchanged and not again.specs and again.specs_version == full.specs_version
        assert again.server_time_unix >= full.server_time_unix  # from the 304's Date: the aggregator's clock
        assert transport.fetch_specs(5, "another").result().specs  # a version not current: the specs
    finally:
        transport.close()


def test_a_refused_token_is_retried_and_the_batch_counted_once_fixed(start_aggregator, tmp_path):
    aggregator = start_aggregator(sections={"auth": auth_section()})
    with Reporter(url(aggregator), token=UPLOAD_TOKEN, queue_dir=tmp_path, **FAST) as reporter:
        assert reporter.wait_for_specs(10)
    # The same device with a token the aggregator does not know: 401, kept, retried.
    with Reporter(url(aggregator), token=UPLOAD_TOKEN[::-1], queue_dir=tmp_path, **FAST) as reporter:
        reporter.report("browser", "edge")
        reporter.report("os", "ios")
        assert not reporter.force_flush(0.5)
        assert reporter.counters().retried > 0 and reporter.counters().failed == 0
    with Reporter(url(aggregator), token=UPLOAD_TOKEN, queue_dir=tmp_path, **FAST) as reporter:
        assert reporter.force_flush(10), reporter.counters()
    assert counted(aggregator, "browser") == 1 and counted(aggregator, "os") == 1


def test_a_failed_specs_fetch_says_why(start_aggregator, caplog):
    aggregator = start_aggregator()  # plaintext: an https:// endpoint fails at the TLS handshake
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        with Reporter(f"https://127.0.0.1:{aggregator.http_port}", **FAST) as reporter:
            assert not reporter.wait_for_specs(1)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Cannot fetch Veil metric specs (UNAVAILABLE: SSLError") for m in messages), messages
