"""Write the TUI's current view as jsonl or csv (the `exchanges` table schema).

The TUI may not import kwinspect.export (front ends stay independent), so this
follows the same conventions with the stdlib: columns in
``model.EXCHANGE_COLUMNS`` order, ISO-8601 UTC timestamps with microseconds,
lists as JSON arrays (a JSON-encoded string in a CSV cell), null as JSON null /
an empty CSV cell, NaN as null.  Rows come from the compact store, so
exporting a million-row view never builds a million Exchange objects.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from kwinspect.model import EXCHANGE_COLUMNS
from kwinspect.tui.store import ExchangeStore

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TS_COLUMNS = ("request_ts", "response_ts")
LIST_COLUMNS = ("error_codes", "error_names", "topics")


def iso_utc(ts: float | None) -> str | None:
    if ts is None or not math.isfinite(ts):
        return None
    try:
        return (_EPOCH + timedelta(microseconds=round(ts * 1_000_000))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except OverflowError:
        return None


def export_row(store: ExchangeStore, row: int) -> dict[str, Any]:
    out = store.row_dict(row)
    for c in TS_COLUMNS:
        out[c] = iso_utc(out[c])
    lat = out.get("latency_ms")
    if isinstance(lat, float) and not math.isfinite(lat):
        out["latency_ms"] = None
    return out


def format_of(path: str) -> str | None:
    low = path.lower()
    if low.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if low.endswith(".csv"):
        return "csv"
    return None


def write_view(store: ExchangeStore, rows: Iterable[int], path: str | os.PathLike[str],
               fmt: str | None = None, progress: Callable[[int], None] | None = None) -> int:
    """Write the rows (absolute ids) to ``path``; returns how many were written."""
    path = os.fspath(path)
    fmt = fmt or format_of(path)
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"{path}: use a .jsonl or .csv file name")
    n = 0
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out, lineterminator="\r\n") if fmt == "csv" else None
        if writer is not None:
            writer.writerow(EXCHANGE_COLUMNS)
        for row in rows:
            if not store.has(row):
                continue
            rec = export_row(store, row)
            if writer is not None:
                writer.writerow([_csv_cell(c, rec[c]) for c in EXCHANGE_COLUMNS])
            else:
                out.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            n += 1
            if progress is not None and n % 50_000 == 0:
                progress(n)
    os.replace(tmp, path)
    return n


def _csv_cell(column: str, v: Any) -> Any:
    if v is None:
        return ""
    if column in LIST_COLUMNS:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if type(v) is str and v.startswith(_FORMULA_START):
        return "'" + v  # the CLI's CSV rule (export.writers.neutralize_formulas): no formulas
    return v


# the same characters as export.writers._FORMULA_START, which the TUI may not import
# (front ends are independent) until the table registry moves below them
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
