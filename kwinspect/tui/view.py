"""What the exchange list shows: the store's rows through a filter, toggles and a sort.

Quick toggles (errors only, one api, one connection) are numpy masks over
column copies; the filter expression (``analyze.filter``, the ``--filter``
language) runs on lazy ``RowView`` rows only where the masks left a row.
``ViewSpec`` is immutable; ``compute_view`` is pure and cancellable, so the
app runs it in a thread worker and swaps the result in when it is done.
New rows (indexing or live) are appended incrementally with ``extend_view``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kwinspect.tui.store import ExchangeStore, RowView

SORTS = ("capture", "latency")


@dataclass(frozen=True)
class ViewSpec:
    expr: str = ""
    errors_only: bool = False
    api_key: int | None = None
    api_label: str | None = None
    stream: int | None = None  # interned stream index
    stream_label: str | None = None
    sort: str = "capture"  # capture | latency (slowest first)

    @property
    def identity(self) -> bool:
        return not (self.expr or self.errors_only or self.api_key is not None or self.stream is not None
                    or self.sort != "capture")

    def with_(self, **kw) -> ViewSpec:
        return replace(self, **kw)

    def describe(self) -> str:
        parts = []
        if self.expr:
            parts.append(self.expr)
        if self.errors_only:
            parts.append("errors only")
        if self.api_label:
            parts.append(f"api={self.api_label}")
        if self.stream_label:
            parts.append(f"conn={self.stream_label}")
        if self.sort == "latency":
            parts.append("sorted by latency")
        return " · ".join(parts)


class Cancelled(Exception):
    pass


def _col(store: ExchangeStore, name: str, lo: int, hi: int, dtype) -> np.ndarray:
    arr = store.cols[name]
    with store.lock:
        out = np.frombuffer(arr, dtype=dtype, count=len(arr))[lo:hi].copy()
    return out


def _rows_matching(store: ExchangeStore, spec: ViewSpec, lo: int, hi: int, predicate,
                   check: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Absolute row ids in [lo, hi) (absolute) that the spec keeps, in capture order."""
    first = store.first
    plo, phi = max(lo - first, 0), hi - first
    if phi <= plo:
        return np.empty(0, dtype=np.int64)
    mask = np.ones(phi - plo, dtype=bool)
    if spec.errors_only:
        mask &= (_col(store, "err_codes", plo, phi, np.uint32) != 0) | (_col(store, "status", plo, phi, np.uint8) >= 2)
    if spec.api_key is not None:
        mask &= _col(store, "api_key", plo, phi, np.int16) == spec.api_key
    if spec.stream is not None:
        mask &= _col(store, "stream", plo, phi, np.uint32) == spec.stream
    ids = np.nonzero(mask)[0].astype(np.int64) + (plo + first)
    if predicate is None:
        return ids
    keep = np.zeros(len(ids), dtype=bool)
    view = RowView(store, 0)
    for n, row in enumerate(ids.tolist()):
        if n & 0xFFFF == 0 and check is not None:
            check(n, len(ids))
        view.row = row
        view.p = row - store.first
        if view.p < 0:
            continue
        try:
            keep[n] = bool(predicate(view))
        except Exception:  # noqa: BLE001 - a predicate never takes the app down
            keep[n] = False
    return ids[keep]


def order_rows(store: ExchangeStore, spec: ViewSpec, ids: np.ndarray) -> np.ndarray:
    if spec.sort != "latency" or len(ids) == 0:
        return ids
    lat_all = _col(store, "lat", 0, len(store), np.float64)
    pos = ids - store.first
    pos = pos[pos >= 0]
    lat = lat_all[pos]
    lat = np.where(np.isnan(lat), -np.inf, lat)
    order = np.argsort(-lat, kind="stable")
    return pos[order] + store.first


@dataclass
class ViewResult:
    spec: ViewSpec
    matched: np.ndarray  # capture order
    rows: np.ndarray  # display order
    upto: int  # absolute row id scanned up to (exclusive)


def compute_view(store: ExchangeStore, spec: ViewSpec, predicate=None,
                 is_cancelled: Callable[[], bool] | None = None,
                 progress: Callable[[float], None] | None = None) -> ViewResult:
    hi = store.total

    def check(n: int, total: int) -> None:
        if is_cancelled is not None and is_cancelled():
            raise Cancelled
        if progress is not None and total:
            progress(n / total)

    matched = _rows_matching(store, spec, store.first, hi, predicate, check)
    return ViewResult(spec, matched, order_rows(store, spec, matched), hi)


def extend_view(store: ExchangeStore, result: ViewResult, predicate=None) -> ViewResult:
    """Add rows that arrived since ``result`` was computed (and drop trimmed ones)."""
    hi = store.total
    if hi <= result.upto and (len(result.matched) == 0 or result.matched[0] >= store.first):
        return result
    new = _rows_matching(store, result.spec, result.upto, hi, predicate)
    matched = result.matched
    if len(matched) and matched[0] < store.first:
        matched = matched[matched >= store.first]
    matched = np.concatenate([matched, new]) if len(new) else matched
    if result.spec.sort == "capture":
        rows = matched
    else:
        rows = order_rows(store, result.spec, matched)
    return ViewResult(result.spec, matched, rows, hi)
