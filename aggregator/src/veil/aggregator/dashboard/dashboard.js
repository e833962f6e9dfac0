// Veil dashboard: polls v1/estimates and draws one panel per metric and window, with bars of
// the unbiased estimates and their 95% intervals as error bars, each interval written as it is,
// [lower, upper] (a score interval clipped to [0, 1]: it need not surround the estimate, so no
// "estimate +- half-width"; one entirely below 0 reads "no evidence of presence", docs/math.md
// section 5). A bucket still open to late reports is marked provisional. The top categories by estimate
// (top-N selector), the rest folded into "other" with its own (group) interval, or the
// categories matching a search. Above them, per metric, a trend chart of one window's past
// buckets (v1/series, window and range selectors): lines and 95% bands of the top categories,
// withheld buckets drawn as such, and what the estimates are of.
//
// No libraries, no build step, nothing fetched but the aggregator's own JSON. Labels and
// reasons are configured strings: they reach the page only through textContent and
// setAttribute, never as HTML.
//
// With tokens configured, the aggregator answers 401 or 403 without a read token: the page then
// asks for one, keeps it in this tab's sessionStorage (never localStorage, never the URL) and
// sends it as `Authorization: Bearer`. A link may carry it as #token=...: it is taken on load
// and cut from the address bar. The token is never written into the page or to the console.
//
// Hooks for tests and scripts: body[data-state] ("loading" | "ok" | "error" | "token") and
// body[data-updates] (successful polls so far); each panel section[data-metric][data-window]
// [data-n][data-withheld][data-provisional][data-periods]; each bar g.bar[data-label][data-estimate]
// [data-lower][data-upper][data-projected] (g.bar.absent: no evidence of presence; the folded
// rest: g.bar.rest[data-label="other"][data-count]) and its text.value; each trend
// section.trend[data-metric][data-window][data-buckets][data-withheld][data-provisional] with
// g.series[data-label] (path.line, path.band), rect.withheld-bucket and rect.provisional-bucket. Query parameter ?refresh=SECONDS sets the
// polling period (default 2).
//
// A numeric metric's parts (entry.numeric, docs/protocol.md section 9): the mean part's panel
// shows the mean with its 95% interval in the metric's units (g.mean[data-estimate][data-lower]
// [data-upper]) instead of the rounding points' shares, and its trend the mean's line and band
// (g.series[data-label="mean"]); the distribution part's panel shows its buckets in their order
// and, under them, the quantiles on the range (g.quantile[data-q][data-estimate][data-lower]
// [data-upper]: a marker at the estimate, its interval between bucket boundaries).
//
// A strings metric (entry.strings, docs/protocol.md section 10) lists the values its last
// discovery found, as bars with their (selective) 95% intervals (g.bar[data-label] the value's
// text, [data-code] its code), the detection floor drawn on the axis (line.floor) and said in
// words under them (p.floor[data-floor][data-found][data-candidates]): a value whose share is
// below the floor cannot be seen. The search filters its values; it has no trend (a discovery is
// of one period).
"use strict";

