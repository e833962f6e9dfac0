"""The SQLite store under faults: `veil serve` SIGKILLed under load, a full disk, files it must not
serve, a second `veil serve` on the same file. Every count is exact: the file must hold the counts
of exactly the reports the devices saw acknowledged (reliability_kit.assert_exact), plus the
batches uploaded here directly.

Durability (docs/operating.md, "Durability"): WAL with synchronous = FULL, so a commit is fsynced before the
aggregator acknowledges the batch. A process kill leaves written data in the page cache, so
what a test here can show is that nothing acknowledged is lost or doubled across a SIGKILL
and the recovery of the WAL; a power loss is covered by the fsync of each commit, stated, not
tested.
"""

from __future__ import annotations

import contextlib
import errno
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from reliability_kit import METRICS, Load, RawBatch, assert_exact, flush_all
from veil_testing.waiting import wait_until

from veil.aggregator.store._sqlite import SCHEMA_VERSION
from veil.mechanism import MetricSpec
from veil.wire.v1 import veil_pb2_grpc

pytestmark = pytest.mark.starts_first  # a minute or more on a loaded machine: SIGKILL cycles, a full disk

REPLY_DELAY = 0.2  # seconds the aggregator's replies are held on their way to the devices


def bulk_spec() -> MetricSpec:
    bulk = next(m for m in METRICS if m["name"] == "bulk")
    return MetricSpec.create(bulk["name"], bulk["labels"], bulk["mechanism"], bulk["epsilon"])


@pytest.mark.parametrize("cycles", [5, pytest.param(40, marks=pytest.mark.slow)])
def test_sigkill_under_load_loses_and_doubles_no_acknowledged_batch(
    cycles, make_aggregator, make_device, make_proxy, tmp_path
):
    """`veil serve` on SQLite SIGKILLed `cycles` times or more under load from four SDK devices (two spool
    under a queue directory). The devices reach it through a proxy that holds its replies
    200 ms (at 50 ms, 15 kills on a loaded machine stranded none), so kills strand batches that
    were committed but never acknowledged: their retries must be recognized as duplicates from
    the batch ids in the file (asserted: duplicates > 0)."""
    url = f"sqlite://{tmp_path}/data/veil.db"
    serve = make_aggregator(url).start()
    proxy = make_proxy(serve.grpc_port, REPLY_DELAY)
    devices = [
        make_device(f"127.0.0.1:{proxy.port}", seed, queue_dir=tmp_path / f"device-{seed}" if seed % 2 else None)
        for seed in range(4)
    ]
    rng = random.Random(1400 + cycles)
    kills = 0
    with Load(devices, rate=200):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        # `cycles` kills, and more (up to three times as many) until one has stranded a committed
        # batch: whether a reply is held at the moment of a kill is a matter of timing.
        while kills < cycles or (kills < 3 * cycles and not wait_until(lambda: any(d.duplicates for d in devices), 1)):
            time.sleep(rng.uniform(0.2, 0.6))
            serve.kill()
            time.sleep(rng.uniform(0.0, 0.2))
            serve.start()  # the WAL is recovered when the file is opened
            kills += 1
        time.sleep(0.3)
    flush_all(devices, timeout=60 + 2 * kills)
    summary = assert_exact(devices, url)  # read from the file while it serves
    assert serve.starts == kills + 1 and summary["retried"] > 0, summary
    assert summary["duplicates"] > 0, f"no kill stranded a committed batch: {summary}"
    assert serve.terminate() == 0
    assert_exact(devices, url)  # and after a clean stop
    print(f"\nveil serve on SQLite SIGKILLed {kills} times: {summary}")


