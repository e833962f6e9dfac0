"""The dashboard at /: its files over HTTP, and the page itself in headless Chromium."""

from __future__ import annotations

import json
import math
import random
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from veil_testing.chromium import Browser
from veil_testing.running import (
    METRICS,
    READ_TOKEN,
    UPLOAD_TOKEN,
    auth_section,
    bearer,
    collector,
    config_dict,
    make_upload,
    specs_of,
)

from veil.aggregator import dashboard
from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator
from veil.aggregator.errors import StoreUnavailable
from veil.aggregator.store import MemoryStore
from veil.client._encoding import encode_batch
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2

pytestmark = pytest.mark.starts_first  # a minute or more: a browser

# Labels are configured strings: the page must show them as text, never run them as markup.
HOSTILE = {
    "name": "<b>labels</b> & names",
    "mechanism": "krr",
    "epsilon": 3.0,
    "labels": [
        '<img src=x onerror="document.body.dataset.pwned=1">',
        "a & b",
        "\"quoted\" 'single'",
        "a-rather-long-category-label-that-the-chart-shortens",
    ],
}
ALL_METRICS = [*METRICS, HOSTILE]
SPECS = specs_of(ALL_METRICS)
PANELS = [(m["name"], w) for m in ALL_METRICS for w in m.get("windows", ["total"])]


class SwitchableStore(MemoryStore):
    """A memory store whose reads fail while `failing` is set (the aggregator answers 503)."""

    failing = False

    def _switched(self) -> None:
        if self.failing:
            raise StoreUnavailable("switched off by the test")

    def versions(self, keys):
        self._switched()
        return super().versions(keys)

    def versioned_read(self, keys, requests):
        self._switched()
        return super().versioned_read(keys, requests)


@pytest.fixture
def aggregator() -> Iterator[Aggregator]:
    config = config_dict()
    config["metrics"] = ALL_METRICS
    now = time.time()  # a frozen clock: the 1h bucket cannot roll over during the test
    started = Aggregator(
        parse_config(config), store=SwitchableStore(clock=lambda: now), pages=dashboard.pages(), clock=lambda: now
    )
    started.start()
    yield started
    started.stop(grace=0)


def get(aggregator: Aggregator, path: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}{path}", timeout=10) as response:
        return response.headers["Content-Type"], response.read()


def upload(aggregator: Aggregator, name: str, n: int, seed: int) -> None:
    """n randomized reports of a skewed truth in which the last categories never occur, so some
    unbiased estimates come out negative."""
    spec = SPECS[name]
    rng = random.Random(seed)
    absent = spec.k // 4
    weights = [1.0 / (i + 1) for i in range(spec.k - absent)] + [0.0] * absent
    source = SeededRandomSource(seed)
    reports = [spec.mechanism.randomize(v, source) for v in rng.choices(range(spec.k), weights=weights, k=n)]
    request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, rng.randbytes(16)))
    collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(request, timeout=10)


# ---- the files ------------------------------------------------------------------------------

EXTERNAL = re.compile(r"""(?i)(?:\b[a-z][a-z0-9+.-]*:)?//[^\s"'`)<>]+""")
XMLNS = "http://www.w3.org/2000/svg"  # a namespace name, never fetched


def test_the_page_and_its_assets_are_served_with_their_content_types(aggregator):
    content_type, html = get(aggregator, "/")
    assert content_type == "text/html; charset=utf-8"
    page = html.decode()
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert "connect-src 'self'" in page and "script-src 'self'" in page  # the CSP allows nothing foreign
    referenced = set(re.findall(r'(?:src|href)="([^"]+)"', page))
    assert {"dashboard.js", "dashboard.css"} <= referenced
    for asset, expected in (("/dashboard.js", "text/javascript"), ("/dashboard.css", "text/css")):
        content_type, body = get(aggregator, asset)
        assert content_type == f"{expected}; charset=utf-8" and body
    # Every relative reference resolves to a page the aggregator serves (v1/…, metrics: its own routes).
    served = set(dashboard.pages()) | {"/v1/estimates", "/metrics"}
    assert {"/" + ref for ref in referenced if not ref.startswith("data:")} <= served
    assert get(aggregator, "/dashboard.js")[1] == dashboard.pages()["/dashboard.js"][1]()