(() => {
  const ENDPOINT = "v1/estimates"; // relative, so the page also works behind a path prefix
  const seconds = Number(new URLSearchParams(location.search).get("refresh"));
  const REFRESH_MS = Math.max(0.5, Number.isFinite(seconds) && seconds > 0 ? seconds : 2) * 1000;
  const TIMEOUT_MS = Math.max(5000, REFRESH_MS);
  const SVG_NS = "http://www.w3.org/2000/svg";

  const TOKEN_KEY = "veil.token";
  const TOKEN_SHAPE = /^[\x21-\x7e]{16,4096}$/; // the aggregator's rule: printable ASCII, no spaces

  const container = document.getElementById("panels");
  const status = document.getElementById("status");
  const toggle = document.getElementById("projection");
  const tokenForm = document.getElementById("token-form");
  const tokenInput = document.getElementById("token-input");
  const tokenReason = document.getElementById("token-reason");
  const forgetButton = document.getElementById("forget-token");
  const topSelect = document.getElementById("top");
  const search = document.getElementById("search");
  const trendWindow = document.getElementById("trend-window");
  const trendRange = document.getElementById("trend-range");
  const trends = document.getElementById("trends");
  const TREND_MS = 30000; // the past changes slowly: trends are fetched this often, or on a change
  const TREND_LINES = 5;
  let trendAt = 0; // Date.now() of the last trend fetch
  let trendKey = ""; // the selection the trends on show were fetched for

  let latest = null; // the last body served
  let lastOk = null; // Date.now() of the last successful poll
  let failure = null; // what went wrong with the last poll, or null
  let updates = 0;
  let token = null; // the read token sent with every poll, or null
  let refused = null; // why the aggregator refused the last poll (401/403), or null
  let run = 0; // bumped when the token changes: answers to polls of an older run are dropped
  let next = null; // the timer of the next poll
  const panels = new Map(); // "metric\0window" -> {element, signature}

  // ---- formatting -------------------------------------------------------------------------
  const integer = new Intl.NumberFormat(undefined, {maximumFractionDigits: 0});
  const clock = new Intl.DateTimeFormat(undefined, {hour: "2-digit", minute: "2-digit", second: "2-digit"});

  function number(x, digits) {
    const text = x.toFixed(digits);
    return (Number(text) === 0 ? text.replace("-", "") : text).replace("-", "\u2212");
  }

  // A proportion as a percentage: two decimals below 10%, one from 10% on.
  function percent(x, digits) {
    if (x === null || x === undefined) return "n/a";
    const p = 100 * x;
    return number(p, digits ?? (Math.abs(p) >= 10 ? 1 : 2)) + "%";
  }

  // A number in a numeric metric's units: 4 significant digits, grouped.
  const units = new Intl.NumberFormat(undefined, {maximumSignificantDigits: 4});
  function unit(x) {
    return x === null || x === undefined ? "n/a" : units.format(x + 0).replace("-", "\u2212"); // + 0: never "-0"
  }

  // A label cut to fit its column (wide characters count double); the tooltip has it whole.
  function shorten(label, room = 18) {
    const chars = [...label];
    const width = (ch) => (ch.codePointAt(0) >= 0x1100 ? 2 : 1);
    if (chars.reduce((sum, ch) => sum + width(ch), 0) <= room) return label;
    let used = 1, cut = 0; // 1: the ellipsis
    while (used + width(chars[cut]) <= room) used += width(chars[cut++]);
    return chars.slice(0, cut).join("") + "\u2026";
  }

  function windowText(entry) {
    if (!entry.end) return entry.window; // "total": since the start
    const long = entry.end - entry.start >= 86400;
    const format = new Intl.DateTimeFormat(undefined, long
      ? {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"}
      : {hour: "2-digit", minute: "2-digit"});
    return `${entry.window} \u00b7 ${format.format(entry.start * 1000)}\u2013${format.format(entry.end * 1000)}`;
  }

  // ---- DOM helpers: text only ever goes in as text ----------------------------------------
  function el(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    node.append(...children); // strings become text nodes
    return node;
  }

  function svg(tag, attributes = {}, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    node.append(...children);
    return node;
  }

  // ---- one panel --------------------------------------------------------------------------
  function header(entry) {
    const chip = el("span", {class: "window"}, windowText(entry));
    if (entry.end) {
      chip.title = `${new Date(entry.start * 1000).toISOString()} to ${new Date(entry.end * 1000).toISOString()}`;
    }
    const title = el("h2", {}, el("span", {class: "name"}, entry.metric), chip);
    if (entry.withheld) title.append(el("span", {class: "badge"}, "withheld"));
    if (entry.provisional) {
      title.append(el("span", {class: "badge provisional", title: entry.end
        ? "Reports made in this bucket may still arrive (up to the aggregator's max_lateness after it ends)."
        : "The all-time window never closes: reports keep arriving."}, "provisional"));
    }
    const mechanism = el("b", {title: `spec ${entry.spec_fingerprint}`}, entry.mechanism);
    const meta = el("p", {class: "meta"},
      "n = ", el("b", {}, integer.format(entry.n)),
      " \u00b7 \u03b5 = ", el("b", {}, String(Number(entry.epsilon.toPrecision(4)))),
      " \u00b7 ", mechanism);
    // What the numbers are shares of (a configured metric's rule, in the aggregator's words).
    const estimand = el("p", {class: "estimand"}, entry.estimand ? `Estimates the ${entry.estimand}.` : "");
    return [title, meta, estimand];
  }

  function renderPanel(entry, showProjection) {
    const section = el("section", {
      class: entry.withheld ? "panel withheld" : "panel",
      "data-metric": entry.metric, "data-window": entry.window,
      "data-n": String(entry.n), "data-withheld": String(entry.withheld),
      "data-provisional": String(Boolean(entry.provisional)), "data-periods": String(entry.periods ?? ""),
    }, ...header(entry));
    if (entry.withheld) section.append(el("p", {class: "reason"}, entry.reason));
    else if (entry.strings) section.append(...stringsChart(entry));
    else if (entry.numeric?.part === "mean" && entry.mean) section.append(meanChart(entry));
    else if (entry.numeric?.part === "distribution") {
      section.append(chart(entry, entry.categories, showProjection)); // the buckets in their order
      if (entry.quantiles) section.append(quantileChart(entry));
    } else section.append(chart(entry, shownRows(entry), showProjection));
    return section;
  }

  // ---- a strings metric --------------------------------------------------------------------
  // The found values, largest first (those matching the search), and what could not be found.
  function stringsChart(entry) {
    const s = entry.strings;
    const wanted = search.value.trim().toLowerCase();
    const rows = s.values.filter((v) => !wanted || v.text.toLowerCase().includes(wanted))
      .map((v) => ({...v, label: v.text, projected: null}));
    const shown = rows.length ? chart(entry, rows, false, s.floor)
      : el("p", {class: "reason"}, s.values.length ? "No value found matches the search." : "No value found.");
    const floor = el("p", {class: "floor", "data-floor": s.floor ?? "", "data-found": String(s.values.length),
      "data-candidates": String(s.candidates)},
    `Values below ${percent(s.floor)} of devices cannot be seen (the detection floor). `,
    `Found ${integer.format(s.values.length)} of ${integer.format(s.candidates)} candidates, `,
    `from ${integer.format(s.n)} reports.`);
    floor.title = "A value is shown when its estimate clears the floor; its interval allows for that choice.";
    return [shown, floor];
  }

  // ---- a numeric metric's parts ------------------------------------------------------------
  const QW = 580, QL = 56, QR = 200, QROW = 22;

  // The mean with its 95% interval, on an axis around the interval (the range is often far wider).
  function meanChart(entry) {
    const m = entry.mean, n = entry.numeric;
    const spread = Math.max((m.upper ?? m.estimate) - (m.lower ?? m.estimate), (n.high - n.low) * 1e-3);
    let lo = Math.max(n.low, (m.lower ?? m.estimate) - spread), hi = Math.min(n.high, (m.upper ?? m.estimate) + spread);
    const step = niceStep(hi - lo);
    lo = Math.floor(lo / step) * step; hi = Math.ceil(hi / step) * step;
    const x = (v) => QL + ((v - lo) / (hi - lo)) * (QW - QL - QR);
    const mid = 14, height = 44;
    const root = svg("svg", {class: "chart", viewBox: `0 0 ${QW} ${height}`, width: QW, height, role: "img",
      "aria-label": `${n.metric}: mean with its 95% interval`});
    for (let i = Math.ceil(lo / step - 1e-9); i <= Math.floor(hi / step + 1e-9); i++) {
      const at = x(i * step);
      root.append(svg("line", {class: "grid", x1: at, x2: at, y1: 2, y2: mid + 10}));
      root.append(svg("text", {class: "tick", x: at, y: mid + 24}, unit(i * step)));
    }
    const interval = Number.isFinite(m.lower) && Number.isFinite(m.upper)
      ? `95% interval ${unit(m.lower)} to ${unit(m.upper)}` : "no interval (too few reports)";
    const g = svg("g", {class: "mean", "data-estimate": m.estimate ?? "", "data-lower": m.lower ?? "",
      "data-upper": m.upper ?? ""},
    svg("title", {}, `mean of ${n.metric}: ${unit(m.estimate)} (${interval}; standard error ${unit(m.stderr)})`));
    g.append(svg("text", {class: "label", x: QL - 6, y: mid + 4}, "mean"));
    if (Number.isFinite(m.lower) && Number.isFinite(m.upper)) {
      const a = x(m.lower), b = x(m.upper);
      g.append(svg("rect", {class: "band", x: a, y: mid - 6, width: Math.max(1, b - a), height: 12}));
      g.append(svg("path", {class: "interval", d: `M${a} ${mid}H${b}M${a} ${mid - 6}V${mid + 6}M${b} ${mid - 6}V${mid + 6}`}));
    }
    g.append(svg("circle", {class: "marker", cx: x(m.estimate), cy: mid, r: 4}));
    g.append(svg("text", {class: "value", x: QW - QR + 8, y: mid + 4},
      `${unit(m.estimate)} [${unit(m.lower)}, ${unit(m.upper)}]`));
    root.append(g);
    return root;
  }

  // The quantiles on the range, each bucket an equal slot (buckets are often spaced by factors):
  // a marker at the estimate and its interval, whose ends are bucket boundaries.
  function quantileChart(entry) {
    const n = entry.numeric, edges = [n.low, ...n.boundaries, n.high];
    const slot = (QW - QL - QR) / (edges.length - 1);
    const x = (v) => { // position within its bucket, linear there
      let i = 0;
      while (i < edges.length - 2 && v >= edges[i + 1]) i++;
      const share = Math.min(1, Math.max(0, (v - edges[i]) / (edges[i + 1] - edges[i])));
      return QL + slot * (i + share);
    };
    const height = 8 + entry.quantiles.length * QROW + 18;
    const root = svg("svg", {class: "chart quantiles", viewBox: `0 0 ${QW} ${height}`, width: QW, height, role: "img",
      "aria-label": `${n.metric}: quantiles with their 95% intervals`});
    const bottom = 8 + entry.quantiles.length * QROW;
    edges.forEach((edge, i) => {
      const at = QL + slot * i;
      root.append(svg("line", {class: "grid", x1: at, x2: at, y1: 4, y2: bottom}));
      root.append(svg("text", {class: "tick", x: at, y: bottom + 14}, unit(edge)));
    });
    entry.quantiles.forEach((q, j) => {
      const mid = 8 + j * QROW + QROW / 2, name = `q${Number((100 * q.q).toPrecision(3))}`;
      const g = svg("g", {class: "quantile", "data-q": q.q, "data-estimate": q.estimate ?? "",
        "data-lower": q.lower ?? "", "data-upper": q.upper ?? ""},
      svg("title", {}, `${name} of ${n.metric}: ${unit(q.estimate)} (95% interval ${unit(q.lower)} to ${unit(q.upper)}, ` +
        "bucket boundaries: a quantile is known no finer than its buckets)"));
      g.append(svg("text", {class: "label", x: QL - 6, y: mid + 4}, name));
      const a = x(q.lower), b = q.upper >= n.high ? QL + slot * (edges.length - 1) : x(q.upper);
      g.append(svg("rect", {class: "band", x: a, y: mid - 6, width: Math.max(1, b - a), height: 12}));
      g.append(svg("path", {class: "interval", d: `M${a} ${mid - 6}V${mid + 6}M${b} ${mid - 6}V${mid + 6}`}));
      g.append(svg("path", {class: "marker", d: `M${x(q.estimate)} ${mid - 7}l5 7l-5 7l-5 -7Z`}));
      g.append(svg("text", {class: "value", x: QW - QR + 8, y: mid + 4},
        `${unit(q.estimate)} [${unit(q.lower)}, ${unit(q.upper)}]`));
      root.append(g);
    });
    return root;
  }

  // The categories a panel shows: those matching the search (largest first, at most 100), or
  // the top N by estimate and the rest as one "other" row with the group interval the
  // aggregator computed (?top=N).
  function shownRows(entry) {
    const sorted = [...entry.categories].sort((a, b) => (b.estimate ?? -Infinity) - (a.estimate ?? -Infinity));
    const wanted = search.value.trim().toLowerCase();
    if (wanted) {
      const found = sorted.filter((c) => c.label.toLowerCase().includes(wanted));
      return found.length > 100 ? [...found.slice(0, 100), {more: found.length - 100}] : found;
    }
    const top = Number(topSelect.value);
    if (!top || sorted.length <= top) return sorted;
    const rows = sorted.slice(0, top);
    if (entry.group) {
      rows.push({label: "other", rest: entry.group.labels.length, estimate: entry.group.estimate,
        lower: entry.group.lower, upper: entry.group.upper, projected: null});
    }
    return rows;
  }

  // Horizontal bars: label | bar with error bar | value. SVG units; the chart scales to its panel.
  const W = 580, LABEL_W = 124, VALUE_W = 160, ROW = 22, BAR = 12, TOP = 4, AXIS = 20;
  const X0 = LABEL_W + 8, X1 = W - VALUE_W;

  function niceStep(span) {
    const raw = span / 4;
    const magnitude = 10 ** Math.floor(Math.log10(raw));
    return [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((step) => step >= raw);
  }

  // An interval lying entirely below 0: no share is within reach of the noise of the estimate,
  // which fell further below 0 than it reaches: no evidence of the category at all.
  function absent(c) { return Number.isFinite(c.upper) && c.upper < 0; }

  function intervalText(c) {
    if (absent(c)) return "no evidence of presence";
    return `[${percent(c.lower)}, ${percent(c.upper)}]`;
  }

  // floor: a strings metric's detection floor, drawn on the axis (null: none).
  function chart(entry, rows, showProjection, floor = null) {
    const values = rows.flatMap((c) => (absent(c) ? [c.estimate, c.projected] : [c.estimate, c.lower, c.upper, c.projected]))
      .concat([floor]).filter(Number.isFinite);
    // Unbiased estimates can be negative: the axis starts at min(0, lowest value) and 0 is marked.
    let lo = Math.min(0, ...values), hi = Math.max(0, ...values);
    if (hi - lo < 0.01) hi = lo + 0.01;
    const step = niceStep(hi - lo);
    hi = Math.ceil(hi / step - 1e-9) * step; // a round right end
    if (lo < 0) lo -= 0.015 * (hi - lo); // room for the lowest whisker's cap
    const x = (v) => X0 + ((v - lo) / (hi - lo)) * (X1 - X0);
    const height = TOP + rows.length * ROW + AXIS;
    const tickDigits = step >= 0.01 ? 0 : step >= 0.001 ? 1 : 2;

    const root = svg("svg", {class: "chart", viewBox: `0 0 ${W} ${height}`, width: W, height, role: "img",
      "aria-label": `${entry.metric}, window ${entry.window}: estimates with 95% intervals`});
    const plotBottom = TOP + rows.length * ROW;
    for (let i = Math.ceil(lo / step - 1e-9); i <= Math.floor(hi / step + 1e-9); i++) {
      const v = i * step, at = x(v);
      root.append(svg("line", {class: i === 0 ? "zero" : "grid", x1: at, x2: at, y1: TOP - 2, y2: plotBottom}));
      root.append(svg("text", {class: "tick", x: at, y: plotBottom + 14}, percent(v, tickDigits)));
    }

    rows.forEach((c, j) => {
      const mid = TOP + j * ROW + ROW / 2;
      if (c.more) {
        root.append(svg("text", {class: "more", x: LABEL_W, y: mid + 4}, `\u2026 and ${c.more} more matches`));
        return;
      }
      const estimate = c.estimate ?? 0;
      const g = svg("g", {class: (estimate < 0 ? "bar negative" : "bar") + (c.rest ? " rest" : "") + (absent(c) ? " absent" : ""),
        "data-label": c.label, ...(c.code ? {"data-code": c.code} : {}),
        "data-estimate": c.estimate ?? "", "data-lower": c.lower ?? "", "data-upper": c.upper ?? "",
        "data-projected": c.projected ?? ""});
      const interval = absent(c)
        ? `no evidence of presence: its 95% interval, ${percent(c.lower)} to ${percent(c.upper)}, lies below 0`
        : Number.isFinite(c.lower) && Number.isFinite(c.upper)
          ? `95% interval ${percent(c.lower)} to ${percent(c.upper)}` : "no interval (too few reports)";
      let tip = `${c.label}: unbiased estimate ${percent(c.estimate)} (${interval})`;
      if (c.rest) {
        g.setAttribute("data-count", String(c.rest));
        tip = `other (the ${c.rest} categories not shown, together): ${percent(c.estimate)} (${interval})`;
      }
      if (showProjection) tip += `; projection (biased) ${percent(c.projected)}`;
      g.append(svg("title", {}, tip));
      g.append(svg("rect", {class: "hit", x: 0, y: mid - ROW / 2, width: W, height: ROW}));
      g.append(svg("text", {class: "label", x: LABEL_W, y: mid + 4}, c.rest ? `other (${c.rest})` : shorten(c.label)));
      g.append(svg("rect", {class: "estimate", x: Math.min(x(0), x(estimate)), y: mid - BAR / 2,
        width: Math.max(1, Math.abs(x(estimate) - x(0))), height: BAR}));
      let value = "n/a";
      if (Number.isFinite(c.lower) && Number.isFinite(c.upper)) {
        value = intervalText(c);
        if (!absent(c)) {
          const a = x(c.lower), b = x(c.upper), cap = 4;
          g.append(svg("path", {class: "interval",
            d: `M${a} ${mid}H${b}M${a} ${mid - cap}V${mid + cap}M${b} ${mid - cap}V${mid + cap}`}));
        }
      }
      if (showProjection && Number.isFinite(c.projected)) {
        const p = x(c.projected);
        const diamond = `M${p} ${mid - 6}L${p + 5} ${mid}L${p} ${mid + 6}L${p - 5} ${mid}Z`;
        g.append(svg("path", {class: "projected", d: diamond}));
      }
      g.append(svg("text", {class: "value", x: X1 + 8, y: mid + 4}, value));
      root.append(g);
    });
    if (Number.isFinite(floor)) {
      root.append(svg("line", {class: "floor", x1: x(floor), x2: x(floor), y1: TOP - 2, y2: plotBottom},
        svg("title", {}, `detection floor ${percent(floor)}: a smaller share cannot be seen`)));
    }
    return root;
  }

  // ---- trends over past buckets ----------------------------------------------------------
  const TW = 520, TH = 210, TL = 44, TR = 8, TT = 8, TB = 22;

  function bucketSpan(entry) { return entry.end - entry.start; }

  // A trend is of a window with buckets, and of categories or a numeric part: a strings metric's
  // values are found anew each period.
  function trended(entry) { return entry.end && entry.mechanism !== "hashed"; }

  // The windows with buckets (from the current estimates) in the trend selector; the first by default.
  function trendChoices(body) {
    const names = [...new Set(body.estimates.filter(trended).map((e) => e.window))];
    const have = [...trendWindow.options].map((o) => o.value);
    if (names.join("\u0000") !== have.join("\u0000")) {
      const kept = trendWindow.value;
      trendWindow.replaceChildren(...names.map((n) => el("option", {value: n}, n)));
      if (names.includes(kept)) trendWindow.value = kept;
    }
    return names.length > 0;
  }

  async function refreshTrends(body, mine, force = false) {
    if (!trendChoices(body)) { trends.replaceChildren(); return; }
    const key = `${trendWindow.value}\u0000${trendRange.value}\u0000${search.value}`;
    if (!force && key === trendKey && Date.now() - trendAt < TREND_MS) return;
    trendAt = Date.now();
    trendKey = key;
    const entries = body.estimates.filter((e) => e.window === trendWindow.value && trended(e));
    const headers = {Accept: "application/json"};
    if (token !== null) headers.Authorization = `Bearer ${token}`;
    const charts = await Promise.all(entries.map(async (entry) => {
      const from = entry.start - (Number(trendRange.value) - 1) * bucketSpan(entry);
      const url = `v1/series/${encodeURIComponent(entry.metric)}?window=${encodeURIComponent(entry.window)}&from=${from}`;
      try {
        const response = await fetch(url, {cache: "no-store", headers});
        const answer = await response.json();
        if (!response.ok) throw new Error(answer?.error ?? `HTTP ${response.status}`);
        return trendChart(entry, answer.estimates);
      } catch (err) {
        return el("section", {class: "trend", "data-metric": entry.metric}, el("h2", {}, entry.metric),
          el("p", {class: "reason"}, `The trend could not be read: ${err.message}`));
      }
    }));
    if (mine === run) trends.replaceChildren(...charts);
  }

  // The categories drawn: those matching the search, else the largest in the latest bucket shown.
  function trendLabels(buckets) {
    const latest = [...buckets].reverse().find((b) => !b.withheld);
    if (!latest) return [];
    const wanted = search.value.trim().toLowerCase();
    const sorted = [...latest.categories].sort((a, b) => (b.estimate ?? -Infinity) - (a.estimate ?? -Infinity));
    return sorted.filter((c) => !wanted || c.label.toLowerCase().includes(wanted)).slice(0, TREND_LINES)
      .map((c) => c.label);
  }

  function trendChart(entry, buckets) {
    // A mean part: the mean's line and band, in the metric's units (its points' shares mean little).
    const mean = entry.numeric?.part === "mean";
    const labels = mean ? ["mean"] : trendLabels(buckets);
    const format = mean ? unit : percent;
    const withheld = buckets.filter((b) => b.withheld).length;
    const provisional = buckets.filter((b) => b.provisional).length;
    const section = el("section", {class: "trend", "data-metric": entry.metric, "data-window": entry.window,
      "data-buckets": String(buckets.length), "data-withheld": String(withheld),
      "data-provisional": String(provisional)},
      el("h2", {}, el("span", {class: "name"}, entry.metric),
        el("span", {class: "window"}, `${entry.window} buckets, last ${buckets.length}`)));
    if (!buckets.length) { section.append(el("p", {class: "reason"}, "No retained bucket.")); return section; }
    const rows = buckets.map((b) => (b.withheld ? null
      : mean ? (b.mean ? new Map([["mean", b.mean]]) : null) : new Map(b.categories.map((c) => [c.label, c]))));
    const values = rows.flatMap((r) => (r ? labels.flatMap((l) => [r.get(l)?.lower, r.get(l)?.upper]) : []))
      .filter(Number.isFinite);
    let lo = mean ? Math.min(...values) : Math.min(0, ...values);
    let hi = mean ? Math.max(...values) : Math.max(0.01, ...values);
    if (mean && !(hi > lo)) { // no bucket shown yet, or one value: some room around it
      const at = Number.isFinite(lo) ? lo : (entry.numeric.low + entry.numeric.high) / 2;
      lo = at - 1; hi = at + 1;
    }
    const step = niceStep(hi - lo);
    hi = Math.ceil(hi / step - 1e-9) * step;
    lo = Math.floor(lo / step + 1e-9) * step;
    const n = buckets.length, slot = (TW - TL - TR) / n;
    const x = (i) => TL + slot * (i + 0.5);
    const y = (v) => TT + (1 - (v - lo) / (hi - lo)) * (TH - TT - TB);
    const root = svg("svg", {class: "chart", viewBox: `0 0 ${TW} ${TH}`, width: TW, height: TH, role: "img",
      "aria-label": `${entry.metric}: estimates over the last ${n} ${entry.window} buckets, with 95% bands`});
    const tickDigits = step >= 0.01 ? 0 : step >= 0.001 ? 1 : 2;
    for (let i = Math.round(lo / step); i <= Math.round(hi / step); i++) {
      const v = i * step;
      root.append(svg("line", {class: i === 0 ? "zero" : "grid", x1: TL, x2: TW - TR, y1: y(v), y2: y(v)}));
      root.append(svg("text", {class: "tick", x: TL - 20, y: y(v) + 4}, mean ? unit(v) : percent(v, tickDigits)));
    }
    buckets.forEach((b, i) => {
      if (!b.withheld && !b.provisional) return;
      const r = svg("rect", {class: b.withheld ? "withheld-bucket" : "provisional-bucket", x: TL + slot * i, y: TT,
        width: Math.max(1, slot), height: TH - TT - TB});
      const when = new Date(b.start * 1000).toISOString();
      r.append(svg("title", {}, b.withheld ? `${when}: withheld (${b.reason})`
        : `${when}: provisional (reports made in it may still arrive)`));
      root.append(r);
    });
    const when = new Intl.DateTimeFormat(undefined, bucketSpan(entry) >= 86400
      ? {month: "short", day: "numeric"} : {month: "short", day: "numeric", hour: "2-digit"});
    for (const i of new Set([0, Math.floor((n - 1) / 2), n - 1])) {
      root.append(svg("text", {class: "tick", x: Math.min(Math.max(x(i), TL + 36), TW - TR - 36), y: TH - 6},
        when.format(buckets[i].start * 1000)));
    }
    labels.forEach((label, s) => {
      const g = svg("g", {class: `series s${s}`, "data-label": label});
      let line = "", band = "", upper = [], lower = [];
      const flush = () => { // a band per run of shown buckets: withheld ones break it
        if (upper.length) band += `M${upper.join("L")}L${lower.reverse().join("L")}Z`;
        upper = []; lower = [];
      };
      rows.forEach((r, i) => {
        const c = r?.get(label);
        if (!c || !Number.isFinite(c.estimate)) { flush(); return; }
        line += `${upper.length ? "L" : "M"}${x(i)} ${y(c.estimate)}`;
        upper.push(`${x(i)} ${y(c.upper)}`);
        lower.push(`${x(i)} ${y(c.lower)}`);
        if (n <= 60) g.append(svg("circle", {class: "dot", cx: x(i), cy: y(c.estimate), r: 2}));
      });
      flush();
      g.prepend(svg("path", {class: "band", d: band || "M0 0"}), svg("path", {class: "line", d: line || "M0 0"}));
      const last = [...rows].reverse().find((r) => r?.get(label))?.get(label);
      g.append(svg("title", {}, last ? `${label}: latest ${format(last.estimate)} [${format(last.lower)}, ${format(last.upper)}]`
        : label));
      root.append(g);
    });
    section.append(root);
    const keys = el("ul", {class: "keys"}, ...labels.map((l, s) => el("li", {class: `s${s}`}, shorten(l, 28))));
    if (withheld) keys.append(el("li", {class: "gap"}, `withheld (${withheld})`));
    if (provisional) keys.append(el("li", {class: "open"}, `provisional (${provisional})`));
    section.append(keys);
    const what = [...buckets].reverse().find((b) => b.estimand)?.estimand;
    if (what) section.append(el("p", {class: "estimand"}, `Each bucket estimates the ${what}. Bands: 95% intervals.`));
    return section;
  }


  // ---- the page ---------------------------------------------------------------------------
  function update(body) {
    const showProjection = toggle.checked;
    const seen = new Set();
    let previous = null;
    for (const entry of body.estimates) {
      const key = `${entry.metric}\u0000${entry.window}`;
      const signature = JSON.stringify(entry) + showProjection + topSelect.value + "\u0000" + search.value;
      seen.add(key);
      let slot = panels.get(key);
      if (!slot || slot.signature !== signature) { // redraw only what changed (keeps hovers alive)
        const element = renderPanel(entry, showProjection);
        if (slot) slot.element.replaceWith(element);
        slot = {element, signature};
        panels.set(key, slot);
      }
      const expected = previous ? previous.nextSibling : container.firstChild;
      if (slot.element !== expected) container.insertBefore(slot.element, expected); // server order
      previous = slot.element;
    }
    for (const [key, slot] of panels) {
      if (!seen.has(key)) { slot.element.remove(); panels.delete(key); }
    }
    const empty = container.querySelector(".empty");
    if (body.estimates.length === 0 && !empty) {
      container.append(el("p", {class: "empty"}, "The aggregator declares no metrics."));
    } else if (body.estimates.length && empty) {
      empty.remove();
    }
    document.getElementById("projection-note").textContent = body.projection || "";
  }

  function showStatus() {
    const every = `every ${REFRESH_MS / 1000} s`;
    if (refused !== null) {
      document.body.dataset.state = "token";
      status.textContent = "Waiting for a read token";
      return;
    }
    if (failure === null && lastOk === null) return;
    document.body.dataset.state = failure === null ? "ok" : "error";
    document.body.dataset.updates = String(updates);
    if (failure === null) {
      status.textContent = `Updated ${clock.format(lastOk)} \u00b7 refreshing ${every}`;
    } else {
      const since = lastOk === null ? "no data yet"
        : `showing data from ${clock.format(lastOk)} (${Math.round((Date.now() - lastOk) / 1000)} s ago)`;
      status.textContent = `${failure} \u00b7 ${since} \u00b7 retrying ${every}`;
    }
  }

  // One GET of the estimates: {ok, status, body}; throws on a network error or timeout.
  async function request(sent) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
    const headers = {Accept: "application/json"};
    if (sent !== null) headers.Authorization = `Bearer ${sent}`;
    try {
      const top = Number(topSelect.value);
      const url = top ? `${ENDPOINT}?top=${top}` : ENDPOINT;
      const response = await fetch(url, {cache: "no-store", signal: controller.signal, headers});
      return {ok: response.ok, status: response.status, body: await response.json().catch(() => null)};
    } finally {
      clearTimeout(timer);
    }
  }

  async function poll(mine) {
    const sent = token;
    let answer = null;
    try {
      answer = await request(sent);
    } catch (err) {
      failure = err.name === "AbortError" ? `Cannot reach the aggregator (no answer within ${TIMEOUT_MS / 1000} s)`
        : "Cannot reach the aggregator (network error)";
    }
    if (mine !== run) return; // the token changed meanwhile, and a newer run polls with it
    if (answer?.status === 401 || answer?.status === 403) {
      askForToken(answer.status === 403 ? "That token is not a read token."
        : sent === null ? "This aggregator needs a read token." : "This aggregator does not know that token.");
      return; // no more polls until a token is entered
    }
    if (answer !== null) {
      try {
        if (!answer.ok) throw new Error(answer.body?.error ?? `HTTP ${answer.status}`);
        if (!Array.isArray(answer.body?.estimates)) throw new Error("the answer is not a list of estimates");
        latest = answer.body;
        lastOk = Date.now();
        failure = null;
        updates += 1;
        update(answer.body);
        refreshTrends(answer.body, mine);
      } catch (err) {
        failure = `The aggregator answered with an error: ${err.message}`;
      }
    }
    showStatus();
    next = setTimeout(() => poll(mine), REFRESH_MS);
  }

  function restart() {
    run += 1;
    clearTimeout(next);
    poll(run);
  }

  // ---- the read token ---------------------------------------------------------------------
  function keepToken(value) {
    token = value;
    try {
      if (value === null) sessionStorage.removeItem(TOKEN_KEY);
      else sessionStorage.setItem(TOKEN_KEY, value);
    } catch { /* storage off: the token lasts as long as the page */ }
    forgetButton.hidden = value === null;
  }

  // Numbers read with a token are not left on show once it is refused or forgotten.
  function clearPanels() {
    for (const slot of panels.values()) slot.element.remove();
    panels.clear();
    container.querySelector(".empty")?.remove();
    latest = lastOk = failure = null;
  }

  function askForToken(reason) {
    keepToken(null); // a refused token is of no further use
    clearPanels();
    refused = reason;
    tokenReason.textContent = reason;
    tokenForm.hidden = false;
    showStatus();
    tokenInput.focus();
  }

  // #token=... (the rest of the fragment is kept): read once, then cut from the address bar so
  // it is neither bookmarked nor shared nor left in the history.
  function tokenFromFragment() {
    const parts = location.hash.slice(1).split("&");
    const found = parts.find((part) => part.startsWith("token="));
    if (found === undefined) return null;
    const rest = parts.filter((part) => part !== found).join("&");
    history.replaceState(history.state, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    try {
      return decodeURIComponent(found.slice("token=".length));
    } catch {
      return null; // malformed escapes: no token, so the form asks for one
    }
  }

  tokenForm.addEventListener("submit", (event) => {
    event.preventDefault(); // nothing is submitted anywhere: the token goes to sessionStorage
    const value = tokenInput.value.trim();
    tokenInput.value = "";
    if (!TOKEN_SHAPE.test(value)) {
      tokenReason.textContent = "A token is 16 or more printable characters without spaces.";
      return;
    }
    keepToken(value);
    refused = null;
    tokenForm.hidden = true;
    document.body.dataset.state = "loading";
    status.textContent = "Connecting to the aggregator\u2026";
    restart();
  });

  forgetButton.addEventListener("click", () => {
    keepToken(null);
    clearPanels();
    restart();
  });

  function setProjection(on) {
    document.getElementById("projection-legend").hidden = !on;
    document.getElementById("projection-note").hidden = !on;
    if (latest) update(latest);
  }

  try { toggle.checked = localStorage.getItem("veil.projection") === "1"; } catch { /* storage off */ }
  toggle.addEventListener("change", () => {
    try { localStorage.setItem("veil.projection", toggle.checked ? "1" : "0"); } catch { /* storage off */ }
    setProjection(toggle.checked);
  });
  setProjection(toggle.checked);
  document.getElementById("view").addEventListener("submit", (event) => event.preventDefault());
  topSelect.addEventListener("change", () => restart());
  search.addEventListener("input", () => { if (latest) { update(latest); refreshTrends(latest, run, true); } });
  for (const select of [trendWindow, trendRange]) {
    select.addEventListener("change", () => { if (latest) refreshTrends(latest, run, true); });
  }
  setInterval(showStatus, 1000); // keeps "s ago" current while the aggregator is away
  let saved = tokenFromFragment();
  if (saved === null) {
    try { saved = sessionStorage.getItem(TOKEN_KEY); } catch { /* storage off */ }
  }
  if (saved !== null && TOKEN_SHAPE.test(saved)) keepToken(saved);
  restart();
})();
