"""Latency: percentiles per api (nearest rank, as `kwinspect latency`) and latency over time."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from kwinspect.analyze.latency import nearest_rank
from kwinspect.analyze.termsafe import term_safe
from kwinspect.tui.store import ExchangeStore
from kwinspect.tui.view import view_columns

MAX_POINTS = 4_000  # points per series in the plot (largest values kept per time bucket)
MAX_SERIES = 6


def latency_columns(store: ExchangeStore, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request ts, latency ms, api-name index) of the paired rows of a view."""
    ts, lat, api = view_columns(store, ("ts", "lat", "api_name"), rows)
    ok = ~np.isnan(lat) & ~np.isnan(ts)
    return ts[ok], lat[ok], api[ok]


def downsample(x: np.ndarray, y: np.ndarray, n: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most n points: per time bucket keep the slowest (outliers are what one looks for)."""
    if len(x) <= n:
        return x, y
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    buckets = np.array_split(np.arange(len(x)), n)
    idx = np.array([b[np.argmax(y[b])] for b in buckets if len(b)])
    return x[idx], y[idx]


class LatencyScreen(Screen[None]):
    BINDINGS = [Binding("escape,q", "close", "Back")]
    DEFAULT_CSS = """
    LatencyScreen #lat-table { height: auto; max-height: 45%; }
    LatencyScreen PlotextPlot { height: 1fr; }
    """

    def __init__(self, store: ExchangeStore, rows: np.ndarray | None, scope: str) -> None:
        super().__init__()
        self.store = store
        self.rows = rows
        self.scope = scope

    def compose(self) -> ComposeResult:
        yield Static(id="lat-title")
        yield DataTable(id="lat-table", cursor_type="row", zebra_stripes=True)
        yield PlotextPlot(id="lat-plot")
        yield Footer()

    def on_mount(self) -> None:
        store = self.store
        ts, lat, api = latency_columns(store, self.rows)
        self.query_one("#lat-title", Static).update(Text.assemble(
            ("Latency ", "bold"), f"({term_safe(self.scope, 100)}; request's last byte to response's first byte; "
            f"{len(lat):,} paired exchanges)   Esc: back"))
        table = self.query_one("#lat-table", DataTable)
        for col in ("api", "count", "min", "p50", "p95", "p99", "max", "mean"):
            table.add_column(col)
        groups = []
        for a in np.unique(api):
            vals = np.sort(lat[api == a])
            groups.append((len(vals), store.strings[int(a)] or "(unknown)", vals, int(a)))
        groups.sort(key=lambda g: (-g[0], g[1]))
        for _n, label, vals, _a in groups + ([(len(lat), "(all)", np.sort(lat), -1)] if len(groups) > 1 else []):
            if not len(vals):
                continue
            cells = (vals[0], nearest_rank(vals, 50), nearest_rank(vals, 95), nearest_rank(vals, 99), vals[-1],
                     float(vals.mean()))
            table.add_row(term_safe(label, 40), f"{len(vals):,}", *(f"{float(v):.2f}" for v in cells))
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_figure()
        plt.title("latency over time (ms; slowest per bucket)")
        if len(ts):
            t0 = float(ts.min())
            for _n, label, _vals, a in groups[:MAX_SERIES]:
                m = api == a
                x, y = downsample(ts[m] - t0, lat[m])
                plt.scatter(x.tolist(), y.tolist(), label=term_safe(label, 30), marker="dot")
            plt.xlabel("seconds since the first exchange")
        plot.refresh()
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
