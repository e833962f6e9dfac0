"""A strings metric's estimates as served (docs/protocol.md 10): a verification round computed
from real reports of planted values (veil_testing.planted_strings) gives the JSON of
/v1/estimates (json_text byte for byte json.dumps of to_json), the WindowEstimate bytes of gRPC
(the hand-written encoder's, equal to the generated classes'), and bounded /metrics gauges that
promtool accepts."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from veil_testing.planted_strings import ABSENT, PLANTED, verified, withheld
from veil_testing.promtool import promtool_lint

from veil.aggregator.discovery import Discovery, discovered
from veil.aggregator.estimates_wire import ResponseCache, encode_window, estimates_field
from veil.aggregator.live import WindowEstimate, estimates_json
from veil.aggregator.strings_estimates import StringsGauges
from veil.mechanism import HASHED, ROUNDS, HashedSpec, code_text, round_name, string_code
from veil.wire.v1 import veil_pb2


@pytest.fixture(scope="module")
def found() -> WindowEstimate:
    return verified()


def test_the_json_names_the_metric_and_lists_what_the_round_found(found):
    body = found.to_json()
    assert found.metric.spec.name == round_name("crash_signature", ROUNDS - 1) and body["metric"] == "crash_signature"
    assert body["mechanism"] == HASHED == "hashed" and body["categories"] == []
    strings = body["strings"]
    assert found.strings is not None
    assert set(strings) == {"values", "floor", "candidates", "n"}
    assert strings["candidates"] == len(PLANTED) + len(ABSENT) and strings["n"] == found.n == 4000
    assert strings["floor"] == found.strings.floor and 0 < strings["floor"] < min(PLANTED.values())
    # The planted values, largest first, each found with its selective interval around its share.
    assert [v["text"] for v in strings["values"]] == [code_text(string_code(v)) for v in PLANTED]
    assert strings["values"][2]["text"].startswith("#") and strings["values"][3]["text"] == "é"
    for value, (planted, share) in zip(strings["values"], PLANTED.items()):
        assert value["code"] == string_code(planted).hex()
        assert strings["floor"] < value["estimate"] and value["lower"] <= share <= value["upper"], value
        assert value["lower"] < value["estimate"] < value["upper"] and 0 < value["stderr"] < 0.02
    assert list(body)[-2:] == ["strings", "categories"]  # "categories" last, as json_text writes it


@pytest.mark.parametrize("make", [verified, withheld])
def test_json_text_is_json_dumps_of_to_json(make):
    e = make()
    assert e.json_text == json.dumps(e.to_json(), allow_nan=False)
    body = json.loads(estimates_json([e], 1_790_000_000.5))
    assert body["estimates"] == [e.to_json()]


def test_a_withheld_round_has_no_strings_and_still_the_metric_s_name():
    body = withheld().to_json()
    assert body["withheld"] and body["metric"] == "crash_signature" and body["mechanism"] == "hashed"
    assert "strings" not in body and body["categories"] == []


def test_a_floor_of_no_reports_is_null_in_json(found):
    empty = dataclasses.replace(found.strings, n=0, floor=math.nan, values=())
    body = dataclasses.replace(found, strings=empty).to_json()
    assert body["strings"] == {"values": [], "floor": None, "candidates": 6, "n": 0}


def reference_strings(d: Discovery) -> veil_pb2.StringsEstimate:
    """The message built field by field with the generated classes."""
    values = [veil_pb2.DiscoveredValue(**dataclasses.asdict(v)) for v in d.values]
    return veil_pb2.StringsEstimate(values=values, floor=d.floor, candidates=d.candidates, n=d.n)


@pytest.mark.parametrize("make", [verified, withheld])
def test_the_wire_bytes_are_the_generated_classes_own(make):
    e = make()
    data = encode_window(e)
    message = veil_pb2.WindowEstimate.FromString(data)
    assert data == message.SerializeToString()  # fields in number order, 21 last
    spec = e.metric.spec
    expected = veil_pb2.WindowEstimate(
        metric="crash_signature",
        window="1d",
        start_unix=e.start,
        end_unix=e.end,
        n=e.n,
        mechanism=veil_pb2.HASHED,
        epsilon=spec.mechanism.epsilon,
        spec_fingerprint=spec.fingerprint,
        withheld=e.withheld,
        reason=e.reason,
        estimand=e.estimand,
        reports_per_device=1,
        period_seconds=86400,
        provisional=True,
        periods=1,
        strings=None if e.strings is None else reference_strings(e.strings),
    )
    assert data == expected.SerializeToString()
    assert veil_pb2.HASHED == HashedSpec.proto and not message.categories
    assert message.HasField("strings") == (e.strings is not None)


def test_the_wire_carries_every_value_s_numbers_exactly(found):
    message = veil_pb2.WindowEstimate.FromString(encode_window(found))
    assert found.strings is not None
    got = [(v.code, v.text, v.estimate, v.stderr, v.lower, v.upper) for v in message.strings.values]
    assert got == [dataclasses.astuple(v) for v in found.strings.values]
    assert (message.strings.floor, message.strings.candidates, message.strings.n) == (found.strings.floor, 6, 4000)


def test_the_response_cache_follows_the_round_not_only_the_version(found):
    """Next period's verification round (another spec) at the same bucket version is new bytes."""
    cache = ResponseCache()
    first = cache.response(("", ""), [found])
    other = verified(seed=8, epsilon=3.0)  # same metric and window, same start and version
    assert other.metric.name == found.metric.name and other.version == found.version
    assert cache.response(("", ""), [other]) == estimates_field(other) != first


