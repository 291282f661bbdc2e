"""Latency percentiles per api, broker, client or topic, and latency plots.

Only paired exchanges count (``status == "paired"`` with a finite
``latency_ms``: request's last byte -> response's first byte).

Percentiles are exact and use the **nearest-rank** definition: pN is the
smallest observed latency such that at least N% of the observations are less
than or equal to it (``rank = ceil(N/100 * count)``).  So every reported
percentile is a latency that really happened, p100 is the max, and for one
observation every percentile is that observation.  This is numpy's
``method="inverted_cdf"`` and what HdrHistogram-style tools report.

Memory: one float per paired exchange per group (8 bytes in an ``array``),
plus a (timestamp, latency, api) triple per exchange when the time series for
plots is kept -- about 50 MB for a million exchanges. A group past
``COMPACT_AT`` values whose values repeat (latencies are microsecond-exact, so
they do on long captures) becomes a count per distinct value
(:class:`LatencyCounts`): the same exact figures, memory by distinct values, not
by exchanges.
"""

from __future__ import annotations

import math
import os
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from kwinspect.analyze.plotting import (
    MAX_LINES,
    PLOT_SUFFIXES,
    html_page,
    plot_path,
    require_matplotlib,
    save_figure,
)
from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import STATUS_PAIRED, Exchange

GROUP_BY = ("api", "broker", "client", "topic")
PERCENTILES = (50, 95, 99)
LATENCY_COLUMNS = ("by", "group", "count", "mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms", "long_polls")
TOTAL_GROUP = "(all)"
# a group's values are looked at for compaction past this many (see LatencyCounts), every
# CHECK_EVERY exchanges; they are compacted when distinct values are under 1/COMPACT_GAIN of them
COMPACT_AT = 1 << 20
CHECK_EVERY = 1 << 16
COMPACT_GAIN = 16
# past this many values, the figures are worked out from a count per distinct value
# rather than a sorted list (a Python float is 32 bytes in a list, 8 in the array)
SORT_LIMIT = 1 << 16


class LatencyCounts:
    """A group's latencies as a count per distinct value (exact; ``append``/``extend``/
    ``len``/iteration like the array it replaces, iteration in ascending order)."""

    __slots__ = ("counts", "n")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.counts: Counter[float] = Counter()
        self.n = 0
        self.extend(values)

    def append(self, value: float) -> None:
        self.counts[value] += 1
        self.n += 1

    def extend(self, values: Any) -> None:
        if isinstance(values, LatencyCounts):
            self.counts.update(values.counts)
            self.n += values.n
        else:
            before = self.counts.total()
            self.counts.update(values)
            self.n += self.counts.total() - before

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return chain.from_iterable(repeat(v, c) for v, c in sorted(self.counts.items()))


def _compacted(values: Any) -> Any:
    """``values`` as LatencyCounts when that is much smaller, else unchanged."""
    if isinstance(values, LatencyCounts):
        return values
    counts = LatencyCounts(values)
    return counts if len(counts.counts) * COMPACT_GAIN <= len(values) else values