def test_nothing_is_fetched_from_elsewhere_and_no_text_becomes_markup():
    for path, (_, body) in dashboard.pages().items():
        text = body().decode()
        urls = [u for u in EXTERNAL.findall(text) if u != XMLNS]
        assert urls == [], (path, urls)
        assert "@import" not in text and "url(" not in text, path
    script = dashboard.pages()["/dashboard.js"][1]().decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    # The read token can reach neither the console nor localStorage (which holds one preference).
    assert not re.search(r"\bconsole\.\w+\(", script)
    assert set(re.findall(r"localStorage\.\w+\(([^,)]*)", script)) == {'"veil.projection"'}


# ---- the page in Chromium -------------------------------------------------------------------

STATE = """(() => {
  const panels = [...document.querySelectorAll("section.panel")].map((s) => ({
    metric: s.dataset.metric, window: s.dataset.window, n: Number(s.dataset.n),
    name: s.querySelector("h2 .name").textContent,
    withheld: s.dataset.withheld === "true", reason: s.querySelector(".reason")?.textContent ?? null,
    estimand: s.querySelector(".estimand").textContent,
    bars: [...s.querySelectorAll("g.bar")].map((g) => ({
      label: g.dataset.label, estimate: Number(g.dataset.estimate), lower: Number(g.dataset.lower),
      upper: Number(g.dataset.upper), text: g.querySelector("text.label").textContent,
      title: g.querySelector("title").textContent, projected: g.querySelectorAll(".projected").length,
      inside: [...g.querySelectorAll(".interval, .estimate")].every((shape) => {
        const box = shape.getBBox(), view = shape.ownerSVGElement.viewBox.baseVal;
        return box.x >= view.x - 0.5 && box.x + box.width <= view.x + view.width + 0.5;
      })})),
    zeros: s.querySelectorAll("line.zero").length}));
  return {state: document.body.dataset.state, updates: Number(document.body.dataset.updates || 0),
          status: document.getElementById("status").textContent, panels,
          pwned: document.body.dataset.pwned ?? null, images: document.images.length};
})()"""


def panels_by_key(state: dict) -> dict[tuple[str, str], dict]:
    return {(p["metric"], p["window"]): p for p in state["panels"]}


