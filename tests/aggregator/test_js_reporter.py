"""The TypeScript SDK's Reporter under Node against real aggregators, over HTTP and gRPC: every
mechanism counted exactly, numbers of a numeric metric counted in both its parts, memoized
responses (one response per value, spending epsilon once), the ledger kept in a directory across
restarts, retries through a rate limit and through an aggregator that was down (the same batches,
counted once)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from veil_testing.config_toml import LOAD
from veil_testing.node import JS, NodeReporter
from veil_testing.processes import free_port
from veil_testing.running import METRICS, UPLOAD_TOKEN, auth_section, counted, specs_of

WIRES = ("http", "grpc")


@pytest.fixture
def node_reporter():
    started: list[NodeReporter] = []

    def start(aggregator_or_address, wire: str, **options: object) -> NodeReporter:
        if isinstance(aggregator_or_address, tuple):
            http, grpc_address = aggregator_or_address
        else:
            http = f"http://127.0.0.1:{aggregator_or_address.http_port}"
            grpc_address = f"127.0.0.1:{aggregator_or_address.grpc_port}"
        started.append(NodeReporter(**({"http": http} if wire == "http" else {"grpc": grpc_address}), **options))
        return started[-1]

    yield start
    for reporter in started:
        reporter.close()


WANTED = {"browser": 250, "os": 130, "opted_in": 120, "crash_screen": 101, "feature": 99}


@pytest.mark.parametrize("wire", WIRES)
def test_every_mechanism_counted_exactly(start_aggregator, node_reporter, wire):
    aggregator = start_aggregator()
    reporter = node_reporter(aggregator, wire, maxBatchSize=64)
    for metric, n in WANTED.items():
        reporter.report(metric, 1, n)
    reporter.report("browser", "safari", 10)  # a label
    reporter.report("nosuch", 1)  # a metric the aggregator does not declare: dropped, counted
    answer = reporter.ask(do="flush", timeoutMs=60_000)
    sent = sum(WANTED.values()) + 10
    assert answer["counters"] | {"retried": 0} == {
        "accepted": sent,
        "dropped": 1,
        "sent": sent,
        "retried": 0,
        "failed": 0,
        "queued": 0,
        "limited": 0,
        "overBudget": 0,
        "tooLate": 0,
        "ledgerUnavailable": 0,
        "clipped": 0,
    }
    assert answer["ok"] is False  # one report was dropped since the start
    assert {m: counted(aggregator, m) for m in WANTED} == WANTED | {"browser": 260}
    assert reporter.ask(do="shutdown", timeoutMs=5000)["ok"] is True
    assert "nosuch" in reporter.close()


# A numeric metric beside the categorical ones: its mean and distribution parts, epsilon 1 each.
LOAD_MS = {
    "name": "load_ms",
    "type": "numeric",
    "range": [0, 10000],
    "buckets": [100, 250, 500, 1000, 2500],
    "epsilon": 2.0,
    "reports_per_period": LOAD,
}
PARTS = ("load_ms.mean", "load_ms.distribution")


@pytest.mark.parametrize("wire", WIRES)
def test_numbers_are_counted_in_both_parts_clipped_outside_the_range(start_aggregator, node_reporter, wire):
    # The aggregator's own specs (fingerprints made by the Python SDK's NumericSpec): the JS SDK
    # reproduces both parts, or their reports would be dropped on the device or refused.
    aggregator = start_aggregator(sections={"metrics": [*METRICS, LOAD_MS]})
    reporter = node_reporter(aggregator, wire, maxBatchSize=64)
    values = [-250.0, 0, 99.5, 412.7, 2500, 9999.9, 10000, 12345.6]  # two outside [0, 10000]
    for value in values:
        reporter.report("load_ms", value, 25)
    reporter.report("browser", "edge", 10)
    answer = reporter.ask(do="flush", timeoutMs=60_000)
    n = 25 * len(values)
    assert answer["ok"] is True
    counters = answer["counters"]
    assert (counters["accepted"], counters["sent"], counters["clipped"]) == (2 * n + 10, 2 * n + 10, 50)
    assert {m: counted(aggregator, m) for m in (*PARTS, "browser")} == {PARTS[0]: n, PARTS[1]: n, "browser": 10}
    # Eight values, each a memoized response per part: at most 8 fresh responses (the mean's
    # points are 0 ... 10000 with one device's alpha, so fewer), each spending the part's epsilon.
    for part in PARTS:
        spent = reporter.ask(do="spent", metric=part)
        assert spent["reports"] == n and 1.0 <= spent["lifetimeEpsilon"] <= len(values)


@pytest.mark.parametrize("wire", WIRES)
def test_a_steady_number_spends_epsilon_once_per_part(start_aggregator, node_reporter, wire):
    aggregator = start_aggregator(sections={"metrics": [*METRICS, LOAD_MS]})
    reporter = node_reporter(aggregator, wire)
    reporter.report("load_ms", 412.7, 200)
    assert reporter.ask(do="flush", timeoutMs=60_000)["ok"] is True
    for part in PARTS:
        spent = reporter.ask(do="spent", metric=part)
        assert (spent["reports"], spent["lifetimeEpsilon"]) == (200, 1.0)
        # one response sent 200 times: its q categories estimated alike, every other alike
        (total,) = aggregator.live.current(part, "total")
        values = np.round(total.estimate.estimate, 9)
        assert total.n == 200 and len(set(values.tolist())) == 2
        assert int((values == values.max()).sum()) == specs_of([LOAD_MS])[part].mechanism.q


@pytest.mark.parametrize("wire", WIRES)
def test_a_repeated_value_sends_one_memoized_response_and_spends_epsilon_once(start_aggregator, node_reporter, wire):
    # The privacy audit of the memo: 300 reports of one value are one randomized response sent
    # 300 times, so the counts hold exactly q categories, each 300 times, and epsilon is spent once.
    # Without the memo each report is a fresh response (and spends epsilon).
    aggregator = start_aggregator()
    reporter = node_reporter(aggregator, wire, memoize={"os": False})
    reporter.report("browser", "edge", 300)
    reporter.report("os", "ios", 300)
    assert reporter.ask(do="flush", timeoutMs=60_000)["ok"] is True
    browser = reporter.ask(do="spent", metric="browser")
    assert (browser["reports"], browser["lifetimeEpsilon"]) == (300, 1.0)
    os_ = reporter.ask(do="spent", metric="os")
    assert os_["reports"] == 300 and os_["lifetimeEpsilon"] == pytest.approx(600.0)
    (total,) = [e for e in aggregator.live.current("browser", "total")]
    assert total.n == 300
    values = np.round(total.estimate.estimate, 9)
    # one set of q = 2 categories (subset design, k = 8, epsilon = 1) reported 300 times, the rest never
    assert len(set(values.tolist())) == 2 and int((values == values.max()).sum()) == 2
    (os_total,) = aggregator.live.current("os", "total")
    assert len(set(np.round(os_total.estimate.estimate, 9).tolist())) > 2  # fresh responses differ


@pytest.mark.parametrize("wire", WIRES)
def test_the_ledger_and_memo_in_a_directory_survive_a_restart(start_aggregator, node_reporter, wire, tmp_path):
    aggregator = start_aggregator()
    store = tmp_path / "veil"
    first = node_reporter(aggregator, wire, store=str(store))
    first.report("browser", "chrome", 5)
    assert first.ask(do="flush", timeoutMs=60_000)["ok"] is True
    assert first.ask(do="shutdown", timeoutMs=5000)["ok"] is True
    first.close()
    assert {p.name: p.stat().st_mode & 0o777 for p in store.iterdir()} == {
        "device-key": 0o600,
        "memo": 0o600,
        "ledger": 0o600,
        "specs": 0o600,
    }
    second = node_reporter(aggregator, wire, store=str(store))
    second.report("browser", "chrome", 5)  # memoized before the restart: nothing new spent
    second.report("browser", "edge", 1)  # a new value: a new response, epsilon spent
    assert second.ask(do="flush", timeoutMs=60_000)["ok"] is True
    spent = second.ask(do="spent", metric="browser")
    assert (spent["reports"], spent["lifetimeEpsilon"]) == (11, 2.0)
    assert counted(aggregator, "browser") == 11


@pytest.mark.parametrize("wire", WIRES)
def test_the_period_bound_and_an_apps_budget_are_kept(start_aggregator, node_reporter, wire):
    aggregator = start_aggregator()
    reporter = node_reporter(aggregator, wire, memoize=False, lifetimeBudget={"os": 4.0})
    reporter.report("os", "linux", 5)  # epsilon 2 each: two fit a lifetime budget of 4
    answer = reporter.ask(do="flush", timeoutMs=60_000)
    assert (answer["counters"]["sent"], answer["counters"]["overBudget"]) == (2, 3)
    assert counted(aggregator, "os") == 2


@pytest.mark.parametrize("wire", WIRES)
def test_retries_through_a_rate_limit_honour_the_hint_and_count_once(start_aggregator, node_reporter, wire):
    aggregator = start_aggregator(max_batch=100, sections={"auth": auth_section(rate_limit=400, rate_burst=100)})
    reporter = node_reporter(aggregator, wire, token=UPLOAD_TOKEN, retryInitialBackoffMs=50, memoize=False)
    for value in range(600):
        reporter.report("browser", value % 8)
    answer = reporter.ask(do="flush", timeoutMs=60_000)
    assert answer["ok"] is True and answer["counters"]["sent"] == 600 and answer["counters"]["retried"] > 0
    assert counted(aggregator, "browser") == 600
    limited = aggregator.instruments.registry.get_sample_value(
        "veil_token_reports_rate_limited_total", {"token": "app-a"}
    )
    assert limited and limited > 0  # batches were refused with a hint, then sent again


@pytest.mark.parametrize("wire", WIRES)
def test_batches_wait_out_an_aggregator_that_is_down_and_count_once(start_aggregator, node_reporter, wire, tmp_path):
    # The aggregator (SQLite, so its counts outlive it) stops while batches are queued and being
    # retried; a new one on the same ports and file counts every report once.
    store, ports = f"sqlite:///{tmp_path / 'veil.db'}", {"grpc_port": free_port(), "http": f"127.0.0.1:{free_port()}"}
    aggregator = start_aggregator(store, **ports)
    reporter = node_reporter(aggregator, wire, retryInitialBackoffMs=100, retryMaxBackoffMs=400, memoize=False)
    reporter.report("browser", 2, 300)
    assert reporter.ask(do="flush", timeoutMs=60_000)["ok"] is True
    assert counted(aggregator, "browser") == 300
    aggregator.stop(grace=0)
    reporter.report("browser", 3, 200)
    down = reporter.ask(do="flush", timeoutMs=1500)  # cannot be delivered: retried meanwhile
    assert down["ok"] is False and down["counters"]["queued"] == 200 and down["counters"]["retried"] > 0
    aggregator = start_aggregator(store, **ports)
    up = reporter.ask(do="flush", timeoutMs=60_000)
    assert up["ok"] is True
    assert up["counters"] | {"retried": 0} == {
        "accepted": 500,
        "dropped": 0,
        "sent": 500,
        "retried": 0,
        "failed": 0,
        "queued": 0,
        "limited": 0,
        "overBudget": 0,
        "tooLate": 0,
        "ledgerUnavailable": 0,
        "clipped": 0,
    }
    assert counted(aggregator, "browser") == 500


def test_the_memo_is_keyed_and_alpha_drawn_as_the_python_sdk_does_it(tmp_path):
    # One device secret, the same key for every (metric, fingerprint, category) in both SDKs, and
    # the same rounding threshold for every numeric mean part (metric, fingerprint).
    from veil.client._log import LogOnce
    from veil.client._memo import MemoStore

    secret = bytes(range(7, 39))
    (tmp_path / MemoStore.SECRET_FILE).write_bytes(secret)
    (tmp_path / MemoStore.SECRET_FILE).chmod(0o600)
    python = MemoStore(tmp_path, LogOnce())
    cases = [("browser", "0123456789abcdef0123456789abcdef", 3), ("écran", "f" * 32, 0), ("m" * 300, "", 2**31)]
    script = (
        "import { Memo } from './dist/src/memo.js';"
        f"const memo = new Memo(Uint8Array.from({list(secret)}));"
        f"console.log(JSON.stringify({json.dumps(cases)}.map(([m, f, i]) => [memo.key(m, f, i), memo.alpha(m, f)])));"
    )
    out = subprocess.run(
        [shutil.which("node") or "node", "--input-type=module", "-e", script],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[python.key(m, f, i).hex(), python.alpha(m, f)] for m, f, i in cases]