def nearest_rank(sorted_values: Any, p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of sorted values."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    rank = math.ceil(Fraction(str(p)) * n / 100)
    return sorted_values[min(max(rank, 1), n) - 1]


@dataclass(slots=True)
class GroupStats:
    """Latency of a group; every figure is None for a group that only had long polls."""

    group: str
    count: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    min_ms: float | None
    long_polls: int = 0  # Fetches that waited for data and got none: not in the figures

    def row(self, by: str) -> dict[str, Any]:
        return {
            # latencies are microsecond-exact (3 decimals in ms); the mean is rounded the same way
            "by": by, "group": self.group, "count": self.count,
            "mean_ms": None if self.mean_ms is None else round(self.mean_ms, 3),
            "p50_ms": self.p50_ms, "p95_ms": self.p95_ms, "p99_ms": self.p99_ms,
            "max_ms": self.max_ms, "long_polls": self.long_polls,
        }


def stats_of(group: str, values: Iterable[float]) -> GroupStats:
    if isinstance(values, LatencyCounts) or (hasattr(values, "__len__") and len(values) > SORT_LIMIT):
        return _stats_of_counts(group, values if isinstance(values, LatencyCounts) else LatencyCounts(values))
    vals = sorted(values)
    return GroupStats(
        group=group,
        count=len(vals),
        mean_ms=math.fsum(vals) / len(vals),
        p50_ms=nearest_rank(vals, 50),
        p95_ms=nearest_rank(vals, 95),
        p99_ms=nearest_rank(vals, 99),
        max_ms=vals[-1],
        min_ms=vals[0],
    )


def _stats_of_counts(group: str, counts: LatencyCounts) -> GroupStats:
    """stats_of, from a count per distinct value: the same figures (fsum is exactly
    rounded whatever the order; nearest rank found on the cumulative counts)."""
    items = sorted(counts.counts.items())
    n = counts.n
    ranks = {p: min(max(math.ceil(Fraction(p) * n / 100), 1), n) for p in PERCENTILES}
    at: dict[int, float] = {}
    seen = 0
    for v, c in items:
        seen += c
        for p, r in ranks.items():
            if p not in at and seen >= r:
                at[p] = v
        if len(at) == len(ranks):
            break
    return GroupStats(
        group=group, count=n,
        mean_ms=math.fsum(chain.from_iterable(repeat(v, c) for v, c in items)) / n,
        p50_ms=at[50], p95_ms=at[95], p99_ms=at[99], max_ms=items[-1][0], min_ms=items[0][0],
    )


def api_label(ex: Exchange) -> str:
    if ex.api_name:
        return ex.api_name
    return f"api_key {ex.api_key}" if ex.api_key is not None else "(unknown)"


class LatencyStats:
    """Streaming accumulator: ``add(exchange)`` for each exchange, then ``rows()``.

    ``by`` is one of ``api``, ``broker``, ``client``, ``topic``:

    * api: ``api_name`` (``api_key N`` when the key is unknown);
    * broker: the broker address ``ip:port``; ``(id N)`` is appended when a
      broker id is known for it;
    * client: ``client_id``, or the client address when the request carried none;
    * topic: every topic the exchange names (an exchange naming three topics
      counts once in each); exchanges naming no topic are left out.

    ``keep_series=True`` also keeps (timestamp, latency, api) per exchange for
    :func:`plot_latency`.
    """

    def __init__(self, by: str = "api", keep_series: bool = False, keep_total: bool = True) -> None:
        if by not in GROUP_BY:
            raise ValueError(f"cannot group latency by {by!r} (expected one of {', '.join(GROUP_BY)})")
        self.by = by
        self.keep_series = keep_series
        self._groups: dict[str, array] = {}
        self._all = array("d")
        # keep_total=False: no ``(all)`` row, and 8 bytes an exchange less (the summary)
        self._keep_total = keep_total
        self._counted = 0
        self._compact_later: dict[str | None, int] = {}  # group (None: all) -> size to look again
        self._broker_ids: dict[str, int] = {}
        self.skipped = 0  # exchanges without a latency (unpaired, no response expected)
        # long polls per group key (model.LONG_POLL_FRACTION): their latency is the
        # consumer's wait for data, so they are counted beside the figures, not in them
        self._long_polls: dict[str, int] = {}
        self.long_polls = 0
        # series for plots
        self._ts = array("d")
        self._lat = array("d")
        self._api_idx = array("H")
        self._apis: dict[str, int] = {}

    def _keys(self, ex: Exchange) -> list[str]:
        by = self.by
        if by == "api":
            return [api_label(ex)]
        if by == "broker":
            if ex.broker_id is not None and ex.broker:
                self._broker_ids[ex.broker] = ex.broker_id
            return [ex.broker or "(unknown)"]
        if by == "client":
            return [ex.client_id if ex.client_id is not None else (ex.client or "(unknown)")]
        return list(dict.fromkeys(t for t in ex.topics if t is not None))

    def add(self, ex: Exchange, api: str | None = None) -> bool:
        """Count one exchange; returns False when it has no latency to count. ``api``: the
        exchange's ``api_label`` when the caller has it (used as the key when grouped by api)."""
        lat = ex.latency_ms
        if ex.status != STATUS_PAIRED or lat is None or not math.isfinite(lat):
            self.skipped += 1
            return False
        keys = (api,) if api is not None and self.by == "api" else self._keys(ex)
        if ex.long_poll:
            self.long_polls += 1
            for key in keys:
                self._long_polls[key] = self._long_polls.get(key, 0) + 1
            return False
        for key in keys:
            vals = self._groups.get(key)
            if vals is None:
                vals = self._groups[key] = array("d")
            vals.append(lat)
        self._counted += 1
        if self._keep_total:
            self._all.append(lat)
        if not self._counted % CHECK_EVERY:
            self._compact()
        if self.keep_series and ex.request_ts is not None:
            if api is None:
                api = api_label(ex)
            idx = self._apis.get(api)
            if idx is None:
                idx = self._apis[api] = min(len(self._apis), 65535)
            self._ts.append(ex.request_ts)
            self._lat.append(lat)
            self._api_idx.append(idx)
        return True

    def add_labelled(self, exchanges: list[Exchange], apis: list[str]) -> None:
        """``add(ex, api)`` for each pair (the summary's batches): the same counts, the
        common case (grouped by api, no series) without a call per exchange."""
        if self.by != "api" or self.keep_series:
            for ex, api in zip(exchanges, apis, strict=True):
                self.add(ex, api)
            return
        groups, isfinite, keep_total = self._groups, math.isfinite, self._keep_total
        counted, skipped = self._counted, 0
        for ex, api in zip(exchanges, apis, strict=True):
            lat = ex.latency_ms
            if ex.status != STATUS_PAIRED or lat is None or not isfinite(lat):
                skipped += 1
                continue
            if ex.long_poll:
                self.long_polls += 1
                self._long_polls[api] = self._long_polls.get(api, 0) + 1
                continue
            vals = groups.get(api)
            if vals is None:
                vals = groups[api] = array("d")
            vals.append(lat)
            counted += 1
            if keep_total:
                self._all.append(lat)
            if not counted % CHECK_EVERY:
                self._counted = counted
                self._compact()
        self._counted = counted
        self.skipped += skipped

    def _compact(self) -> None:
        """Groups past COMPACT_AT values whose values repeat become counts (exact); a
        group whose values do not repeat enough is looked at again at twice its size."""
        later = self._compact_later
        for key, vals in [*self._groups.items(), (None, self._all)]:
            n = len(vals)
            if n < later.get(key, COMPACT_AT) or isinstance(vals, LatencyCounts):
                continue
            vals = _compacted(vals)
            if not isinstance(vals, LatencyCounts):
                later[key] = 2 * n
            elif key is None:
                self._all = vals
            else:
                self._groups[key] = vals

    def add_all(self, exchanges: Iterable[Exchange]) -> LatencyStats:
        for ex in exchanges:
            self.add(ex)
        return self

    def parts(self) -> tuple:
        """The values counted so far (per group, all, long polls, skipped), for
        :meth:`merge_parts` of another accumulator (--jobs workers' partial summaries)."""
        return (self._groups, self._all, self._long_polls, self.long_polls, self.skipped, self._broker_ids,
                self._counted)

    def merge_parts(self, parts: tuple) -> None:
        """Add another accumulator's :meth:`parts` (the percentiles are of all the values:
        exact; the series for plots are not merged)."""
        groups, values, long_polls, n_long_polls, skipped, broker_ids, counted = parts
        for key, vals in groups.items():
            mine = self._groups.get(key)
            if mine is None:
                self._groups[key] = LatencyCounts(vals) if isinstance(vals, LatencyCounts) else array("d", vals)
            elif isinstance(vals, LatencyCounts) and not isinstance(mine, LatencyCounts):
                self._groups[key] = LatencyCounts(mine)
                self._groups[key].extend(vals)
            else:
                mine.extend(vals)
        if self._keep_total:
            if isinstance(values, LatencyCounts) and not isinstance(self._all, LatencyCounts):
                self._all = LatencyCounts(self._all)
            self._all.extend(values)
        self._counted += counted
        for key, n in long_polls.items():
            self._long_polls[key] = self._long_polls.get(key, 0) + n
        self.long_polls += n_long_polls
        self.skipped += skipped
        for key, bid in broker_ids.items():
            self._broker_ids.setdefault(key, bid)

    @property
    def count(self) -> int:
        return self._counted

    def group_label(self, key: str) -> str:
        bid = self._broker_ids.get(key)
        return f"{key} (id {bid})" if bid is not None else key

    def groups(self) -> dict[str, list[float]]:
        """Raw latencies per group label (for tests and custom views)."""
        return {self.group_label(k): list(v) for k, v in self._groups.items()}

    def stats(self, include_total: bool = True) -> list[GroupStats]:
        """Per-group stats, busiest group first; the ``(all)`` row last."""
        out = []
        for k, v in self._groups.items():
            s = stats_of(self.group_label(k), v)
            s.long_polls = self._long_polls.get(k, 0)
            out.append(s)
        out += [GroupStats(self.group_label(k), 0, None, None, None, None, None, None, n)
                for k, n in self._long_polls.items() if k not in self._groups]
        out.sort(key=lambda s: (-s.count, -s.long_polls, s.group))
        if include_total and self._all:
            total = stats_of(TOTAL_GROUP, self._all)
            total.long_polls = self.long_polls
            out.append(total)
        return out

    def rows(self, include_total: bool = True) -> list[dict[str, Any]]:
        """Rows in ``LATENCY_COLUMNS`` order (ready for the jsonl/csv writers)."""
        return [s.row(self.by) for s in self.stats(include_total)]

    def series(self) -> tuple[list[float], list[float], list[str]]:
        """(request timestamps, latencies, api labels) of the kept series."""
        names = {i: n for n, i in self._apis.items()}
        return list(self._ts), list(self._lat), [names[i] for i in self._api_idx]


# ---------------------------------------------------------------------------
# Terminal rendering
# ---------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def latency_table(stats: LatencyStats, title: str | None = None) -> Any:
    """A rich Table of the stats (group names escaped for the terminal)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(
        title=title if title is not None else f"Latency by {stats.by} (ms, nearest-rank)",
        box=box.SIMPLE_HEAD, header_style="bold", title_justify="left",
    )
    t.add_column(stats.by, overflow="ellipsis", max_width=48, no_wrap=True)
    polls = stats.long_polls > 0  # the column only when a Fetch long-polled
    for name in ("count", "mean", "p50", "p95", "p99", "max") + (("long polls",) if polls else ()):
        t.add_column(name, justify="right", no_wrap=True)
    for s in stats.stats():
        style = "bold" if s.group == TOTAL_GROUP else None
        t.add_row(
            Text(term_safe(s.group, 48)), f"{s.count:,}", _ms(s.mean_ms), _ms(s.p50_ms),
            _ms(s.p95_ms), _ms(s.p99_ms), _ms(s.max_ms),
            *((f"{s.long_polls:,}" if s.long_polls else "",) if polls else ()), style=style,
        )
    if polls:
        t.caption = ("long polls: Fetches that waited for data and got none; their wait is not "
                     "in the latency figures")
        t.caption_justify = "left"
    return t


def render_latency(stats: LatencyStats, console: Any = None) -> None:
    from rich.console import Console

    console = console or Console(highlight=False)
    if not stats.count and not stats.long_polls:
        console.print("no paired exchanges with a latency", markup=False)
        return
    from kwinspect.analyze.richtables import fit_to_width

    table = latency_table(stats)
    fit_to_width(table, console.width - 4)  # the table's own edge padding and border
    console.print(table)


# ---------------------------------------------------------------------------
# Plots (matplotlib; see docs/cli.md for why)
# ---------------------------------------------------------------------------

_MAX_APIS = MAX_LINES  # more than this share one "other" colour
_MAX_POINTS = 100_000  # scatter points drawn; the slowest are always kept


def _figure(stats: LatencyStats, title: str) -> Any:
    import numpy as np
    from matplotlib.figure import Figure

    ts, lat, apis = stats.series()
    fig = Figure(figsize=(11, 8), layout="constrained")
    ax_hist, ax_time = fig.subplots(2, 1, height_ratios=[1, 1.2])
    fig.suptitle(title)
    if not lat:
        for ax in (ax_hist, ax_time):
            ax.text(0.5, 0.5, "no paired exchanges with a latency", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
        return fig

    lat_a = np.asarray(lat, dtype=float)
    ts_a = np.asarray(ts, dtype=float)
    api_a = np.asarray(apis, dtype=object)
    counts: dict[str, int] = {}
    for a in apis:
        counts[a] = counts.get(a, 0) + 1
    top = sorted(counts, key=lambda a: (-counts[a], a))[:_MAX_APIS]
    labels = np.where(np.isin(api_a, top), api_a, "other")
    order = top + (["other"] if len(counts) > len(top) else [])
    colors = {name: f"C{i}" for i, name in enumerate(top)}
    colors["other"] = "#9a9a9a"
    # Scatter: "other" underneath, then the busiest first so rare APIs stay visible.
    draw_order = (["other"] if "other" in order else []) + top

    # Histogram: log-spaced bins, since latency tails span orders of magnitude.
    positive = lat_a[lat_a > 0]
    lo = max(positive.min() if positive.size else 0.001, 0.001)
    hi = max(lat_a.max(), lo * 10)
    bins = np.logspace(np.log10(lo), np.log10(hi), 60)
    for name in order:
        sel = np.clip(lat_a[labels == name], lo, None)
        ax_hist.hist(sel, bins=bins, histtype="step", linewidth=1.5, color=colors[name],
                     label=f"{term_safe(name, 32)} (n={sel.size:,})")
    ax_hist.set_xscale("log")
    ax_hist.set_xlabel("latency (ms, log scale)")
    ax_hist.set_ylabel("exchanges")
    ax_hist.set_title("Latency histogram per API")
    ax_hist.legend(fontsize="small", loc="upper right")
    ax_hist.grid(True, which="both", alpha=0.3)

    # Time series: downsample deterministically, always keeping the slowest 1%.
    idx = np.arange(lat_a.size)
    if lat_a.size > _MAX_POINTS:
        cut = np.quantile(lat_a, 0.99)
        slow = idx[lat_a >= cut]
        rest = idx[lat_a < cut]
        step = max(1, math.ceil(rest.size / max(1, _MAX_POINTS - slow.size)))
        idx = np.sort(np.concatenate([slow, rest[::step]]))
        ax_time.set_title(f"Latency over time ({idx.size:,} of {lat_a.size:,} points drawn; "
                          "all of the slowest 1% kept)")
    else:
        ax_time.set_title("Latency over time")
    when = (ts_a[idx] * 1e6).astype("int64").astype("datetime64[us]")
    size, alpha = (6, 0.6) if idx.size <= 10_000 else (2, 0.4)
    for name in draw_order:
        sel = labels[idx] == name
        ax_time.scatter(when[sel], np.clip(lat_a[idx][sel], lo, None), s=size, alpha=alpha,
                        color=colors[name], label=term_safe(name, 32), rasterized=True,
                        linewidths=0)
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax_time.xaxis.set_major_locator(locator)
    ax_time.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax_time.set_yscale("log")
    ax_time.set_xlabel("request time (UTC)")
    ax_time.set_ylabel("latency (ms, log scale)")
    ax_time.grid(True, which="both", alpha=0.3)
    ax_time.legend(fontsize="small", loc="upper right", markerscale=2 if size > 2 else 4)
    return fig


def plot_latency(stats: LatencyStats, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Write the latency plot; the file type comes from the extension.

    ``.png`` and ``.svg`` write the figure; ``.html`` writes a self-contained
    page (no scripts, no network) with the percentile table and the figure
    inlined as SVG.  ``stats`` must have been built with ``keep_series=True``.
    """
    path = plot_path(path)
    if not stats.keep_series:
        raise ValueError("LatencyStats(keep_series=True) is needed for a plot")
    require_matplotlib()
    title = title or "Kafka request latency"
    fig = _figure(stats, title)
    return save_figure(fig, path, lambda svg_uri: _html_report(stats, svg_uri, title))


def _html_report(stats: LatencyStats, svg_uri: str, title: str) -> str:
    rows = []
    for s in stats.stats():
        cells = [term_safe(s.group, 80), f"{s.count:,}"] + [
            _ms(v) for v in (s.mean_ms, s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms)
        ]
        rows.append((cells, s.group == TOTAL_GROUP))
    note = (f"{stats.count:,} paired exchanges; latency = request's last byte to the\n"
            "response's first byte, in milliseconds; percentiles are nearest-rank (each is an observed value).")
    return html_page(title, note, [stats.by, "count", "mean", "p50", "p95", "p99", "max"], rows, svg_uri,
                     "latency histogram per API and latency over time")


__all__ = [
    "GROUP_BY", "LATENCY_COLUMNS", "PERCENTILES", "PLOT_SUFFIXES", "TOTAL_GROUP", "GroupStats",
    "LatencyStats", "api_label", "latency_table", "nearest_rank", "plot_latency",
    "render_latency", "stats_of",
]