def test_the_dashboard_draws_every_metric_and_follows_the_aggregator(aggregator, chromium_binary, tmp_path):
    started = time.monotonic()
    for i, m in enumerate(ALL_METRICS):  # "feature" stays under min_n (100): withheld
        upload(aggregator, m["name"], 40 if m["name"] == "feature" else 400, seed=i)
    url = f"http://127.0.0.1:{aggregator.http_port}/"

    with Browser(chromium_binary, tmp_path) as browser:
        page = browser.open(url)
        page.wait_for(
            f"document.querySelectorAll('section.panel').length === {len(PANELS)} "
            "&& document.body.dataset.state === 'ok'",
            timeout=15,
        )
        first = page.evaluate(STATE)
        panels = panels_by_key(first)
        assert list(panels) == PANELS  # one panel per metric and window, in config order
        assert first["status"].startswith("Updated ") and all(p["name"] == p["metric"] for p in first["panels"])
        for (name, _window), panel in panels.items():
            if name == "feature":
                assert panel["withheld"] and panel["n"] == 40 and panel["bars"] == []
                assert "40 reports so far" in panel["reason"]
                continue
            spec = SPECS[name]
            assert not panel["withheld"] and panel["n"] == 400 and panel["zeros"] == 1
            # Every category (fewer than the default top 10), largest estimate first.
            assert sorted(b["label"] for b in panel["bars"]) == sorted(spec.labels)
            assert [b["estimate"] for b in panel["bars"]] == sorted(
                (b["estimate"] for b in panel["bars"]), reverse=True
            )
            assert panel["estimand"].startswith("Estimates the share of ") and "period" in panel["estimand"]
            for bar in panel["bars"]:
                # Score intervals are clipped to [0, 1]: an estimate below 0 has its interval from 0.
                assert bar["lower"] <= max(bar["estimate"], 0) < bar["upper"] and bar["inside"], (name, bar)
                assert bar["label"] in bar["title"] and "95% interval" in bar["title"] and "%" in bar["title"]
        # Labels are text: shown verbatim (the long one shortened), and nothing of them ran.
        hostile = panels[(HOSTILE["name"], "total")]["bars"]
        assert sorted(b["label"] for b in hostile) == sorted(HOSTILE["labels"])
        for bar in hostile:
            if bar["text"] != bar["label"]:  # shortened: a prefix, then an ellipsis
                assert bar["text"].endswith("\u2026") and bar["label"].startswith(bar["text"][:-1])
        shortened = {b["label"]: b["text"] != b["label"] for b in hostile}
        assert [shortened[label] for label in HOSTILE["labels"]] == [True, False, False, True]
        assert first["pwned"] is None and first["images"] == 0
        assert any(b["estimate"] < 0 for p in first["panels"] for b in p["bars"])  # drawn left of zero
        page.screenshot(tmp_path / "dashboard-first.png")

        # More reports: the page's next poll shows them, without a reload.
        for i, m in enumerate(ALL_METRICS):
            upload(aggregator, m["name"], 600, seed=100 + i)
        page.wait_for(
            "[...document.querySelectorAll('section.panel')].every((s) => s.dataset.n === '"
            "' + (s.dataset.metric === 'feature' ? 640 : 1000))",
            timeout=10,
        )
        second = page.evaluate(STATE)
        assert second["updates"] > first["updates"] and second["state"] == "ok"
        for key, panel in panels_by_key(second).items():
            assert not panel["withheld"] and len(panel["bars"]) == SPECS[key[0]].k
            if key[0] != "feature":
                before = [b["estimate"] for b in panels[key]["bars"]]
                assert [b["estimate"] for b in panel["bars"]] != before, key
        page.screenshot(tmp_path / "dashboard.png")

        # The projection: off by default, a toggle away, labelled as biased.
        assert not any(b["projected"] for p in second["panels"] for b in p["bars"])
        page.evaluate("document.getElementById('projection').click()")
        page.wait_for("document.querySelectorAll('.projected').length > 0")
        bars = page.evaluate("document.querySelectorAll('section.panel g.bar').length")
        assert page.evaluate("document.querySelectorAll('g.bar .projected').length") == bars
        note = page.evaluate(
            "(() => { const n = document.getElementById('projection-note'); "
            "return n.hidden ? null : n.textContent; })()"
        )
        assert "biased" in note
        assert "biased" in page.evaluate("document.querySelector('g.bar title').textContent")
        page.screenshot(tmp_path / "dashboard-projection.png")
        assert page.errors() == []  # no exceptions, failed requests or CSP violations so far

        # The store fails (503 with a reason), then recovers: the page says so, then carries on.
        aggregator.store.failing = True
        page.wait_for("document.body.dataset.state === 'error'", timeout=10)
        status = page.evaluate(STATE)["status"]
        assert status.startswith("The aggregator answered with an error: The counter store is unavailable"), status
        aggregator.store.failing = False
        page.wait_for("document.body.dataset.state === 'ok'", timeout=10)

        # The aggregator goes away: a visible error, the last numbers kept.
        aggregator.stop(grace=0)
        page.wait_for("document.body.dataset.state === 'error'", timeout=10)
        gone = page.evaluate(STATE)
        assert gone["status"].startswith("Cannot reach the aggregator") and "showing data from" in gone["status"]
        assert len(gone["panels"]) == len(PANELS) and all(p["bars"] for p in gone["panels"])
        page.screenshot(tmp_path / "dashboard-error.png")
    assert time.monotonic() - started < 60
    for name in ("dashboard.png", "dashboard-first.png", "dashboard-projection.png", "dashboard-error.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name


BARS_AS_SHOWN = """((metric) => [...document.querySelectorAll("section.panel")]
  .filter((s) => s.dataset.metric === metric).flatMap((s) => [...s.querySelectorAll("g.bar")]).map((g) => ({
  label: g.dataset.label, upper: Number(g.dataset.upper), value: g.querySelector("text.value").textContent,
  absent: g.classList.contains("absent"), whiskers: g.querySelectorAll("path.interval").length,
  title: g.querySelector("title").textContent})))"""


def test_intervals_are_shown_as_intervals_and_one_below_0_as_no_evidence_of_presence(
    aggregator, chromium_binary, tmp_path
):
    """Each bar's value is its interval, [lower, upper], never the estimate +- half the interval
    (which it need not surround); a category whose interval lies below 0 reads "no evidence of
    presence", without whiskers; open buckets are marked provisional."""
    spec = SPECS[HOSTILE["name"]]  # k-RR, k = 4: a report names one category; the last in none
    reports = [(0,)] * 150 + [(1,)] * 150 + [(2,)] * 100
    request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, b"\x05" * 16))
    collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(request, timeout=10)
    upload(aggregator, "browser", 400, seed=1)
    with Browser(chromium_binary, tmp_path) as browser:
        page = browser.open(f"http://127.0.0.1:{aggregator.http_port}/")
        page.wait_for(
            "[...document.querySelectorAll('section.panel')].some((s) => s.dataset.n === '400' "
            "&& s.querySelector('h2 .name').textContent === " + json.dumps(HOSTILE["name"]) + ")",
            timeout=15,
        )
        bars = {b["label"]: b for b in page.evaluate(f"{BARS_AS_SHOWN}({json.dumps(HOSTILE['name'])})")}
        other = bars.pop(HOSTILE["labels"][3])
        assert other["upper"] < 0 and other["absent"] and other["whiskers"] == 0
        assert other["value"] == "no evidence of presence" and "lies below 0" in other["title"]
        for bar in bars.values():
            assert re.fullmatch(r"\[\u2212?\d+\.\d+%, \d+\.\d+%\]", bar["value"]), bar
            assert not bar["absent"] and bar["whiskers"] == 1
        assert "\u00b1" not in page.evaluate("document.body.textContent")
        provisional = page.evaluate(
            "[...document.querySelectorAll('section.panel')].map((s) => [s.dataset.metric, s.dataset.window, "
            "s.dataset.provisional, s.querySelector('.badge.provisional')?.textContent ?? null])"
        )
        assert all(p == "true" and badge == "provisional" for _, _, p, badge in provisional), provisional
        page.wait_for("document.querySelector(\"section.trend[data-metric='browser']\") !== null", timeout=15)
        trend = page.evaluate(
            "(() => { const t = document.querySelector(\"section.trend[data-metric='browser']\"); "
            "return [t.dataset.buckets, t.dataset.provisional, t.querySelectorAll('rect.provisional-bucket').length]; "
            "})()"
        )
        # Every hour shown ended less than max_lateness (25 h) ago: all still provisional; the one
        # with reports is drawn so (the others, withheld, as withheld).
        assert trend[0] == trend[1] and trend[2] == 1, trend
        assert page.errors() == []