def metrics_text(estimates: list[WindowEstimate], top: int) -> str:
    """The /metrics text of these estimates' strings gauges, as the collector exports them."""
    gauges = StringsGauges(top)
    for e in estimates:
        if e.strings is not None:
            gauges.add(e.window.name, e.strings)

    class Families:  # a registry collects from objects with collect()
        def collect(self):
            return gauges.families()

    registry = CollectorRegistry()
    registry.register(Families())
    return generate_latest(registry).decode()


def test_metrics_export_the_top_values_with_their_intervals_and_the_floor(found):
    text = metrics_text([found], top=50)
    assert found.strings is not None
    for v in found.strings.values:
        names = f'metric="crash_signature",value="{v.text}",window="1d"'
        for suffix, x in (("", v.estimate), ("_stderr", v.stderr), ("_lower", v.lower), ("_upper", v.upper)):
            assert f"veil_strings_share{suffix}{{{names}}} {x!r}" in text
    assert f'veil_strings_floor{{metric="crash_signature",window="1d"}} {found.strings.floor!r}' in text
    assert promtool_lint(text) == ""


def test_metrics_are_bounded_by_metrics_top_the_largest_kept(found):
    other = verified(n=2000, seed=9, metric="error_message")
    text = metrics_text([found, other, withheld("quiet")], top=2)
    shares = [line for line in text.splitlines() if line.startswith("veil_strings_share{")]
    assert len(shares) == 4  # 2 metrics x the top 2 (the withheld one has no values)
    assert found.strings is not None and other.strings is not None
    for d in (found.strings, other.strings):
        assert len(d.values) == 4
        kept = {line.split('value="')[1].split('"')[0] for line in shares if f'metric="{d.metric}"' in line}
        assert kept == {v.text for v in d.values[:2]}
    floors = [line for line in text.splitlines() if line.startswith("veil_strings_floor{")]
    assert len(floors) == 2
    assert promtool_lint(text) == ""


def test_two_values_shown_alike_keep_one_series(found):
    """A code whose bytes are not UTF-8 shows them escaped, so it can read as another's text."""
    spec = found.metric.spec
    d = discovered(spec, found.estimate)
    raw, spelt = string_code(b"\x80"), string_code(b"\\x80")
    assert code_text(raw) == code_text(spelt) == "\\x80"
    first, second = d.values[:2]
    alike = dataclasses.replace(
        d,
        values=(
            dataclasses.replace(first, code=raw, text=code_text(raw)),
            dataclasses.replace(second, code=spelt, text=code_text(spelt)),
        ),
    )
    text = metrics_text([dataclasses.replace(found, strings=alike)], top=50)
    (line,) = [x for x in text.splitlines() if x.startswith("veil_strings_share{")]
    assert line.endswith(repr(first.estimate))
    assert promtool_lint(text) == ""
