"""The report's plot (throughput.png): reports per second by k and epsilon, log scale, Veil's
batch randomizer beside its peers, and end-to-end ingest per store and upload shape with the goals
drawn in. matplotlib's Agg backend, loaded only when a plot is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from _format import machine_line, si
from _goals import LARGE_1024_GOAL, LARGE_SMALL_K_GOAL, SMALL_UPLOADS_GOAL
from _targets import GRR_PEER, OUE_PEER, SS_PEER

__all__ = ["plot"]


RANDOMIZE_SERIES = (
    ("Veil subset fast", "#08519c"),
    ("Veil subset AES", "#4292c6"),
    ("Veil krr fast", "#006d2c"),
    ("Veil krr AES", "#41ab5d"),
    (SS_PEER, "#d94801"),
    (GRR_PEER, "#fd8d3c"),
    (OUE_PEER, "#737373"),
)


INGEST_COLORS = {
    ("memory", "large"): "#08519c",
    ("redis", "large"): "#a50f15",
    ("sqlite", "large"): "#006d2c",
    ("memory", "small"): "#6baed6",
    ("redis", "small"): "#fb6a4a",
    ("sqlite", "small"): "#74c476",
}


def grouped_bars(axis: Any, groups: list[str], series: list[tuple[str, str, list[float | None]]]) -> None:
    width = 0.84 / max(1, len(series))
    for index, (label, color, values) in enumerate(series):
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v else math.nan for v in values]
        axis.bar(xs, heights, width, label=label, color=color, edgecolor="white", linewidth=0.5)
    axis.set_xticks(range(len(groups)), groups)
    axis.set_yscale("log")
    axis.grid(axis="y", which="major", alpha=0.4)
    axis.grid(axis="y", which="minor", alpha=0.12)
    axis.set_axisbelow(True)


def plot(document: dict[str, Any], results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter

    panels = [name for name in ("randomize", "ingest") if name in results]
    figure, axes = pyplot.subplots(1, max(1, len(panels)), figsize=(8.5 * max(1, len(panels)), 7), squeeze=False)
    axes = list(axes[0])
    per_second = FuncFormatter(lambda v, _: si(v))

    def cell_label(k: int, epsilon: float) -> str:
        return f"k = {k}\n\u03b5 = {epsilon:g}"

    if "randomize" in results:
        axis = axes[panels.index("randomize")]
        cells = results["randomize"]["cells"]
        series = [
            (label, color, [c["contenders"].get(label, {}).get("reports_per_second") for c in cells])
            for label, color in RANDOMIZE_SERIES
            if any(label in c["contenders"] for c in cells)
        ]
        grouped_bars(axis, [cell_label(c["k"], c["epsilon"]) for c in cells], series)
        axis.set_title(
            "Batch randomize + sum + estimate, one core\n"
            "Veil (fast = seeded SFC64, AES = CSPRNG keystream) vs peers, same run"
        )
        axis.set_ylabel("reports per second (log scale)")
        axis.set_xlabel("categories k, privacy level \u03b5")
        axis.yaxis.set_major_formatter(per_second)
        axis.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    if "ingest" in results:
        axis = axes[panels.index("ingest")]
        data = results["ingest"]
        cells = data["ingest"]
        shapes = data["settings"]["shapes"]
        series = []
        for shape in shapes:
            for store in data["settings"]["stores"]:
                s = shapes[shape]
                values = [c["stores"].get(store, {}).get(shape, {}).get("reports_per_second") for c in cells]
                series.append(
                    (
                        f"{store}, {s['batch']}-report uploads, {s['in_flight']} in flight",
                        INGEST_COLORS.get((store, shape), None),
                        values,
                    )
                )
        groups = [cell_label(c["k"], c["epsilon"]) for c in cells]
        grouped_bars(axis, groups, series)
        small_batch = shapes.get("small", {}).get("batch", 10)
        for goal, which, text, style in (
            (LARGE_SMALL_K_GOAL, lambda k: k <= 128, "target, 1000-report uploads, k <= 128", "dashed"),
            (LARGE_1024_GOAL, lambda k: k == 1024, "target, 1000-report uploads, k = 1024", "dashed"),
            (
                SMALL_UPLOADS_GOAL * small_batch,
                lambda k: True,
                f"target, 10-report uploads: {si(SMALL_UPLOADS_GOAL)} uploads/s = "
                f"{si(SMALL_UPLOADS_GOAL * small_batch)} reports/s",
                "dotted",
            ),
        ):
            xs = [i for i, c in enumerate(cells) if which(c["k"])]
            if xs:
                axis.hlines(goal, min(xs) - 0.45, max(xs) + 0.45, colors="black", linestyles=style, linewidth=1)
                axis.annotate(text, (min(xs) - 0.45, goal), xytext=(2, 3), textcoords="offset points", fontsize=7)
        exact = document["checks"].get("ingest_exact_counts_ok")
        axis.set_title(
            "End to end: gRPC uploads -> aggregator process -> store\n"
            f"exact counts checked after every run: {'all OK' if exact else 'FAILED'}"
        )
        axis.set_ylabel("reports acknowledged per second (log scale)")
        axis.set_xlabel("categories k, privacy level \u03b5")
        axis.yaxis.set_major_formatter(per_second)
        axis.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    title = f"Veil throughput by k and \u03b5: {machine_line(document['machine'])}"
    if document["quick"]:
        title += "\nQUICK SMOKE RUN: the numbers mean nothing"
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    figure.savefig(scratch, dpi=110, format="png")
    pyplot.close(figure)
    scratch.replace(path)
