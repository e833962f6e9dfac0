"""`veil estimates`: the estimates of a running aggregator, as a table, JSON or CSV.

The current ones by default; with --last (or --from/--to) the window's past buckets still
retained (--merged: one estimate of them all, their counts added). --group adds the share of
a group of categories. The JSON has the shape of the HTTP listener's GET /v1/estimates (and
/v1/series), read here over gRPC.

Intervals are shown as what they are, [lower, upper] (a score interval clipped to [0, 1], not
symmetric about the estimate); one that lies entirely below 0 as "no evidence of presence"
(docs/math.md section 5). A bucket still open to late reports is marked provisional. A numeric
metric's part shows its mean or quantiles with their intervals, in the metric's units (series
tables: as its columns; CSV: as rows labelled mean, q50, q90, q99). A strings metric shows the
values its last discovery found, each with its share and selective interval, and the detection
floor below which nothing can be found (CSV: a row per value, labelled with its text).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any

from ._remote import add_address_argument, call, channel, text_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_address_argument(parser)
    parser.add_argument("metric", nargs="?", default="", help="one metric (default: all)")
    parser.add_argument("--window", default="", help="one window, e.g. total or 1h (default: all)")
    parser.add_argument(
        "--projection",
        action="store_true",
        help="also show the projection onto the simplex (a distribution, but biased)",
    )
    parser.add_argument(
        "--group", default="", metavar="LABELS", help="also the share of these categories together, e.g. chrome,edge"
    )
    parser.add_argument(
        "--last",
        default="",
        metavar="DURATION",
        help="the window's buckets of the last DURATION (e.g. 24h, 30d), one row each",
    )
    parser.add_argument(
        "--from",
        dest="start",
        type=int,
        default=0,
        metavar="UNIX",
        help="buckets from this time (Unix seconds; default: the oldest retained)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        type=int,
        default=0,
        metavar="UNIX",
        help="buckets before this time (Unix seconds; default: the current one included)",
    )
    parser.add_argument("--merged", action="store_true", help="one estimate of those buckets, counts added")
    parser.add_argument("--top", type=int, default=5, help="categories shown per bucket in a series table")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON (the shape of GET /v1/estimates)")
    output.add_argument("--csv", action="store_true", help="print CSV: one row per window or bucket and category")


def to_json(window) -> dict[str, Any]:  # a JSON document
    """A WindowEstimate message as /v1/estimates shows it (undefined numbers as null)."""
    from veil.mechanism import HASHED, HashedSpec, wire_shape_of

    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "metric": window.metric,
        "window": window.window,
        "start": window.start_unix,
        "end": window.end_unix,
        "n": window.n,
        # A strings metric's rounds are hashed, a design never declared (no registered shape).
        "mechanism": HASHED if window.mechanism == HashedSpec.proto else wire_shape_of(window.mechanism).name,
        "epsilon": window.epsilon,
        "spec_fingerprint": window.spec_fingerprint,
        "withheld": window.withheld,
        "reason": window.reason,
        "estimand": window.estimand,
        "period": window.period_seconds,
        "reports_per_device": window.reports_per_device,
        "periods": window.periods,
        "provisional": window.provisional,
        **_numeric(window, number),
        **_strings(window, number),
        **(
            {
                "group": {
                    "labels": list(window.group.labels),
                    "estimate": number(window.group.estimate),
                    "stderr": number(window.group.stderr),
                    "lower": number(window.group.lower),
                    "upper": number(window.group.upper),
                }
            }
            if window.HasField("group")
            else {}
        ),
        "categories": [
            {
                "label": c.label,
                "estimate": number(c.estimate),
                "stderr": number(c.stderr),
                "lower": number(c.lower),
                "upper": number(c.upper),
                "projected": number(c.projected),
            }
            for c in window.categories
        ],
    }


def _numeric(window, number) -> dict[str, Any]:
    """A numeric part's "numeric", "mean" and "quantiles" keys, as /v1/estimates has them."""
    if not window.HasField("numeric"):
        return {}
    from veil.wire.v1 import veil_pb2

    n = window.numeric
    try:
        part = veil_pb2.NumericPart.Name(n.part).removeprefix("NUMERIC_").lower()  # NUMERIC_MEAN -> mean
    except ValueError:  # a part of a later revision
        part = str(n.part)
    body: dict[str, Any] = {
        "numeric": {
            "metric": n.metric,
            "part": part,
            "low": n.low,
            "high": n.high,
            "boundaries": list(n.boundaries),
            "levels": n.levels,
        }
    }
    if window.HasField("mean"):
        m = window.mean
        body["mean"] = {x: number(getattr(m, x)) for x in ("estimate", "stderr", "lower", "upper")}
    if window.quantiles:
        body["quantiles"] = [
            {x: number(getattr(q, x)) for x in ("q", "estimate", "lower", "upper")} for q in window.quantiles
        ]
    return body


