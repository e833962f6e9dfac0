"""The queue directory: unsent batches, specs and the device secret survive restarts,
owner-only, with a cap on disk use and nothing that holds a true value."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest
from veil_testing.waiting import wait_until

from veil.client import RETRY_HORIZON_SECONDS, Counters
from veil.wire.v1 import veil_pb2


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each test runs over both transports (the collector's and the Reporter's)."""
    return request.param


def _files(directory):
    return sorted(p for p in (directory / "outbox").iterdir() if p.suffix == ".batch")


def _count(path):
    return veil_pb2.UploadRequest.FromString(path.read_bytes()).count


def test_unsent_batches_survive_a_restart_and_are_delivered_once(
    ready_reporter, make_reporter, state, collector, tmp_path
):
    first = ready_reporter(queue_dir=tmp_path, max_batch_size=8)
    collector.stop()
    labels = ["safari", "firefox", "chrome", "edge"] * 5
    for label in labels:
        first.report("browser", label)
    assert not first.shutdown(2)  # nothing delivered, everything kept on disk
    assert first.counters() == Counters(accepted=20, queued=20, retried=first.counters().retried)
    files = _files(tmp_path)
    assert sum(map(_count, files)) == 20 and max(map(_count, files)) <= 8
    for path in files:
        request = veil_pb2.UploadRequest.FromString(path.read_bytes())
        assert request.metric == "browser" and len(request.batch_id) == 16
        assert request.batch_id.hex() in path.name
    for path in tmp_path.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path
        if path.is_file():
            assert not any(label.encode() in path.read_bytes() for label in set(labels) if path.name != "specs.pb")
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700

    collector.start()
    second = make_reporter(queue_dir=tmp_path)
    assert second.force_flush(10)
    assert state.total("browser") == 20 and len(state.counted) == len(files)
    assert second.counters() == Counters(sent=20)
    assert _files(tmp_path) == []


def test_specs_cached_on_disk_serve_a_restart_without_the_aggregator(
    ready_reporter, make_reporter, collector, state, tmp_path
):
    ready_reporter(queue_dir=tmp_path).shutdown(2)
    collector.stop()
    offline = make_reporter(queue_dir=tmp_path)
    assert offline.wait_for_specs(0)  # from disk, before any network answer
    offline.report("country", "c2")
    assert offline.counters().accepted == 1
    assert not offline.shutdown(1)
    collector.start()
    assert make_reporter(queue_dir=tmp_path).force_flush(10)
    assert state.total("country") == 1


def test_two_reporters_sharing_a_directory_never_double_count(ready_reporter, collector, state, tmp_path):
    first = ready_reporter(queue_dir=tmp_path)
    collector.stop()
    for _ in range(12):
        first.report("theme", "dark")
    assert not first.force_flush(0.3)  # batched and spooled, not delivered
    collector.start()
    second = ready_reporter(queue_dir=tmp_path)  # loads the same files while `first` still retries them
    assert second.force_flush(10) and first.force_flush(10)
    assert state.total("theme") == 12
    assert first.counters().sent + second.counters().sent >= 12


def test_the_disk_cap_drops_new_batches_and_counts_them(ready_reporter, collector, tmp_path):
    reporter = ready_reporter(queue_dir=tmp_path, max_batch_size=4, max_disk_bytes=200)
    collector.stop()
    for _ in range(40):
        reporter.report("browser", "edge")
    reporter.force_flush(0.5)
    reporter.shutdown(1)
    counters = reporter.counters()
    size = sum(p.stat().st_size for p in _files(tmp_path))
    assert size <= 200 and counters.queued == sum(map(_count, _files(tmp_path)))
    assert counters.accepted == 40 and counters.dropped == 40 - counters.queued > 0


def test_a_batch_past_the_retry_horizon_is_dropped_as_failed(make_reporter, state, tmp_path):
    spec = state.by_name("browser")
    outbox = tmp_path / "outbox"
    outbox.mkdir(mode=0o700)
    created = int((time.time() - RETRY_HORIZON_SECONDS - 60) * 1000)
    batch_id = os.urandom(16)
    request = veil_pb2.UploadRequest(
        batch_id=batch_id,
        metric="browser",
        spec_fingerprint=spec.fingerprint,
        count=1,
        index_sets=veil_pb2.IndexSets(set_size=spec.mechanism.q, indices=b"\x00\x00\x00\x00"),
    )
    (outbox / f"{created:013d}-1-{batch_id.hex()}.batch").write_bytes(request.SerializeToString())
    reporter = make_reporter(queue_dir=tmp_path)
    assert not reporter.force_flush(10)
    assert reporter.counters() == Counters(failed=1)
    assert state.calls == [] and _files(tmp_path) == []