# ---- with tokens: the page asks for a read token --------------------------------------------

BROWSER_PANELS = 6  # METRICS: browser (total, 1h) and four metrics with a total window

TOKEN_STATE = """(() => ({
  state: document.body.dataset.state, status: document.getElementById("status").textContent,
  form: !document.getElementById("token-form").hidden, reason: document.getElementById("token-reason").textContent,
  input: document.getElementById("token-input").type, typed: document.getElementById("token-input").value,
  forget: !document.getElementById("forget-token").hidden,
  panels: document.querySelectorAll("section.panel").length, bars: document.querySelectorAll("g.bar").length,
  href: location.href, session: sessionStorage.getItem("veil.token"), local: JSON.stringify({...localStorage}),
  html: document.documentElement.outerHTML}))()"""


@pytest.fixture(scope="module")
def secured() -> Iterator[Aggregator]:
    """An aggregator with tokens (running.auth_section) and 400 reports of browser."""
    started = Aggregator(parse_config({**config_dict(), "auth": auth_section()}), pages=dashboard.pages())
    started.start()
    collector(f"127.0.0.1:{started.grpc_port}").Upload(
        make_upload("browser", 400), metadata=bearer(UPLOAD_TOKEN), timeout=10
    )
    yield started
    started.stop(grace=0)