def _strings(window, number) -> dict[str, Any]:
    """A strings metric's "strings" key, as /v1/estimates has it (the codes in hex)."""
    if not window.HasField("strings"):
        return {}
    s = window.strings
    values = [
        {
            "code": v.code.hex(),
            "text": v.text,
            **{x: number(getattr(v, x)) for x in ("estimate", "stderr", "lower", "upper")},
        }
        for v in s.values
    ]
    return {"strings": {"values": values, "floor": number(s.floor), "candidates": s.candidates, "n": s.n}}


def run(args: argparse.Namespace) -> int:
    from veil.mechanism import PROJECTION_NOTE, MechanismError, parse_duration
    from veil.wire.v1 import veil_pb2, veil_pb2_grpc

    group = [label.strip() for label in args.group.split(",") if label.strip()]
    ranged = bool(args.last or args.start or args.end or args.merged)
    if ranged and not (args.metric and args.window):
        print("veil estimates: a range (--last, --from, --to, --merged) needs a metric and --window.", file=sys.stderr)
        return 2
    start = args.start
    if args.last:
        try:
            start = int(time.time()) - parse_duration(args.last)
        except MechanismError as err:
            print(f"veil estimates: --last: {err}", file=sys.stderr)
            return 2
    with channel(args) as remote:
        stub = veil_pb2_grpc.EstimatesStub(remote)
        metric, window = text_argument(args.metric, "METRIC"), text_argument(args.window, "--window")
        if ranged:
            response = call(
                args,
                stub.Series,
                veil_pb2.SeriesRequest(
                    metric=metric, window=window, from_unix=start, to_unix=args.end, merged=args.merged, group=group
                ),
            )
        else:
            response = call(args, stub.Get, veil_pb2.EstimatesRequest(metric=metric, window=window, group=group))
    windows = [to_json(w) for w in response.estimates]
    if args.json:
        print(json.dumps({"projection": PROJECTION_NOTE, "estimates": windows}, indent=2))
        return 0
    if args.csv:
        print_csv(windows)
        return 0
    if ranged and not args.merged:
        _series_table(windows, args.top)
        return 0
    print_table(windows, args.projection)
    return 0