def test_a_queue_dir_that_cannot_be_created_falls_back_to_memory(make_reporter, state, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    reporter = make_reporter(queue_dir=blocker / "sub")
    assert reporter.wait_for_specs(10)
    reporter.report("browser", "edge")
    assert reporter.force_flush(10) and state.total("browser") == 1


def test_retryable_failures_keep_a_spooled_batch_on_disk(ready_reporter, state, tmp_path):
    reporter = ready_reporter(queue_dir=tmp_path)
    state.fail_next(3, grpc.StatusCode.UNAVAILABLE)
    reporter.report("opt_in", "yes")
    assert reporter.force_flush(10)
    assert [o for _, o in state.calls] == ["UNAVAILABLE"] * 3 + ["counted"]
    assert _files(tmp_path) == []


def test_a_hung_upload_spills_new_reports_to_disk_instead_of_dropping_them(ready_reporter, state, tmp_path):
    # A backlog drains slowly after an outage: reports keep coming while an upload is in flight.
    # With a queue directory they become batches on disk (room left), not "queue full" drops.
    reporter = ready_reporter(
        queue_dir=tmp_path, max_queue_size=256, max_batch_size=32, schedule_delay_ms=20, export_timeout_ms=60_000
    )  # the held upload stays in flight however slow the loop
    in_flight, release = threading.Event(), threading.Event()
    state.gate = (in_flight, release)
    reporter.report("country", "c0")
    assert in_flight.wait(10)
    for _batch in range(80):  # 800 reports, three times the memory bound, while the upload hangs
        for _ in range(10):
            reporter.report("country", "c1")
        time.sleep(0.01)
    assert wait_until(lambda: sum(map(_count, _files(tmp_path))) == 801)
    assert wait_until(lambda: reporter.counters().queued == 801)  # counted once the batch is written
    counters = reporter.counters()
    assert (counters.accepted, counters.dropped, counters.queued) == (801, 0, 801)
    release.set()
    assert reporter.force_flush(10) and state.total("country") == 801


_APP = textwrap.dedent("""
    import sys, time
    from veil.client import Reporter
    reporter = Reporter(sys.argv[1], tls=False, queue_dir=sys.argv[2], schedule_delay_ms=200,
                        export_timeout_ms=60_000, memoize=False)
    assert reporter.wait_for_specs(10)
    while True:
        for _ in range(10):
            reporter.report("page", 3)
        # One write per line, so a kill never leaves half a line (print() writes its pieces
        # separately when unbuffered).
        sys.stdout.write(f"{time.monotonic()} {reporter.counters().accepted}\\n")
        sys.stdout.flush()
        time.sleep(0.01)
""")


def test_an_app_crash_loses_only_the_last_schedule_delay_while_an_upload_hangs(state, collector, tmp_path):
    """SIGKILL an app while its first upload hangs: every report accepted more than
    schedule_delay_ms (plus scheduling slack) before the kill is in the outbox on disk."""
    in_flight, release = threading.Event(), threading.Event()
    state.gate = (in_flight, release)
    app = subprocess.Popen(
        [sys.executable, "-c", _APP, collector.endpoint, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert in_flight.wait(20)
        time.sleep(2.0)  # the upload hangs; before the fix nothing after its batch was persisted
    finally:
        killed_at = time.monotonic()
        os.kill(app.pid, signal.SIGKILL)
        out, _ = app.communicate(10)
        release.set()
    progress = [(float(t), int(n)) for t, n in (line.split() for line in out.splitlines())]
    on_disk = sum(map(_count, _files(tmp_path)))
    slack = 0.8  # the worker's wake-up, encoding and fsync on a loaded machine
    due = max(n for t, n in progress if t <= killed_at - 0.2 - slack)
    assert due > 200 and on_disk >= due, (due, on_disk, progress[-1])