@pytest.fixture
def small_filesystem(tmp_path):
    """A 16 MiB tmpfs mounted at tmp_path/fs (a real full disk), unmounted after the test; the
    test is skipped where this sandbox may not mount one."""
    where = tmp_path / "fs"
    where.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)], capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip()}): the disk-full test needs one")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(filler: Path) -> None:
    """Fill the filesystem of `filler` by appending to it until ENOSPC."""
    with open(filler, "ab", buffering=0) as file:  # unbuffered: nothing left to write at close
        try:
            while True:
                file.write(b"\0" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


def test_a_full_disk_refuses_uploads_not_serving_then_recovers_exactly(
    small_filesystem, make_aggregator, make_device, tmp_path
):
    """The store's filesystem fills up under load: uploads get UNAVAILABLE (none is acknowledged
    and then lost), health turns NOT_SERVING, the log says so; space returns and health is
    SERVING again, the devices' backlogs drain, and the file holds exactly what was acknowledged."""
    url = f"sqlite://{small_filesystem}/veil.db"
    filler = small_filesystem / "filler"
    filler.touch()  # made now: a full filesystem may have no room for a new file
    serve = make_aggregator(url).start()
    devices = [
        make_device(serve.endpoint, seed, queue_dir=tmp_path / f"device-{seed}" if seed == 1 else None)
        for seed in range(3)
    ]
    spec = bulk_spec()
    raw = RawBatch(spec, 500, seed=5)
    channel = grpc.insecure_channel(serve.endpoint)
    collector = veil_pb2_grpc.CollectorStub(channel)
    with Load(devices, rate=300):
        assert all(d.reporter.wait_for_specs(30) for d in devices)
        time.sleep(1.0)
        fill(filler)
        assert wait_until(lambda: serve.health() == "NOT_SERVING", 60), "health stayed SERVING on a full disk"
        with pytest.raises(grpc.RpcError) as refused:
            collector.Upload(raw.request(b"\x42" * 16), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        time.sleep(1.0)
        filler.unlink()  # space returns
        assert wait_until(lambda: serve.health() == "SERVING", 30), "health stayed NOT_SERVING with space back"
        time.sleep(1.0)
    flush_all(devices)
    answer = collector.Upload(raw.request(b"\x42" * 16), timeout=10)
    assert not answer.duplicate  # the refused upload had counted nothing
    channel.close()
    summary = assert_exact(devices, url, extra={"bulk": raw.counts})
    assert summary["retried"] > 0, summary
    messages = [line.get("msg") for line in serve.log_lines()]
    assert "SQLite write failed: the batches of this transaction were not counted, their clients retry them" in messages
    assert "counter store unavailable: NOT_SERVING" in messages and "SQLite store writable again" in messages
    print(f"\nfull disk under load: {summary}")


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for start in range(2 * 4096, len(data) - 4096, 2 * 4096):
        data[start : start + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))


def _foreign(path: Path) -> None:
    path.unlink()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        db.commit()


def _newer(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.commit()


DAMAGES = {
    "corrupt": (_corrupt, "is corrupt (quick_check: "),
    "another program's": (_foreign, "is a SQLite database of another program"),
    "newer schema": (_newer, "written by a newer Veil"),
}


def test_files_it_cannot_serve_stop_veil_serve_in_one_sentence_and_veil_store_check_says_why(
    make_aggregator, make_device, tmp_path
):
    """A file with counts in it, then copies of it damaged three ways: `veil serve` on each
    exits 2 with one sentence and leaves the file as it was; `veil store check` passes the good
    file (while it is served) and fails each damaged one."""
    path = tmp_path / "veil.db"
    serve = make_aggregator(f"sqlite://{path}").start()
    device = make_device(serve.endpoint, 1)
    assert device.reporter.wait_for_specs(30)
    for _ in range(2000):
        device.report_some(1)
    flush_all([device])
    check = [sys.executable, "-m", "veil.cli", "store", "check", "--store"]
    out = subprocess.run([*check, f"sqlite://{path}"], capture_output=True, text=True, timeout=60)  # while it serves
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{path}: OK" in out.stdout and f"schema version {SCHEMA_VERSION}" in out.stdout, out.stdout
    assert "browser [total]: 1 bucket, " in out.stdout and "batch ids: " in out.stdout, out.stdout
    assert serve.terminate() == 0
    for name, (damage, said) in DAMAGES.items():
        copy = tmp_path / f"{name}.db"
        shutil.copy(path, copy)
        damage(copy)
        before = copy.read_bytes()
        out = subprocess.run(
            [sys.executable, "-m", "veil.aggregator", "--config", str(serve.config), "--store", f"sqlite://{copy}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"veil serve: {copy} ") and said in out.stderr, out.stderr
        assert copy.read_bytes() == before  # left as it was, for an operator to look at
        out = subprocess.run([*check, f"sqlite://{copy}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stdout.startswith(f"{copy}: NOT OK: {copy} "), out.stdout + out.stderr


def test_a_second_veil_serve_on_the_same_file_is_refused_in_one_sentence(make_aggregator, tmp_path):
    url = f"sqlite://{tmp_path}/veil.db"
    first = make_aggregator(url).start()
    second = make_aggregator(url)
    out = subprocess.run(
        [sys.executable, "-m", "veil.aggregator", "--config", str(second.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.strip() == (
        f"veil serve: The SQLite store {tmp_path}/veil.db is in use by another process "
        f"(pid {first.pid}): one aggregator serves a SQLite file at a time."
    )
    assert first.health() == "SERVING"  # (the lock goes with its process: the SIGKILL test restarts on it)