def print_table(windows: list[dict], projection: bool) -> None:
    """The current estimates as `veil estimates` prints them: per window its header, then its
    categories (with the projection, if asked), group, numeric part's lines or strings' values."""
    from veil.mechanism import PROJECTION_NOTE

    for w in windows:
        print(
            f"{w['metric']} / {w['window']}  ({w['mechanism']}, epsilon = {w['epsilon']:g})  n = {w['n']:,}"
            + (f"  {PROVISIONAL}" if w["provisional"] else "")
        )
        if w["estimand"]:
            print(f"  estimates the {w['estimand']}")
        if w["withheld"]:
            print(f"  withheld: {w['reason']}\n")
            continue
        if "strings" in w:
            for line in strings_lines(w["strings"]):
                print(f"  {line}")
            print()
            continue
        head = f"  {'category':<24}{'estimate':>10}{'stderr':>10}{'95% interval':>24}"
        print(head + (f"{'projected*':>12}" if projection else ""))
        for c in w["categories"]:
            line = f"  {c['label'][:23]:<24}{_f(c['estimate']):>10}{_f(c['stderr']):>10}{interval_text(c):>24}"
            print(line + (f"{_f(c['projected']):>12}" if projection else ""))
        if "group" in w:
            g = w["group"]
            print(f"  {_group_name(g)[:23]:<24}{_f(g['estimate']):>10}{_f(g['stderr']):>10}{interval_text(g):>24}")
        for line in numeric_lines(w):
            print(f"  {line}")
        print()
    if projection:
        print(f"* {PROJECTION_NOTE}")


PROVISIONAL = "provisional (reports made in this bucket may still arrive)"
ABSENT = "no evidence of presence"


def interval_text(c: dict) -> str:
    """A category's (or group's) 95% interval as the table shows it: "[lower, upper]", or, for
    one that lies entirely below 0 (every share is further from the estimate than the noise
    reaches), ABSENT."""
    if c["upper"] is not None and c["upper"] < 0:
        return ABSENT
    return f"[{_f(c['lower']):>8}, {_f(c['upper']):>8}]"


def numeric_lines(w: dict) -> list[str]:
    """A numeric part's mean (with its standard error and 95% interval) or quantiles (each with
    its 95% interval, whose ends are bucket boundaries), in the metric's units; none otherwise."""
    lines = []
    if "mean" in w:
        m = w["mean"]
        lines.append(
            f"mean of {w['numeric']['metric']}: {_g(m['estimate'])} (stderr {_g(m['stderr'])}), "
            f"95% interval [{_g(m['lower'])}, {_g(m['upper'])}]"
        )
    for q in w.get("quantiles", []):
        lines.append(
            f"q{_g(100 * q['q'])} of {w['numeric']['metric']}: {_g(q['estimate'])}, "
            f"95% interval [{_g(q['lower'])}, {_g(q['upper'])}]"
        )
    return lines


def strings_lines(found: dict) -> list[str]:
    """A strings metric's found values (text, estimate and selective 95% interval, in %) and
    what could not be found: the floor, of how many candidates, from how many reports."""
    lines = [f"{'value':<32}{'estimate':>10}{'stderr':>10}{'95% interval':>22}"] if found["values"] else []
    for v in found["values"]:
        lines.append(f"{_text(v['text'], 31):<32}{_p(v['estimate']):>10}{_p(v['stderr']):>10}{_p_interval(v):>22}")
    floor = _p(found["floor"])
    lines.append(
        f"{len(found['values'])} of {found['candidates']:,} candidates found above the floor, {floor}, "
        f"from {found['n']:,} reports; a value below {floor} cannot be found"
    )
    return lines


def _text(text: str, width: int) -> str:
    """A value's text on one line (control characters escaped), cut to width."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)
    return shown if len(shown) <= width else shown[: width - 1] + "\u2026"


def _p(x: float | None) -> str:
    """A share in percent, to 2 decimals."""
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _p_interval(v: dict) -> str:
    return f"[{_p(v['lower'])}, {_p(v['upper'])}]"


def _g(x: float | None) -> str:
    """A number in a numeric metric's units, to 4 significant digits."""
    return "n/a" if x is None else f"{x:.4g}"


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _group_name(group: dict) -> str:
    return " + ".join(group["labels"])


