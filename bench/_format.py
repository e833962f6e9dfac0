"""Numbers and the machine in words, as the report's tables, targets and plot write them."""

from __future__ import annotations

from typing import Any

__all__ = ["THROUGH", "efficiency_text", "machine_line", "measured_ratio", "ratio", "si"]

# The listener a capacity run measured, in words. "native": results recorded before the native
# collector (server.native_grpc) was removed (bench/PROFILES.md section 4).
THROUGH = {
    "native": " through the since removed native listener, server.native_grpc,",
    "grpcio": " through the grpcio listener, server.grpc,",
}


def si(value: float | None) -> str:
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}x" if value >= 10 else f"{value:.1f}x"


def efficiency_text(check: dict[str, Any]) -> str:
    """A ratio of bench_capacity's efficiency checks: median (and the range of the rounds)."""
    rounds = check.get("ratio_rounds", ())
    spread = f" ({min(rounds):.0%}-{max(rounds):.0%})" if len(rounds) > 1 else ""
    return f"{check['ratio']:.0%}{spread}"


def measured_ratio(check: dict[str, Any]) -> str:
    """efficiency_text of a device-day ratio, "-" where none was measured (a --quick turn too
    short for a CPU tick)."""
    if check["ratio"] is None:
        return "-"
    return efficiency_text({**check, "ratio_rounds": [r for r in check["ratio_rounds"] if r is not None]})


def machine_line(machine: dict[str, Any]) -> str:
    cpus = machine.get("cpus_usable") or machine.get("cpu_count") or "?"
    model = machine.get("cpu_model") or machine.get("processor") or "unknown CPU"
    dates = sorted(d for d in machine.get("dates", {}).values() if d)
    when = dates[0][:10] if dates else "unknown date"
    if dates and dates[-1][:10] != when:
        when += f" to {dates[-1][:10]}"
    return f"{cpus} CPUs ({model}), Python {machine.get('python', '?')}, measured {when}"
