"""Aggregator configs as TOML text, for tests and benchmarks that start `veil serve`."""

from __future__ import annotations

import json

__all__ = ["config_toml", "LOAD"]

# reports_per_period of the metrics that tests and benchmarks load through few Reporters, each
# standing for many devices: the device-level bound must not stop the load (it has tests of its
# own), and the intervals then allow for that many alike reports per device.
LOAD = 10**6


def config_toml(data: dict) -> str:
    """The TOML of a config dict: tables of values and arrays of tables ([[auth.upload_tokens]]),
    then [[metrics]]. Just enough TOML for the configs the tests build."""

    def value(v: object) -> str:
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a TOML basic string (the same escapes)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    def tables(v: object) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    lines = []
    for table in [t for t in data if t != "metrics"]:
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in data[table].items() if not tables(v)]
        for k, v in data[table].items():
            if tables(v):
                for entry in v:
                    lines.append(f"[[{table}.{k}]]")
                    lines += [f"{kk} = {value(vv)}" for kk, vv in entry.items()]
    for metric in data["metrics"]:
        lines.append("[[metrics]]")
        lines += [f"{k} = {value(v)}" for k, v in metric.items()]
    return "\n".join(lines) + "\n"