def _when(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M")


def _cell(c: dict) -> str:
    if c["upper"] is not None and c["upper"] < 0:
        return ABSENT
    return f"{_f(c['estimate'])} [{_f(c['lower'])}, {_f(c['upper'])}]"


def _series_table(windows: list[dict], top: int) -> None:
    """One row per bucket: its start, n, and the estimates of the categories largest over the
    range (and the group's, if asked), each with its interval."""
    if not windows:
        print("No retained bucket in that range.")
        return
    w0 = windows[0]
    print(f"{w0['metric']} / {w0['window']} buckets ({w0['mechanism']}, epsilon = {w0['epsilon']:g}), UTC")
    shown = [w for w in windows if not w["withheld"]]
    sums: dict[str, float] = {}
    for w in shown:
        for c in w["categories"]:
            sums[c["label"]] = sums.get(c["label"], 0.0) + (c["estimate"] or 0.0)
    labels = sorted(sums, key=lambda label: -sums[label])[: max(top, 0)]
    if "numeric" in w0:  # a numeric part: its mean or quantiles, in its units, not its points' shares
        labels = [c["label"] for c in _numeric_rows(shown[-1])] if shown else []
    columns = labels + ([_group_name(w0["group"])] if any("group" in w for w in windows) else [])
    print(f"{'bucket start':<18}{'n':>10}{'c':>4}" + "".join(f"  {label[:25]:<25}" for label in columns))
    for w in windows:
        row = f"{_when(w['start']) + ('*' if w['provisional'] else ''):<18}{w['n']:>10,}{w['reports_per_device']:>4}"
        if w["withheld"]:
            print(row + "  withheld")
            continue
        if "numeric" in w:
            by_name = {c["label"]: c for c in _numeric_rows(w)}
            print(row + "".join(f"  {_numeric_cell(by_name.get(label)):<25}" for label in labels))
            continue
        by_label = {c["label"]: c for c in w["categories"]}
        cells = [by_label[label] for label in labels] + ([w["group"]] if "group" in w else [])
        print(row + "".join(f"  {_cell(c):<25}" for c in cells))
    print(f"estimates the {windows[-1]['estimand']} (each bucket its own)")
    if any(w["provisional"] for w in windows):
        print(f"* {PROVISIONAL}")


def _numeric_rows(w: dict) -> list[dict]:
    """A numeric part's mean ("mean") or quantiles ("q50", "q90", "q99") as rows with a label,
    estimate, stderr (None for a quantile), lower and upper, in the metric's units."""
    rows = [{"label": "mean", **w["mean"]}] if "mean" in w else []
    rows += [{"label": f"q{100 * q['q']:g}", "stderr": None, **q} for q in w.get("quantiles", [])]
    return rows


def _numeric_cell(c: dict | None) -> str:
    return "n/a" if c is None else f"{_g(c['estimate'])} [{_g(c['lower'])}, {_g(c['upper'])}]"


def print_csv(windows: list[dict]) -> None:
    """One row per window (or bucket) and category, the group's (if asked) after them, then a
    numeric part's mean or quantiles (labelled mean, q50, q90, q99; in the metric's units), or
    a strings metric's found values (labelled with their text)."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(
        [
            "metric",
            "window",
            "start",
            "end",
            "n",
            "reports_per_device",
            "periods",
            "provisional",
            "withheld",
            "label",
            "estimate",
            "stderr",
            "lower",
            "upper",
            "estimand",
        ]
    )
    for w in windows:
        head = [w["metric"], w["window"], w["start"], w["end"], w["n"], w["reports_per_device"], w["periods"]]
        head += [w["provisional"], w["withheld"]]
        rows = list(w["categories"]) + ([{**w["group"], "label": _group_name(w["group"])}] if "group" in w else [])
        rows += _numeric_rows(w)
        rows += [{"label": v["text"], **v} for v in w.get("strings", {}).get("values", [])]
        if not rows:
            out.writerow(head + ["", "", "", "", "", w["estimand"]])
        for c in rows:
            out.writerow(
                head
                + [c["label"]]
                + ["" if c[x] is None else repr(c[x]) for x in ("estimate", "stderr", "lower", "upper")]
                + [w["estimand"]]
            )