@pytest.fixture(scope="module")
def browser(chromium_binary, tmp_path_factory) -> Iterator[Browser]:
    """One Chromium for the token tests; each test opens its own tab (its own sessionStorage)."""
    with Browser(chromium_binary, tmp_path_factory.mktemp("chromium")) as started:
        yield started


def submit(page, token: str) -> None:
    page.evaluate(
        f"(() => {{ document.getElementById('token-input').value = {json.dumps(token)}; "
        "document.getElementById('token-form').requestSubmit(); })()"
    )


def refused_with(page, reason: str) -> dict:
    page.wait_for(
        f"document.body.dataset.state === 'token' && "
        f"document.getElementById('token-reason').textContent === {json.dumps(reason)}"
    )
    state = page.evaluate(TOKEN_STATE)
    assert state["form"] and state["input"] == "password" and state["status"] == "Waiting for a read token"
    assert state["panels"] == 0 and state["session"] is None and not state["forget"]
    return state


def assert_token_kept_out_of_sight(page, state: dict, *tokens: str) -> None:
    """In sessionStorage only: not in the address, the page's markup, the input, localStorage,
    the console or any other event of the tab."""
    with page.browser._lock:
        events = json.dumps([e for e in page.browser.events if e.get("sessionId") == page.session])
    for token in tokens:
        for where in ("href", "html", "local", "typed"):
            assert token not in state[where], where
        assert token not in events
    # The only errors: the refused polls (and no exceptions or CSP violations).
    assert all(re.search(r"status of 40[13]\b", error) for error in page.errors()), page.errors()


def test_the_page_asks_for_a_read_token_and_shows_estimates_with_it(secured, browser):
    url = f"http://127.0.0.1:{secured.http_port}/"
    page = browser.open(url)
    refused_with(page, "This aggregator needs a read token.")

    submit(page, READ_TOKEN)
    page.wait_for(
        f"document.body.dataset.state === 'ok' && "
        f"document.querySelectorAll('section.panel').length === {BROWSER_PANELS}"
    )
    state = page.evaluate(TOKEN_STATE)
    assert not state["form"] and state["forget"] and state["session"] == READ_TOKEN and state["bars"] > 0
    assert_token_kept_out_of_sight(page, state, READ_TOKEN)

    # A reload keeps the token (the tab's sessionStorage) and asks nothing.
    page.call("Page.reload")
    page.wait_for("document.body.dataset.state === 'ok' && document.querySelectorAll('g.bar').length > 0")
    assert page.evaluate(TOKEN_STATE)["session"] == READ_TOKEN

    # Forgetting it removes it and the numbers read with it.
    page.evaluate("document.getElementById('forget-token').click()")
    assert_token_kept_out_of_sight(page, refused_with(page, "This aggregator needs a read token."), READ_TOKEN)


def test_a_token_in_the_fragment_is_taken_and_cut_from_the_address(secured, browser):
    url = f"http://127.0.0.1:{secured.http_port}/?refresh=1"
    page = browser.open(f"{url}#token={READ_TOKEN}&view=all")
    page.wait_for("document.body.dataset.state === 'ok' && document.querySelectorAll('g.bar').length > 0")
    state = page.evaluate(TOKEN_STATE)
    assert state["href"] == f"{url}#view=all"  # the rest of the fragment stays
    assert state["session"] == READ_TOKEN and state["forget"] and not state["form"]
    assert_token_kept_out_of_sight(page, state, READ_TOKEN)


