"""The TypeScript SDK in headless Chromium: a page from another origin runs a Reporter that fetches
the specs over CORS, randomizes with Web Crypto (memoized responses, the ledger in IndexedDB),
uploads with fetch (keepalive) and flushes; the counts are exact, the ledger and the memo survive
a reload, and a page going away sends what it had batched."""

from __future__ import annotations

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from veil_testing.chromium import Browser
from veil_testing.running import counted
from veil_testing.waiting import wait_until

DIST = Path(__file__).resolve().parents[2] / "client" / "js" / "dist" / "src"
NAMES = ("browser", "os", "opted_in", "crash_screen", "feature")

# ?aggregator=URL&n=N[&storage=localStorage]: report N calls of every metric (values cycling through its categories),
# flush, and publish what the Reporter says; the spending read before reporting shows what an
# earlier page of this origin left in IndexedDB.
PAGE = """<!doctype html><meta charset="utf-8"><title>veil</title>
<script type="module">
import { Reporter, browserStore } from "./sdk/index.js";
const params = new URLSearchParams(location.search);
// A browser that refuses IndexedDB (some private modes): the store falls back to localStorage.
if (params.get("storage") === "localStorage") Object.defineProperty(globalThis, "indexedDB", { value: undefined });
try {
  const store = await browserStore();
  const reporter = new Reporter({ endpoint: params.get("aggregator"), store, retryInitialBackoffMs: 50 });
  await reporter.whenReady();
  const before = {}, after = {};
  const names = ["browser", "os", "opted_in", "crash_screen", "feature"];
  for (const name of names) before[name] = reporter.privacySpent(name);
  for (const name of names) {
    for (let i = 0; i < Number(params.get("n")); i++) reporter.report(name, i % 2);
  }
  const ok = await reporter.flush(30000);
  for (const name of names) after[name] = reporter.privacySpent(name);
  window.veilResult = { store: store.kind, ok, counters: reporter.counters(), before, after };
} catch (error) {
  window.veilResult = { error: String(error) };
}
</script>
"""

# A Reporter whose batches would wait a minute: the page going away sends them (fetch keepalive).
LEAVING = """<!doctype html><meta charset="utf-8"><title>veil</title>
<script type="module">
import { Reporter } from "./sdk/index.js";
const reporter = new Reporter({ endpoint: new URLSearchParams(location.search).get("aggregator"),
                                scheduleDelayMs: 60000 });
await reporter.whenReady();
for (let i = 0; i < 7; i++) reporter.report("os", "ios");
window.veilResult = reporter.counters();
</script>
"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _site(tmp_path: Path) -> Path:
    assert DIST.exists(), "the TypeScript SDK is not built: `make test` runs npm ci and npm run build in client/js"
    site = tmp_path / "site"
    shutil.copytree(DIST, site / "sdk")
    (site / "index.html").write_text(PAGE)
    (site / "leaving.html").write_text(LEAVING)
    return site


@pytest.mark.parametrize("storage", ["IndexedDB", "localStorage"])
def test_a_browser_page_reports_and_flushes_counted_exactly_and_its_ledger_survives_a_reload(
    start_aggregator, chromium_binary, tmp_path, storage
):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(_site(tmp_path))))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        origin = f"http://127.0.0.1:{server.server_address[1]}"
        aggregator = start_aggregator(cors_origins=[origin])
        url = f"{origin}/index.html?aggregator=http://127.0.0.1:{aggregator.http_port}&storage={storage}"
        with Browser(chromium_binary, tmp_path) as browser:
            first = browser.open(f"{url}&n=120").wait_for("window.veilResult", timeout=60)
            second = browser.open(f"{url}&n=30").wait_for("window.veilResult", timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert "error" not in first, first
    assert first["store"] == storage and first["ok"] is True
    assert first["counters"] == {
        "accepted": 600,
        "dropped": 0,
        "sent": 600,
        "retried": 0,
        "failed": 0,
        "queued": 0,
        "limited": 0,
        "overBudget": 0,
        "tooLate": 0,
        "ledgerUnavailable": 0,
        "clipped": 0,
    }
    assert all(first["before"][name]["reports"] == 0 for name in NAMES)
    # Two values per metric: two fresh responses, each spending the metric's epsilon once.
    epsilon = {"browser": 1.0, "os": 2.0, "opted_in": 1.0, "crash_screen": 2.0, "feature": 2.0}
    assert {n: first["after"][n]["lifetimeEpsilon"] for n in NAMES} == {n: 2 * epsilon[n] for n in NAMES}
    # The reloaded page finds the ledger in its store, and the memo: its repeats spend nothing new.
    assert "error" not in second, second
    assert {n: second["before"][n]["reports"] for n in NAMES} == dict.fromkeys(NAMES, 120)
    assert {n: second["after"][n]["reports"] for n in NAMES} == dict.fromkeys(NAMES, 150)
    assert {n: second["after"][n]["lifetimeEpsilon"] for n in NAMES} == {n: 2 * epsilon[n] for n in NAMES}
    assert second["ok"] is True and second["counters"]["sent"] == 150
    assert {name: counted(aggregator, name) for name in NAMES} == dict.fromkeys(NAMES, 150)


def test_a_page_going_away_sends_what_it_had_batched(start_aggregator, chromium_binary, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(_site(tmp_path))))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        origin = f"http://127.0.0.1:{server.server_address[1]}"
        aggregator = start_aggregator(cors_origins=[origin])
        with Browser(chromium_binary, tmp_path) as browser:
            page = browser.open(f"{origin}/leaving.html?aggregator=http://127.0.0.1:{aggregator.http_port}")
            assert page.wait_for("window.veilResult", timeout=60)["queued"] == 7
            assert counted(aggregator, "os") == 0  # held for a minute
            page.evaluate("location.href = 'about:blank'")
            assert wait_until(lambda: counted(aggregator, "os") == 7, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
