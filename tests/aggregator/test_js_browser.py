"""The TypeScript SDK in headless Chromium: a page from another origin fetches the specs over
CORS, randomizes with Web Crypto, uploads with fetch (keepalive), and the counts are exact."""

from __future__ import annotations

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from chromium import Browser
from running import counted

DIST = Path(__file__).resolve().parents[2] / "client" / "js" / "dist" / "src"

PAGE = """<!doctype html><meta charset="utf-8"><title>veil</title>
<script type="module">
import { fetchSpecs, randomize, uploadBatch, SystemWords } from "./sdk/index.js";
const endpoint = { url: new URLSearchParams(location.search).get("aggregator") };
const words = new SystemWords();
const accepted = {};
try {
  const { metrics } = await fetchSpecs(endpoint);
  for (const metric of metrics) {
    const reports = Array.from({ length: 120 }, (_, i) => randomize(metric.design, i % metric.labels.length, words));
    const result = await uploadBatch(endpoint, metric, reports, { initialMs: 50 });
    accepted[metric.name] = result.status === 200 ? result.accepted : -result.status;
  }
  window.veilResult = { accepted };
} catch (error) {
  window.veilResult = { error: String(error) };
}
</script>
"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_browser_page_reports_every_metric_counted_exactly(start_aggregator, chromium_binary, tmp_path):
    assert DIST.exists(), "the TypeScript SDK is not built: `make test` runs npm ci and npm run build in client/js"
    site = tmp_path / "site"
    shutil.copytree(DIST, site / "sdk")
    (site / "index.html").write_text(PAGE)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        origin = f"http://127.0.0.1:{server.server_address[1]}"
        aggregator = start_aggregator(cors_origins=[origin])
        with Browser(chromium_binary, tmp_path) as browser:
            page = browser.open(f"{origin}/index.html?aggregator=http://127.0.0.1:{aggregator.http_port}")
            result = page.wait_for("window.veilResult", timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    names = ("browser", "os", "opted_in", "crash_screen", "feature")
    assert result == {"accepted": {name: 120 for name in names}}
    assert {name: counted(aggregator, name) for name in names} == {name: 120 for name in names}
