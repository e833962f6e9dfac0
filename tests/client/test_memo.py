"""Longitudinal privacy: one memoized response per (metric, spec, value) and device."""

from __future__ import annotations

import collections
import stat

from veil.client._log import LogOnce
from veil.client._memo import MemoStore
from veil.mechanism import MetricSpec, SeededRandomSource


def test_a_thousand_reports_of_one_value_send_one_response(ready_reporter, state):
    reporter = ready_reporter(max_queue_size=5000)
    for _ in range(1000):
        reporter.report("page", "p17")
    assert reporter.force_flush(10)
    distinct = state.distinct("page")
    assert sum(distinct.values()) == 1000 and len(distinct) == 1


def test_two_devices_draw_independent_responses(ready_reporter, state, tmp_path):
    # Two devices: two queue directories, so two secrets and two memo stores.
    first = ready_reporter(queue_dir=tmp_path / "a")
    second = ready_reporter(queue_dir=tmp_path / "b")
    for reporter in (first, second):
        for _ in range(100):
            reporter.report("page", "p5")
        assert reporter.force_flush(10)
    distinct = state.distinct("page")
    # Each device repeats its own response; C(64, q) makes a coincidence all but impossible.
    assert sorted(distinct.values()) == [100, 100]
    assert (tmp_path / "a" / "device.key").read_bytes() != (tmp_path / "b" / "device.key").read_bytes()


def test_independence_across_many_devices():
    # 400 devices (secrets) memoize k = 2 Warner responses: about half send each answer, as
    # independent draws do, and each key differs.
    spec = MetricSpec.create("opt_in", ["no", "yes"], "warner", epsilon=1.0)
    source = SeededRandomSource(11)
    stores = [MemoStore(None, LogOnce()) for _ in range(400)]
    answers = collections.Counter(
        s.response(spec.name, spec.fingerprint, 1, lambda: spec.mechanism.randomize(1, source)) for s in stores
    )
    keep = spec.mechanism.keep_probability
    assert abs(answers[(1,)] / 400 - keep) < 4 * (keep * (1 - keep) / 400) ** 0.5
    assert len({s.key(spec.name, spec.fingerprint, 1) for s in stores}) == 400


def test_memoization_can_be_turned_off_per_metric(ready_reporter, state):
    reporter = ready_reporter(memoize={"page": False}, max_queue_size=5000)
    for _ in range(300):
        reporter.report("page", "p17")
        reporter.report("browser", "edge")
    assert reporter.force_flush(10)
    assert len(state.distinct("page")) > 50 and len(state.distinct("browser")) == 1


def test_memoization_survives_a_restart_and_a_spec_change_starts_anew(ready_reporter, state, tmp_path):
    first = ready_reporter(queue_dir=tmp_path)
    first.report("page", "p3")
    assert first.shutdown(5)
    second = ready_reporter(queue_dir=tmp_path)
    second.report("page", "p3")
    assert second.force_flush(10)
    assert list(state.distinct("page").values()) == [2]
    old = MemoStore(tmp_path, LogOnce())
    spec = state.by_name("page")
    assert len(old) == 1
    assert old.key("page", spec.fingerprint, 3) != old.key("page", "f" * 32, 3) != old.key("page", spec.fingerprint, 4)


def test_the_store_is_owner_only_and_names_no_value(tmp_path):
    spec = MetricSpec.create("browser", ["chrome", "safari", "edge", "firefox"], "subset", 1.0)
    store = MemoStore(tmp_path, LogOnce())
    response = store.response("browser", spec.fingerprint, 2, lambda: spec.mechanism.randomize(2))
    store.close()
    for name in ("device.key", "memo.log"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    log = (tmp_path / "memo.log").read_bytes()
    assert b"browser" not in log and b"edge" not in log and spec.fingerprint.encode() not in log
    assert MemoStore(tmp_path, LogOnce()).response("browser", spec.fingerprint, 2, lambda: (9,)) == response
    # Files left open to others (an old version, a careless copy) are tightened on open.
    for name in ("device.key", "memo.log"):
        (tmp_path / name).chmod(0o666)
    MemoStore(tmp_path, LogOnce()).close()
    for name in ("device.key", "memo.log"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


def test_a_torn_tail_is_cut_off_and_the_rest_kept(tmp_path):
    spec = MetricSpec.create("browser", ["chrome", "safari", "edge", "firefox"], "subset", 1.0)
    store = MemoStore(tmp_path, LogOnce())
    kept = store.response("browser", spec.fingerprint, 0, lambda: (0, 1))
    store.response("browser", spec.fingerprint, 1, lambda: (1, 2))
    store.close()
    log = tmp_path / "memo.log"
    log.write_bytes(log.read_bytes()[:-3])  # a crash in the middle of the second record
    again = MemoStore(tmp_path, LogOnce())
    assert len(again) == 1
    assert again.response("browser", spec.fingerprint, 0, lambda: (2, 3)) == kept
    assert again.response("browser", spec.fingerprint, 1, lambda: (0, 3)) == (0, 3)
    assert len(MemoStore(tmp_path, LogOnce())) == 2


def test_processes_sharing_a_store_agree_on_one_response(tmp_path):
    # Two stores on one directory stand for two processes: the second sees the first's entry
    # under the file lock instead of drawing its own.
    spec = MetricSpec.create("page", [f"p{i}" for i in range(64)], "subset", 1.0)
    a, b = MemoStore(tmp_path, LogOnce()), MemoStore(tmp_path, LogOnce())
    first = a.response("page", spec.fingerprint, 9, lambda: spec.mechanism.randomize(9))
    assert b.response("page", spec.fingerprint, 9, lambda: spec.mechanism.randomize(9)) == first


def test_a_corrupt_secret_is_replaced_and_starts_new_responses(tmp_path):
    store = MemoStore(tmp_path, LogOnce())
    store.response("m", "f", 0, lambda: (0,))
    store.close()
    (tmp_path / "device.key").write_bytes(b"short")
    fresh = MemoStore(tmp_path, LogOnce())
    assert len(fresh) == 0 and len((tmp_path / "device.key").read_bytes()) == 32
