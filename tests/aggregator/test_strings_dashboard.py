"""The dashboard draws a strings metric, in headless Chromium: the values its verification round
found (computed from real reports of planted values, veil_testing.planted_strings) with their
shares and intervals, and the detection floor, from the JSON of /v1/estimates as the aggregator
writes it (estimates_json), served beside the dashboard's own files."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from veil_testing.chromium import Browser
from veil_testing.planted_strings import PLANTED, strings_round, verified, withheld

from veil.aggregator import dashboard
from veil.aggregator.live import WindowEstimate, estimates_json
from veil.mechanism import code_text, string_code


class Served:
    """The dashboard's pages and a /v1/estimates body, over HTTP; the paths asked for, in order."""

    def __init__(self, estimates: list[WindowEstimate]) -> None:
        self.estimates = estimates
        self.asked: list[str] = []
        pages, served = dashboard.pages(), self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                served.asked.append(self.path)
                path = self.path.split("?")[0]
                if path == "/v1/estimates":
                    kind, body = "application/json", estimates_json(served.estimates, time.time())
                elif path in pages:
                    kind, body = pages[path][0], pages[path][1]()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass  # no request log in the test's output

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def found() -> WindowEstimate:
    return verified()


@pytest.fixture
def served(found) -> Iterator[Served]:
    """Three strings metrics: one that found the planted values, one that found nothing (found's
    round under another name, its values dropped) and one withheld."""
    assert found.strings is not None
    nothing = dataclasses.replace(
        found,
        metric=dataclasses.replace(found.metric, spec=strings_round("error")),
        strings=dataclasses.replace(found.strings, metric="error", values=()),
    )
    running = Served([found, nothing, withheld("quiet_signature")])
    yield running
    running.close()


def percent(x: float) -> str:
    """A share as the page writes it: two decimals below 10%, one from 10% on."""
    return f"{100 * x:.{1 if abs(100 * x) >= 10 else 2}f}%"


STATE = """(() => [...document.querySelectorAll("section.panel")].map((s) => ({
  metric: s.dataset.metric, withheld: s.dataset.withheld === "true",
  reason: s.querySelector(".reason")?.textContent ?? null,
  bars: [...s.querySelectorAll("g.bar")].map((g) => ({
    label: g.dataset.label, code: g.dataset.code, estimate: Number(g.dataset.estimate),
    lower: Number(g.dataset.lower), upper: Number(g.dataset.upper),
    text: g.querySelector("text.label").textContent, value: g.querySelector("text.value").textContent,
    title: g.querySelector("title").textContent})),
  floor: s.querySelector("p.floor") && {floor: Number(s.querySelector("p.floor").dataset.floor),
    found: Number(s.querySelector("p.floor").dataset.found),
    candidates: Number(s.querySelector("p.floor").dataset.candidates),
    text: s.querySelector("p.floor").textContent},
  floorLines: [...s.querySelectorAll("line.floor")].map((l) => ({x: Number(l.getAttribute("x1")),
    title: l.querySelector("title").textContent})),
  zero: s.querySelector("line.zero") && Number(s.querySelector("line.zero").getAttribute("x1")),
})))()"""


def test_a_strings_metric_shows_its_values_with_intervals_and_its_floor(served, found, chromium_binary, tmp_path):
    assert found.strings is not None
    with Browser(chromium_binary, tmp_path) as browser:
        page = browser.open(served.url)
        page.wait_for(
            "document.querySelectorAll('section.panel').length === 3 && document.body.dataset.state === 'ok'",
            timeout=15,
        )
        panels = {p["metric"]: p for p in page.evaluate(STATE)}
        assert list(panels) == ["crash_signature", "error", "quiet_signature"]
        shown = panels["crash_signature"]
        # The found values, largest first, each its share and interval [lower, upper] in %.
        values = found.strings.values
        assert [b["label"] for b in shown["bars"]] == [v.text for v in values]
        assert [b["code"] for b in shown["bars"]] == [v.code.hex() for v in values]
        for bar, v in zip(shown["bars"], values):
            assert (bar["estimate"], bar["lower"], bar["upper"]) == (v.estimate, v.lower, v.upper)
            assert bar["value"] == f"[{percent(v.lower)}, {percent(v.upper)}]"
            assert v.text in bar["title"] and "95% interval" in bar["title"]
        assert [b["text"] for b in shown["bars"]] == [code_text(string_code(v)) for v in PLANTED]
        # The floor: said in words, and drawn on the axis right of zero, left of every value.
        floor = shown["floor"]
        assert floor["floor"] == found.strings.floor and (floor["found"], floor["candidates"]) == (4, 6)
        words = percent(found.strings.floor)
        assert (
            floor["text"].startswith(f"Values below {words} of devices cannot be seen")
            and "4,000 reports" in floor["text"]
        )
        (line,) = shown["floorLines"]
        assert shown["zero"] < line["x"] and words in line["title"]
        # Nothing found: the floor still says what could not have been.
        nothing = panels["error"]
        assert nothing["bars"] == [] and nothing["reason"] == "No value found." and nothing["floor"]["found"] == 0
        quiet = panels["quiet_signature"]
        assert quiet["withheld"] and quiet["floor"] is None and "12 reports so far" in quiet["reason"]
        page.screenshot(tmp_path / "dashboard-strings.png")

        # The search filters the values by their text.
        page.evaluate(
            "(() => { const s = document.getElementById('search'); s.value = 'han'; "
            "s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for("document.querySelectorAll('section.panel[data-metric=crash_signature] g.bar').length === 1")
        (bar,) = panels_now(page)["crash_signature"]["bars"]
        assert bar["label"] == "hang"
        assert page.errors() == []
    # A strings metric has no trend: its series is never asked for.
    assert served.asked and not any(path.startswith("/v1/series") for path in served.asked)
    assert (tmp_path / "dashboard-strings.png").read_bytes().startswith(b"\x89PNG")


def panels_now(page) -> dict:
    return {p["metric"]: p for p in page.evaluate(STATE)}