def test_only_a_read_token_opens_the_page(secured, browser):
    page = browser.open(f"http://127.0.0.1:{secured.http_port}/")
    refused_with(page, "This aggregator needs a read token.")
    submit(page, UPLOAD_TOKEN)
    refused_with(page, "That token is not a read token.")
    submit(page, "not-a-token-of-this-aggregator")
    refused_with(page, "This aggregator does not know that token.")
    submit(page, "short token")  # not a token's shape: nothing is sent
    page.wait_for("document.getElementById('token-reason').textContent.startsWith('A token is 16 or more')")
    assert_token_kept_out_of_sight(page, page.evaluate(TOKEN_STATE), UPLOAD_TOKEN, "not-a-token-of-this-aggregator")


# ---- k = 1024, trends over past buckets, a phone -------------------------------------------------

BIG = {
    "name": "country",
    "labels": [f"country-{j:04d}" for j in range(1024)],
    "mechanism": "subset",
    "epsilon": 2.0,
    "windows": ["total", {"span": "1h", "retention": "3d"}],
}

TREND_STATE = """(() => ({
  trends: [...document.querySelectorAll("section.trend")].map((s) => ({
    metric: s.dataset.metric, window: s.dataset.window, buckets: Number(s.dataset.buckets),
    withheld: Number(s.dataset.withheld), gaps: s.querySelectorAll("rect.withheld-bucket").length,
    series: [...s.querySelectorAll("g.series")].map((g) => g.dataset.label),
    lines: [...s.querySelectorAll("g.series path.line")].filter((p) => p.getAttribute("d").length > 10).length,
    bands: [...s.querySelectorAll("g.series path.band")].filter((p) => p.getAttribute("d").includes("Z")).length,
    estimand: s.querySelector(".estimand")?.textContent ?? ""})),
  panels: [...document.querySelectorAll("section.panel")].map((s) => ({
    window: s.dataset.window, labels: [...s.querySelectorAll("g.bar")].map((g) => g.dataset.label),
    estimates: [...s.querySelectorAll("g.bar")].map((g) => Number(g.dataset.estimate)),
    rest: s.querySelector("g.bar.rest")?.dataset.count ?? null,
    restLower: Number(s.querySelector("g.bar.rest")?.dataset.lower),
    restUpper: Number(s.querySelector("g.bar.rest")?.dataset.upper)})),
  height: document.documentElement.scrollHeight, width: document.documentElement.scrollWidth,
}))()"""


def hourly_aggregator(metrics: list[dict], clock: dict) -> Aggregator:
    """A started aggregator of these metrics (min_n 100) with the dashboard, on a clock the test
    sets (clock["now"]), so that it can fill past hourly buckets."""
    config = config_dict()
    config["metrics"] = metrics
    config["server"]["min_n"] = 100
    aggregator = Aggregator(
        parse_config(config), store=MemoryStore(), pages=dashboard.pages(), clock=lambda: clock["now"]
    )
    aggregator.start()
    return aggregator


