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


# Which store columns a filter column reads.  A filter's answer for a row depends
# only on these, so it is evaluated once per distinct combination of them (a
# million rows typically hold a few hundred distinct (api, client id, status)
# combinations) and broadcast; continuous columns (latency, timestamps) make
# every row distinct and fall back to one evaluation per row.
_SOURCES: dict[str, tuple[str, ...]] = {
    "stream": ("stream",), "client": ("stream",), "broker": ("stream",),
    "api_key": ("api_key",), "api_name": ("api_name",), "api_version": ("api_version",),
    "correlation_id": ("cid",), "client_id": ("client_id",),
    "request_ts": ("ts", "status"), "response_ts": ("resp_ts",), "latency_ms": ("lat",),
    "request_size": ("req_size",), "response_size": ("resp_size",), "status": ("status",),
    "error_codes": ("err_codes",), "error_names": ("err_names",), "topics": ("topics",),
    "throttle_time_ms": ("throttle",), "long_poll": ("long_poll",),
}
_ALIASES = {"api": "api_name", "topic": "topics", "error": None, "errors": None}


def referenced_columns(expr: str) -> set[str] | None:
    """Exchange columns an expression reads; None when unsure (then every row is evaluated)."""
    from kwinspect.analyze.filter import FilterError, tokenize

    try:
        tokens = tokenize(expr)
    except FilterError:
        return None
    cols: set[str] = set()
    for tok in tokens:
        if tok.kind != "IDENT":
            continue
        name = str(tok.value)
        low = name.lower()
        if name in _SOURCES or low in _SOURCES:
            cols.add(name if name in _SOURCES else low)
        elif low in _ALIASES:
            alias = _ALIASES[low]
            cols.update((alias,) if alias else ("error_codes", "status"))
        else:
            return None
    return cols


def _col(store: ExchangeStore, name: str, lo: int, hi: int) -> np.ndarray:
    """A copy of positions [lo, hi) of a store column (taken under the lock: the writer may grow
    it, or widen an int32 column to int64)."""
    with store.lock:
        arr = store.cols[name]
        return np.frombuffer(arr, dtype=arr.typecode, count=len(arr))[lo:hi].copy()


def view_columns(store: ExchangeStore, names: tuple[str, ...], rows: np.ndarray | None) -> list[np.ndarray]:
    """Copies of the named store columns, of every held row or (``rows``: absolute ids, as a
    view holds them) of those rows still held; all taken under one lock so they line up."""
    with store.lock:
        n = len(store)
        cols = [np.frombuffer(store.cols[name], dtype=store.cols[name].typecode, count=n).copy() for name in names]
    if rows is not None:
        pos = rows - store.first
        pos = pos[(pos >= 0) & (pos < n)]
        cols = [col[pos] for col in cols]
    return cols


def _dense(col: np.ndarray, dtype: type) -> tuple[np.ndarray, int]:
    """(dense code per row, number of codes); O(n) for small integer codes, a sort otherwise."""
    if dtype in (np.uint8, np.int16, np.uint32):
        vals = col.astype(np.int64)
        if dtype is np.int16:
            vals += 32768
        top = int(vals.max()) + 1 if len(vals) else 1
        if top <= 50_000_000:
            present = np.bincount(vals, minlength=top) > 0
            rank = np.cumsum(present) - 1
            return rank[vals], int(present.sum())
    if dtype is np.float64:
        col = np.where(np.isnan(col), np.nan, col)  # one NaN pattern
    codes, inverse = np.unique(col, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), len(codes)


def _group_keys(store: ExchangeStore, cols: set[str], plo: int, phi: int,
                ids_pos: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(one int64 key per row: same key = same values in every referenced column, key range), or None."""
    sources = sorted({src for c in cols for src in _SOURCES[c]})
    key = np.zeros(len(ids_pos), dtype=np.int64)
    radix = 1
    for name in sources:
        col = _col(store, name, plo, phi)[ids_pos]
        codes, card = _dense(col, col.dtype.type)
        if card > len(ids_pos) // 4 or radix * card >= 2**62:
            return None  # (nearly) every row distinct: no gain from grouping
        key += codes * radix
        radix *= card
    return key, radix


def _groups(key: np.ndarray, radix: int) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first row of each group, group number per row)."""
    if radix <= 50_000_000:
        first = np.full(radix, -1, dtype=np.int64)
        first[key[::-1]] = np.arange(len(key) - 1, -1, -1, dtype=np.int64)
        present = np.nonzero(first >= 0)[0]
        rank = np.full(radix, -1, dtype=np.int64)
        rank[present] = np.arange(len(present))
        return first[present], rank[key]
    _uniq, first_idx, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first_idx, inverse.reshape(-1)


def _rows_matching(store: ExchangeStore, spec: ViewSpec, lo: int, hi: int, predicate,
                   check: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Absolute row ids in [lo, hi) (absolute) that the spec keeps, in capture order."""
    first = store.first
    plo, phi = max(lo - first, 0), hi - first
    if phi <= plo:
        return np.empty(0, dtype=np.int64)
    mask = np.ones(phi - plo, dtype=bool)
    if spec.errors_only:
        mask &= (_col(store, "err_codes", plo, phi) != 0) | (_col(store, "status", plo, phi) >= 2)
    if spec.api_key is not None:
        mask &= _col(store, "api_key", plo, phi) == spec.api_key
    if spec.stream is not None:
        mask &= _col(store, "stream", plo, phi) == spec.stream
    api_keys = getattr(predicate, "api_keys", None)
    if api_keys is not None:  # a filter only these apis can match (record fields: Produce, Fetch)
        mask &= np.isin(_col(store, "api_key", plo, phi), api_keys)
    ids = np.nonzero(mask)[0].astype(np.int64) + (plo + first)
    if predicate is None:
        return ids
    match_rows = getattr(predicate, "match_rows", None)
    if match_rows is not None:  # a filter that matches rows in bulk (record fields: tui.record_match)
        return match_rows(store, ids, check)
    view = RowView(store, 0)
    cols = referenced_columns(getattr(predicate, "expr", "")) if len(ids) > 1000 else None
    if cols is not None:
        grouped = _group_keys(store, cols, plo, phi, ids - (plo + first))
        if grouped is not None:
            first_idx, group = _groups(*grouped)
            keep_group = np.zeros(len(first_idx), dtype=bool)
            for g, n in enumerate(first_idx.tolist()):
                if g & 0xFFF == 0 and check is not None:
                    check(g, len(first_idx))
                view.row = int(ids[n])
                view.p = view.row - store.first
                try:
                    keep_group[g] = bool(predicate(view))
                except Exception:  # noqa: BLE001 - a predicate never takes the app down
                    keep_group[g] = False
            return ids[keep_group[group]]
    keep = np.zeros(len(ids), dtype=bool)
    # a chunk of ids at a time as Python ints: a million at once took ~36 MB for the scan
    for start in range(0, len(ids), 0x10000):
        if check is not None:
            check(start, len(ids))
        for n, row in enumerate(ids[start:start + 0x10000].tolist(), start):
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
    pos = ids - store.first
    pos = pos[pos >= 0]
    with store.lock:  # (the rows' latencies only: one copy, not the column's and then theirs)
        arr = store.cols["lat"]
        lat = np.frombuffer(arr, dtype=arr.typecode, count=len(arr))[pos]
    lat[np.isnan(lat)] = -np.inf
    np.negative(lat, out=lat)
    order = np.argsort(lat, kind="stable")
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
