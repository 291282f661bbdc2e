"""Traffic over time (`t`): requests per second and p99 latency per api, per interval.

The series of `kwinspect stats --by api` (requests, latency_p99_ms), made from the
store's columns of the current view: an exchange counts in the interval of its
request (of its response when the request was not captured), intervals start on
multiples of their length since the epoch, p99 is nearest-rank over the paired
exchanges of the interval with Fetch long polls left out. The interval is chosen
so the view's span fits in about MAX_INTERVALS of them.
"""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from kwinspect.analyze.latency import nearest_rank
from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import STATUS_PAIRED
from kwinspect.tui.store import STATUSES, ExchangeStore
from kwinspect.tui.view import view_columns

INTERVALS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0,
             3600.0, 7200.0, 21600.0, 43200.0, 86400.0)
MAX_INTERVALS = 120  # points per line
MAX_SERIES = 6  # apis with a line of their own (the busiest)
LIVE_REFRESH = 1.0  # seconds between redraws of a live view
PAIRED = STATUSES.index(STATUS_PAIRED)  # the store keeps statuses as indexes


def choose_interval(span: float) -> float:
    """The shortest interval of INTERVALS that cuts ``span`` seconds into at most MAX_INTERVALS."""
    for interval in INTERVALS:
        if span / interval <= MAX_INTERVALS:
            return interval
    return INTERVALS[-1]


def traffic_columns(store: ExchangeStore, rows: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """(time, latency ms, api-name index, paired, long poll) of the rows of a view."""
    ts, lat, api, status, long_poll = view_columns(store, ("ts", "lat", "api_name", "status", "long_poll"), rows)
    ok = np.isfinite(ts)
    return ts[ok], lat[ok], api[ok], status[ok] == PAIRED, long_poll[ok] == 1


class TimeSeriesScreen(Screen[None]):
    BINDINGS = [Binding("escape,q", "close", "Back")]
    DEFAULT_CSS = """
    TimeSeriesScreen #ts-table { height: auto; max-height: 30%; }
    TimeSeriesScreen PlotextPlot { height: 1fr; }
    """

    def __init__(self, store: ExchangeStore, rows: np.ndarray | None, scope: str) -> None:
        super().__init__()
        self.store = store
        self.rows = rows
        self.scope = scope

    def compose(self) -> ComposeResult:
        yield Static(id="ts-title")
        yield DataTable(id="ts-table", cursor_type="row", zebra_stripes=True)
        yield PlotextPlot(id="ts-rate")
        yield PlotextPlot(id="ts-p99")
        yield Footer()

    def on_mount(self) -> None:
        self.draw()
        self.query_one("#ts-table", DataTable).focus()
        if getattr(self.app, "live", None) is not None and self.rows is None:
            # a live, unfiltered view: new exchanges come into the store; draw them in
            self.set_interval(LIVE_REFRESH, self.draw)

    def draw(self) -> None:
        store = self.store
        ts, lat, api, paired, long_poll = traffic_columns(store, self.rows)
        timed = paired & ~long_poll & ~np.isnan(lat)
        interval = choose_interval(float(ts.max() - ts.min()) if len(ts) else 0.0)
        slot = np.floor(ts / interval).astype(np.int64) if len(ts) else np.zeros(0, dtype=np.int64)
        first = int(slot.min()) if len(slot) else 0
        n_slots = int(slot.max()) - first + 1 if len(slot) else 0
        self.query_one("#ts-title", Static).update(Text.assemble(
            ("Traffic over time ", "bold"), f"({term_safe(self.scope, 100)}; {len(ts):,} exchanges; "
            f"{_interval_text(interval)} intervals; p99 nearest-rank, long polls left out)   Esc: back"))
        groups = []
        for a in np.unique(api):
            m = api == a
            groups.append((int(m.sum()), store.strings[int(a)] or "(unknown)", int(a)))
        groups.sort(key=lambda g: (-g[0], g[1]))
        table = self.query_one("#ts-table", DataTable)
        if not table.columns:
            for col in ("api", "requests", "peak/s", "mean/s", "worst p99 ms"):
                table.add_column(col)
        table.clear()
        rate_plot, p99_plot = self.query_one("#ts-rate", PlotextPlot), self.query_one("#ts-p99", PlotextPlot)
        for plot in (rate_plot, p99_plot):
            plot.plt.clear_figure()
        rate_plot.plt.title(f"requests/s per api ({_interval_text(interval)} intervals)")
        p99_plot.plt.title("p99 latency per api (ms)")
        x_all = [i * interval for i in range(n_slots)]
        for rank, (count, label, a) in enumerate(groups):
            m = api == a
            per_slot = np.bincount(slot[m] - first, minlength=n_slots) / interval
            worst = None
            p99_x, p99_y = [], []
            tm = m & timed
            if tm.any():
                order = np.argsort(slot[tm], kind="stable")
                s_sorted, l_sorted = slot[tm][order], lat[tm][order]
                bounds = np.flatnonzero(np.diff(s_sorted)) + 1
                for s_part, l_part in zip(np.split(s_sorted, bounds), np.split(l_sorted, bounds), strict=True):
                    p99 = float(nearest_rank(np.sort(l_part), 99))
                    p99_x.append((int(s_part[0]) - first) * interval)
                    p99_y.append(p99)
                worst = max(p99_y)
            span = n_slots * interval
            table.add_row(term_safe(label, 40), f"{count:,}", f"{per_slot.max():,.1f}",
                          f"{count / span:,.2f}" if span else "-", "-" if worst is None else f"{worst:.3f}")
            if rank < MAX_SERIES:
                name = term_safe(label, 30)
                rate_plot.plt.plot(x_all, per_slot.tolist(), label=name, marker="braille")
                if p99_x:
                    p99_plot.plt.plot(p99_x, p99_y, label=name, marker="braille")
        for plot in (rate_plot, p99_plot):
            plot.plt.xlabel("seconds since the first interval")
            plot.refresh()

    def action_close(self) -> None:
        self.dismiss(None)


def _interval_text(seconds: float) -> str:
    if seconds >= 60 and math.isclose(seconds % 60, 0):
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"