def test_k_1024_reads_as_top_n_other_search_and_trends_also_on_a_phone(chromium_binary, tmp_path):
    base = int(time.time()) // 3600 * 3600 - 40 * 3600  # 41 hourly buckets, the last the current one
    clock = {"now": base}
    aggregator = hourly_aggregator([BIG], clock)
    spec = specs_of([BIG])["country"]
    rng = random.Random(5)
    weights = [1.0 / (j + 1) ** 1.2 for j in range(1024)]
    try:
        for h in range(41):
            if h in (7, 8, 30):
                continue  # no reports: withheld
            clock["now"] = base + h * 3600 + 60
            n = 40 if h == 20 else 3000  # under min_n: withheld too
            source = SeededRandomSource(h)
            reports = [spec.mechanism.randomize(v, source) for v in rng.choices(range(1024), weights=weights, k=n)]
            request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, rng.randbytes(16)))
            collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(request, timeout=10)
        url = f"http://127.0.0.1:{aggregator.http_port}/"
        with Browser(chromium_binary, tmp_path) as browser:
            page = browser.open(url)
            page.wait_for(
                "document.querySelectorAll('section.trend g.series').length === 5 "
                "&& document.querySelectorAll('g.bar.rest').length === 2",
                timeout=20,
            )
            state = page.evaluate(TREND_STATE)
            (trend,) = state["trends"]
            # The default range, 48 buckets: 7 before the first report, 3 without any, 1 under min_n.
            assert (trend["metric"], trend["window"], trend["buckets"]) == ("country", "1h", 48)
            assert trend["withheld"] == trend["gaps"] == 11 and trend["lines"] == 5 and trend["bands"] == 5
            assert trend["series"][0] == "country-0000" and trend["estimand"].startswith(
                "Each bucket estimates the share of "
            )
            for panel in state["panels"]:
                assert len(panel["labels"]) == 11 and panel["labels"][-1] == "other" and panel["rest"] == "1014"
                assert panel["estimates"][:10] == sorted(panel["estimates"][:10], reverse=True)
                assert 0 <= panel["restLower"] < panel["estimates"][-1] < panel["restUpper"] <= 1
            assert state["height"] < 2500  # was 18,261 px with every category drawn
            page.screenshot(tmp_path / "dashboard-k1024.png")
            # Search by label: the matches, no "other".
            page.evaluate(
                "(() => { const s = document.getElementById('search'); s.value = '-000';"
                " s.dispatchEvent(new Event('input')); })()"
            )
            page.wait_for(
                "[...document.querySelectorAll('section.panel g.bar, section.trend g.series')].every("
                "(g) => g.dataset.label.includes('-000'))",
                timeout=10,
            )
            found = page.evaluate(TREND_STATE)
            assert all(len(p["labels"]) == 10 and p["rest"] is None for p in found["panels"])  # 0000..0009
            lines = found["trends"][0]["series"]
            assert len(lines) == 5 and lines[0] == "country-0000" and all("-000" in label for label in lines)
            page.screenshot(tmp_path / "dashboard-k1024-search.png")
            # A 420 px phone: nothing wider than the screen, still short.
            phone = browser.open(url, width=420, height=900)
            phone.wait_for("document.querySelectorAll('section.trend g.series').length === 5", timeout=20)
            small = phone.evaluate(TREND_STATE)
            assert small["width"] <= 420 and small["height"] < 4000
            phone.screenshot(tmp_path / "dashboard-k1024-phone.png", width=420)
    finally:
        aggregator.stop(grace=0)


LOAD_MS = {
    "name": "load_ms",
    "type": "numeric",
    "range": [0, 10000],
    "buckets": [100, 250, 500, 1000, 2500, 5000],
    "epsilon": 4.0,
    "windows": ["total", "1h"],
}

NUMERIC_STATE = """(() => ({
  means: [...document.querySelectorAll("section.panel g.mean")].map((g) => ({
    window: g.closest("section").dataset.window, estimate: Number(g.dataset.estimate),
    lower: Number(g.dataset.lower), upper: Number(g.dataset.upper), bands: g.querySelectorAll("rect.band").length,
    value: g.querySelector("text.value").textContent, title: g.querySelector("title").textContent})),
  quantiles: [...document.querySelectorAll("section.panel g.quantile")].map((g) => ({
    window: g.closest("section").dataset.window, q: Number(g.dataset.q), estimate: Number(g.dataset.estimate),
    lower: Number(g.dataset.lower), upper: Number(g.dataset.upper),
    label: g.querySelector("text.label").textContent, markers: g.querySelectorAll(".marker").length,
    inside: [...g.querySelectorAll(".band, .marker")].every((shape) => {
      const box = shape.getBBox(), view = shape.ownerSVGElement.viewBox.baseVal;
      return box.x >= view.x - 0.5 && box.x + box.width <= view.x + view.width + 0.5;
    })})),
  buckets: [...document.querySelectorAll("section.panel[data-metric='load_ms.distribution'] g.bar")]
    .map((g) => g.dataset.label),
  meanPanelBars: document.querySelectorAll("section.panel[data-metric='load_ms.mean'] g.bar").length,
  trends: [...document.querySelectorAll("section.trend")].map((s) => ({
    metric: s.dataset.metric, series: [...s.querySelectorAll("g.series")].map((g) => g.dataset.label),
    band: s.querySelector("g.series path.band")?.getAttribute("d") ?? "",
    ticks: [...s.querySelectorAll("text.tick")].map((t) => t.textContent)})),
}))()"""


