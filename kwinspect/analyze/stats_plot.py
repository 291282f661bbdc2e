"""`kwinspect stats --plot`: requests/s, p99 latency and bytes/s over time, per api or topic.

Drawn from the rows of a :class:`~kwinspect.analyze.stats.TrafficStats` kept by api and
topic only (``PLOT_BY``: a p99 per api cannot be made from p99s per api and broker),
written by the latency plot's machinery (analyze/plotting.py): .png, .svg, or a
static .html page with a table of the lines and the figure inlined as SVG.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from kwinspect.analyze.plotting import (
    OTHER_COLOUR,
    PLOT_SUFFIXES,
    html_page,
    plot_path,
    require_matplotlib,
    save_figure,
    top_groups,
)
from kwinspect.analyze.termsafe import term_safe

PLOT_BY = frozenset({"api_name", "topic"})  # the dimensions the plot's TrafficStats keeps
PLOT_FAMILIES = ("requests", "latency", "volume")
MAX_INTERVALS = 20_000  # points per line; longer runs are drawn from coarser intervals


class _Lines:
    """Values per line name per interval start (a dict of dicts), with totals for ranking."""

    def __init__(self) -> None:
        self.values: dict[str, dict[float, float]] = defaultdict(dict)
        self.totals: dict[str, float] = defaultdict(float)

    def add(self, name: str, start: float, value: float, how: str = "sum") -> None:
        line = self.values[name]
        if how == "max":
            line[start] = max(line.get(start, value), value)
        else:
            line[start] = line.get(start, 0.0) + value
        self.totals[name] += value if how == "sum" else 0


def _lines(rows: list[dict[str, Any]], by: str) -> tuple[_Lines, _Lines, _Lines, str, str]:
    first, p99, volume = _Lines(), _Lines(), _Lines()
    for r in rows:
        series, start, amount = r["series"], r["interval_start"], float(r["amount"])
        if by == "api":
            if series == "requests":
                first.add(r["api_name"] or "(unknown)", start, amount)
            elif series == "produced_bytes":
                volume.add("Produce", start, amount)
            elif series == "fetched_bytes":
                volume.add("Fetch", start, amount)
        else:
            if series in ("produced_records", "fetched_records"):
                first.add(r["topic"] or "(unknown)", start, amount)
            elif series in ("produced_bytes", "fetched_bytes"):
                volume.add(r["topic"] or "(unknown)", start, amount)
        if series == "latency_p99_ms":
            p99.add(r["api_name"] or "(unknown)", start, amount, "max")
        elif series == "latency_count":
            p99.totals[r["api_name"] or "(unknown)"] += amount
    what = "requests/s per api" if by == "api" else "records/s per topic (produced + fetched)"
    vol = "bytes/s produced and fetched" if by == "api" else "bytes/s per topic (produced + fetched)"
    return first, p99, volume, what, vol


def _draw(ax: Any, lines: _Lines, grid: Any, interval: float, rate: bool, log: bool,
          palette: dict[str, str]) -> None:
    import numpy as np

    top = top_groups(lines.totals)
    for name in top:  # one colour per api/topic in every panel
        palette.setdefault(name, f"C{len(palette) % 10}")
    others = [n for n in lines.values if n not in top]
    index = {t: i for i, t in enumerate(grid)}
    when = (np.asarray(grid) * 1e6).astype("int64").astype("datetime64[us]")

    def series_of(names: list[str]) -> Any:
        y = np.zeros(len(grid)) if rate else np.full(len(grid), np.nan)
        for name in names:
            for start, v in lines.values[name].items():
                i = index[start]
                if rate:
                    y[i] += v / interval
                else:
                    y[i] = v if math.isnan(y[i]) else max(y[i], v)
        return y

    drawn = 0
    for name in top:
        ax.plot(when, series_of([name]), color=palette[name], linewidth=1.4,
                marker="o" if len(grid) <= 60 else None, markersize=3, label=term_safe(name, 32))
        drawn += 1
    if others:
        ax.plot(when, series_of(others), color=OTHER_COLOUR, linewidth=1.0,
                label=f"other ({len(others)})")
    if not drawn:
        ax.text(0.5, 0.5, "nothing to draw", ha="center", va="center", transform=ax.transAxes)
        return
    if log:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")


def _grid(rows: list[dict[str, Any]], interval: float) -> list[float]:
    starts = [r["interval_start"] for r in rows]
    if not starts:
        return []
    lo, hi = round(min(starts) / interval), round(max(starts) / interval)
    if hi - lo + 1 > MAX_INTERVALS:  # every start that has data, without the quiet ones between
        return sorted(set(starts))
    # the quiet intervals between are drawn as 0 (counters) or left out (p99); the starts are
    # made as TrafficStats makes them, so they are the rows' own floats
    return sorted({round(i * interval, 6) for i in range(lo, hi + 1)} | set(starts))


def _figure(rows: list[dict[str, Any]], by: str, interval: float, title: str) -> tuple[Any, list]:
    from matplotlib.figure import Figure

    first, p99, volume, what, vol = _lines(rows, by)
    fig = Figure(figsize=(11, 10), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    fig.suptitle(title)
    grid = _grid(rows, interval)
    if not grid:
        for ax in axes:
            ax.text(0.5, 0.5, "no traffic", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return fig, []
    palette: dict[str, str] = {}
    _draw(axes[0], first, grid, interval, rate=True, log=False, palette=palette)
    axes[0].set_title(what)
    axes[0].set_ylabel("per second")
    _draw(axes[1], p99, grid, interval, rate=False, log=True, palette=palette)
    axes[1].set_title("p99 latency per api (ms, log scale; long polls left out)")
    axes[1].set_ylabel("ms")
    _draw(axes[2], volume, grid, interval, rate=True, log=False, palette=palette)
    axes[2].set_title(vol)
    axes[2].set_ylabel("bytes per second")
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    axes[2].xaxis.set_major_locator(locator)
    axes[2].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    axes[2].set_xlabel(f"time (UTC), {_interval_text(interval)} intervals")
    table = []
    for name in sorted(first.totals, key=lambda n: (-first.totals[n], n)):
        peak = max(first.values[name].values()) / interval
        worst = max(p99.values[name].values()) if name in p99.values else None
        table.append((name, first.totals[name], peak, worst, volume.totals.get(name)))
    return fig, table


def _interval_text(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"


def plot_stats(rows: list[dict[str, Any]], path: str | os.PathLike[str], *, by: str = "api",
               interval: float = 1.0, title: str | None = None) -> Path:
    """Write the plot of ``rows`` (the rows of a TrafficStats kept by PLOT_BY, families
    PLOT_FAMILIES) to ``path``; the type comes from the extension. ``by``: api or topic."""
    if by not in ("api", "topic"):
        raise ValueError(f"cannot plot by {by!r} (api or topic)")
    path = plot_path(path)
    require_matplotlib()
    title = title or f"Kafka traffic per {_interval_text(interval)}"
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text (searchable)
        fig, table = _figure(rows, by, interval, title)
        return save_figure(fig, path, lambda uri: _html(table, by, uri, title))


def _html(table: list[tuple], by: str, svg_uri: str, title: str) -> str:
    unit = "requests" if by == "api" else "records"
    head = [by, unit, f"peak {unit}/s", "worst p99 (ms)", "bytes"]
    rows = [([term_safe(name, 80), f"{total:,.0f}", f"{peak:,.1f}",
              "-" if worst is None else f"{worst:.3f}", "-" if not vol else f"{vol:,.0f}"], False)
            for name, total, peak, worst, vol in table]
    note = (f"{unit} per second, p99 latency (nearest-rank, per interval) and bytes per second over "
            "time; the columns of each line and every other series: <code>kwinspect stats</code>.")
    return html_page(title, note, head, rows, svg_uri, f"{unit}/s, p99 latency and bytes/s over time")


__all__ = ["PLOT_BY", "PLOT_FAMILIES", "PLOT_SUFFIXES", "plot_stats"]