def test_a_numeric_metric_shows_its_mean_with_its_band_and_its_buckets_with_quantile_markers(chromium_binary, tmp_path):
    base = int(time.time()) // 3600 * 3600 - 5 * 3600  # 6 hourly buckets, the last the current one
    clock = {"now": base}
    aggregator = hourly_aggregator([LOAD_MS], clock)
    specs = {m.name: m.spec for m in aggregator.config.metrics}
    rng = random.Random(27)
    try:
        for h in range(6):
            clock["now"] = base + h * 3600 + 60
            values = [min(rng.lognormvariate(math.log(400 + 40 * h), 0.9), 10000.0) for _ in range(2000)]
            for spec in specs.values():
                source = SeededRandomSource(h)
                reports = [spec.mechanism.randomize(spec.numeric.category(v, rng.random()), source) for v in values]
                request = veil_pb2.UploadRequest.FromString(encode_batch(spec, reports, rng.randbytes(16)))
                collector(f"127.0.0.1:{aggregator.grpc_port}").Upload(request, timeout=10)
        served = {(e["metric"], e["window"]): e for e in json.loads(get(aggregator, "/v1/estimates")[1])["estimates"]}
        with Browser(chromium_binary, tmp_path) as browser:
            page = browser.open(f"http://127.0.0.1:{aggregator.http_port}/")
            page.wait_for(
                "document.querySelectorAll('g.mean').length === 2 && document.querySelectorAll('g.quantile').length"
                " === 6 && document.querySelectorAll('section.trend g.series').length >= 2",
                timeout=20,
            )
            state = page.evaluate(NUMERIC_STATE)
            # The mean part: the mean and its interval, not the rounding points' shares.
            assert state["meanPanelBars"] == 0
            for drawn in state["means"]:
                mean = served[("load_ms.mean", drawn["window"])]["mean"]
                assert (drawn["estimate"], drawn["lower"], drawn["upper"]) == (
                    mean["estimate"],
                    mean["lower"],
                    mean["upper"],
                )
                assert drawn["bands"] == 1 and "[" in drawn["value"] and "95% interval" in drawn["title"]
            # The distribution part: its buckets in their order, and q50, q90, q99 marked on them.
            assert state["buckets"] == list(specs["load_ms.distribution"].labels) * 2
            for drawn in state["quantiles"]:
                (q,) = [
                    x for x in served[("load_ms.distribution", drawn["window"])]["quantiles"] if x["q"] == drawn["q"]
                ]
                assert (drawn["estimate"], drawn["lower"], drawn["upper"]) == (q["estimate"], q["lower"], q["upper"])
                assert drawn["markers"] == 1 and drawn["inside"], drawn
            assert [d["label"] for d in state["quantiles"][:3]] == ["q50", "q90", "q99"]
            # The trends: the mean's line and band in milliseconds; the buckets' shares in %.
            trends = {t["metric"]: t for t in state["trends"]}
            assert trends["load_ms.mean"]["series"] == ["mean"] and "Z" in trends["load_ms.mean"]["band"]
            assert not any("%" in tick for tick in trends["load_ms.mean"]["ticks"][:3])
            assert len(trends["load_ms.distribution"]["series"]) == 5
            assert page.errors() == []
            page.screenshot(tmp_path / "dashboard-numeric.png")
        assert (tmp_path / "dashboard-numeric.png").read_bytes().startswith(b"\x89PNG")
    finally:
        aggregator.stop(grace=0)
