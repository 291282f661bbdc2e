"""Streaming writers for the three public tables: exchanges, records, errors.

One schema per table, shared by every format (columns: docs/columns.md).  Column
order is always the order of ``model.*_COLUMNS``.  Writers take model rows
(``Exchange``/``RecordRow``/``ErrorRow``, anything with ``.row()``) or plain
dicts, one at a time, so memory stays bounded on millions of rows.

Value conventions (documented in docs/cli.md, "Output formats"):

* timestamps (``request_ts``, ``response_ts``, ``timestamp``, ``ts``) are float
  epoch seconds in the model; they are rounded to whole microseconds once, then
  written as ISO-8601 UTC strings with microseconds
  (``2024-01-02T03:04:05.123456Z``) in jsonl/csv/table and as
  ``timestamp[us, tz=UTC]`` in Parquet.  A timestamp outside years 1..9999 is
  written as null in every format.
* lists (``error_codes``, ``error_names``, ``topics``, ``headers``) are JSON
  arrays in jsonl, JSON-encoded strings in a CSV cell, and Parquet lists.
* null is JSON ``null``, an empty CSV cell, a Parquet null.  CSV cannot tell an
  empty string from null; ``key_encoding``/``value_encoding`` are null exactly
  when the key/value is null, so tombstones stay recognisable.
* booleans are ``true``/``false`` in jsonl and csv.
* NaN/infinite floats become null.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import json.encoder
import math
import operator
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kwinspect.analyze.termsafe import term_safe
from kwinspect.export import fastrender
from kwinspect.export.tables import LIST_COLUMNS, TABLES, TIMESTAMP_COLUMNS
from kwinspect.model import (
    ERROR_COLUMNS,
    EXCHANGE_COLUMNS,
    RECORD_COLUMNS,
    ErrorRow,
    Exchange,
    RecordRow,
)

FORMATS = ("table", "jsonl", "csv", "parquet")

if TYPE_CHECKING:
    import pyarrow as pa


def _arrow():
    """pyarrow, pyarrow.parquet and the column types, imported on first Parquet use.

    Importing pyarrow costs about 0.2 s, which every jsonl/csv/table command paid.
    The Arrow types live in analyze/schemas.py, shared with the Spark pipeline.
    """
    import pyarrow
    import pyarrow.parquet

    from kwinspect.analyze.schemas import ARROW_TYPES

    return pyarrow, pyarrow.parquet, ARROW_TYPES


def arrow_schema(table: str) -> pa.Schema:
    """The explicit Parquet/Arrow schema of one public table."""
    pa, _pq, types = _arrow()
    return pa.schema([pa.field(c, types[c]) for c in columns_of(table)])


def columns_of(table: str) -> tuple[str, ...]:
    try:
        return TABLES[table]
    except KeyError:
        raise ValueError(f"unknown table {table!r} (expected one of {', '.join(TABLES)})") from None


# ---------------------------------------------------------------------------
# Value conversion shared by all formats
# ---------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Lone surrogates (from surrogateescape decoding) cannot be encoded as UTF-8.
# Every format writes them as the literal text "\udcff", so they still agree.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_text(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group(0)):04x}"
_MIN_US = -62135596800 * 1_000_000  # 0001-01-01T00:00:00Z
_MAX_US = 253402300799 * 1_000_000 + 999_999  # 9999-12-31T23:59:59.999999Z


def ts_to_micros(ts: float | int | None) -> int | None:
    """Epoch seconds -> whole microseconds (the one rounding every format shares)."""
    if ts is None:
        return None
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        delta = ts - _EPOCH
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    try:
        if not math.isfinite(ts):
            return None
        us = round(ts * 1_000_000)
    except (TypeError, ValueError, OverflowError):
        return None
    if us < _MIN_US or us > _MAX_US:
        return None
    return us


@functools.lru_cache(maxsize=4096)
def _iso_second(seconds: int) -> str:
    d = _EPOCH + timedelta(seconds=seconds)
    # Not strftime: %Y is not zero-padded for years before 1000 on every libc.
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"


def iso_utc(ts: float | int | None) -> str | None:
    """Epoch seconds -> ``2024-01-02T03:04:05.123456Z`` (None when not representable)."""
    us = ts_to_micros(ts)
    if us is None:
        return None
    seconds, micros = divmod(us, 1_000_000)  # floor: correct before 1970 too
    return f"{_iso_second(seconds)}.{micros:06d}Z"


def _row_dict(item: Any) -> Mapping[str, Any]:
    row = getattr(item, "row", None)
    if row is not None:
        return row()
    if isinstance(item, Mapping):
        return item
    raise TypeError(f"cannot export {type(item).__name__}: expected a model row or a dict")


_PLAIN = frozenset({str, int, bool, type(None)})


def _clean_scalar(v: Any) -> Any:
    if type(v) in _PLAIN:
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    return v


def _clean_list(v: Any) -> list[Any] | None:
    if v is None:
        return None
    out = []
    for x in v:
        if isinstance(x, Mapping):
            out.append(
                {
                    "key": _clean_scalar(x.get("key")),
                    "value": _clean_scalar(x.get("value")),
                    "value_encoding": _clean_scalar(x.get("value_encoding")),
                }
            )
        else:
            out.append(_clean_scalar(x))
    return out


@functools.lru_cache(maxsize=32)
def _text_converters(columns: tuple[str, ...]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    return tuple(
        (c, iso_utc if c in TIMESTAMP_COLUMNS else _clean_list if c in LIST_COLUMNS else _clean_scalar)
        for c in columns
    )


def normalize_row(item: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    """The text-format view of a row: ordered, ISO timestamps, clean values."""
    get = _row_dict(item).get
    return {c: conv(get(c)) for c, conv in _text_converters(tuple(columns))}


# ---------------------------------------------------------------------------
# Fast text paths: one row straight to its jsonl line / csv cells
# ---------------------------------------------------------------------------
#
# normalize_row + json.JSONEncoder cost ~14 us an exchange row, more than the rest
# of the output path together. The functions below turn the common values (exact
# str/int/float/bool/None, lists of those, header dicts) into exactly the text the
# general path writes (the C encoder's string escaping, float/int repr, ISO
# timestamps); anything else raises _Slow and the row takes the general path, so
# the output cannot differ. tests/export/test_fast_rows.py checks them against it.


class _Slow(Exception):
    """A value the fast path does not handle: write this row the general way."""


_enc_str = json.encoder.encode_basestring  # what JSONEncoder(ensure_ascii=False) uses
_int_repr = int.__repr__
_float_repr = float.__repr__
_isfinite = math.isfinite


def _j_scalar(v: Any) -> str:
    """JSON text of a scalar as normalize_row + the JSON encoder would write it."""
    t = type(v)
    if t is str:
        return _enc_str(v)
    if t is int:
        return _int_repr(v)
    if v is None:
        return "null"
    if t is float:
        return _float_repr(v) if _isfinite(v) else "null"
    if t is bool:
        return "true" if v else "false"
    if t is bytes:
        return '"' + v.hex() + '"'
    raise _Slow


# Keys and values of records run to kilobytes: escaping them char by char in the C
# encoder was a tenth of `records`. Most are ASCII with nothing to escape, which a
# translate over their bytes (a table lookup per byte, then memchr) tells 3x faster.
_LONG_TEXT_COLUMNS = frozenset({"key", "value"})
_LONG_TEXT = 128  # shorter strings: the encoder alone is cheaper than the test
_NEEDS_ESCAPE = bytes(0 if i < 0x20 or i == 0x22 or i == 0x5C else 1 for i in range(256))


def _enc_long(v: str) -> str:
    """_enc_str(v) for a long str."""
    if v.isascii() and 0 not in v.encode().translate(_NEEDS_ESCAPE):
        return '"' + v + '"'
    return _enc_str(v)


def _j_ts(v: Any) -> str:
    if type(v) is float:
        try:
            us = round(v * 1_000_000)
        except (ValueError, OverflowError):  # nan, inf
            return "null"
        if us < _MIN_US or us > _MAX_US:
            return "null"
        seconds, micros = divmod(us, 1_000_000)
        # str(1_000_000 + micros)[1:] is micros zero-padded to 6 digits, cheaper than :06d
        return f'"{_iso_second(seconds)}.{str(1_000_000 + micros)[1:]}Z"'
    text = iso_utc(v)
    return "null" if text is None else '"' + text + '"'


def _j_header(x: Any, sep: str) -> str:
    """One header dict as _clean_list + the encoder write it (sep: ", " jsonl, "," csv)."""
    if type(x) is not dict:
        raise _Slow
    get = x.get
    colon = ": " if sep == ", " else ":"
    return (f'{{"key"{colon}{_j_scalar(get("key"))}{sep}"value"{colon}{_j_scalar(get("value"))}'
            f'{sep}"value_encoding"{colon}{_j_scalar(get("value_encoding"))}}}')


def _j_list(v: Any) -> str:
    if v is None:
        return "null"
    if type(v) is not list:
        raise _Slow
    if not v:
        return "[]"
    if type(v[0]) is dict:
        return "[" + ", ".join([_j_header(x, ", ") for x in v]) + "]"
    return "[" + ", ".join(map(_j_scalar, v)) + "]"


def _c_scalar(v: Any) -> Any:
    """A CSV cell as normalize_row + _csv_cell would give it (surrogates not yet escaped)."""
    t = type(v)
    if t is str or t is int:
        return v
    if v is None:
        return ""
    if t is float:
        return v if _isfinite(v) else ""
    if t is bool:
        return "true" if v else "false"
    if t is bytes:
        return v.hex()
    raise _Slow


def _c_ts(v: Any) -> str:
    text = _j_ts(v)
    return "" if text == "null" else text[1:-1]


def _c_list(v: Any) -> str:
    if v is None:
        return ""
    if type(v) is not list:
        raise _Slow
    if not v:
        return "[]"
    if type(v[0]) is dict:
        return "[" + ",".join([_j_header(x, ",") for x in v]) + "]"
    return "[" + ",".join(map(_j_scalar, v)) + "]"


# Model rows whose attributes are the table columns: read them with one attrgetter
# instead of building the row() dict.
_MODEL_COLUMNS: dict[type, frozenset[str]] = {
    Exchange: frozenset(EXCHANGE_COLUMNS),
    RecordRow: frozenset(RECORD_COLUMNS),
    ErrorRow: frozenset(ERROR_COLUMNS),
}


def _surrogate_cell(v: str) -> str:
    return _SURROGATE.sub(_surrogate_text, v) if _SURROGATE.search(v) else v


def _compile_fast(columns: tuple[str, ...], fmt: str, newline: bool = False) -> Callable[[Any], Any]:
    """values (in column order) -> jsonl line (fmt "jsonl"; ending in "\\n" with
    ``newline``, which saves the writer copying every line once more) or csv cells ("csv").

    Generated code, one unrolled block per column: the common types are tested
    inline, which halves the cost of a per-column function call; everything else
    goes to the _j_*/_c_* functions above (which may raise _Slow).
    """
    names = [f"v{i}" for i in range(len(columns))]
    lines = ["def fast(vals):", f"    {', '.join(names)}{',' if len(names) == 1 else ''} = vals"]
    for i, c in enumerate(columns):
        v, o = f"v{i}", f"o{i}"
        if c in TIMESTAMP_COLUMNS and fmt == "jsonl":
            # _j_ts inline for floats well inside years 1..9999 (exchanges have two a row)
            lines += [
                f"    if type({v}) is float and {_MIN_US // 1_000_000 + 1}.0 < {v} < {_MAX_US // 1_000_000 - 1}.0:",
                f"        s, m = divmod(round({v} * 1000000), 1000000)",
                f"        {o} = f'\"{{_iso_second(s)}}.{{str(1000000 + m)[1:]}}Z\"'",
                f"    else: {o} = _j_ts({v})",
            ]
        elif c in TIMESTAMP_COLUMNS:
            lines.append(f"    {o} = _c_ts({v})")
        elif c in LIST_COLUMNS:
            fn = "_j_list" if fmt == "jsonl" else "_c_list"
            lines.append(f"    {o} = '[]' if type({v}) is list and not {v} else {fn}({v})")
            if fmt == "csv":
                lines.append(f"    if not {o}.isascii(): {o} = _surrogate_cell({o})")
        elif fmt == "jsonl":
            enc = (f"_enc_str({v}) if len({v}) < {_LONG_TEXT} else _enc_long({v})"
                   if c in _LONG_TEXT_COLUMNS else f"_enc_str({v})")
            lines += [
                f"    t = type({v})",
                f"    if t is str: {o} = {enc}",
                f"    elif t is int: {o} = _int_repr({v})",
                f"    elif {v} is None: {o} = 'null'",
                f"    else: {o} = _j_scalar({v})",
            ]
        else:
            lines += [
                f"    t = type({v})",
                f"    if t is str: {o} = {v} if {v}.isascii() else _surrogate_cell({v})",
                f"    elif t is int: {o} = {v}",
                f"    elif {v} is None: {o} = ''",
                f"    else: {o} = _c_scalar({v})",
            ]
    outs = ", ".join(f"o{i}" for i in range(len(columns)))
    if fmt == "jsonl":
        # an f-string: its BUILD_STRING joins the parts cheaper than %-formatting does
        parts = ", ".join(
            _enc_str(c).replace("{", "{{").replace("}", "}}") + f": {{o{i}}}"
            for i, c in enumerate(columns)
        )
        lines.append(f"    return f{'{{' + parts + '}}' + (chr(10) if newline else '')!r}")
    else:
        lines.append(f"    return [{outs}]")
    scope = {
        "_j_ts": _j_ts, "_c_ts": _c_ts, "_j_list": _j_list, "_c_list": _c_list,
        "_j_scalar": _j_scalar, "_c_scalar": _c_scalar, "_enc_str": _enc_str,
        "_int_repr": _int_repr, "_surrogate_cell": _surrogate_cell, "_enc_long": _enc_long,
        "_iso_second": _iso_second,
    }
    exec("\n".join(lines), scope)  # noqa: S102 - our own generated source, no input in it
    return scope["fast"]


def _jsonl_renderer(columns: tuple[str, ...], newline: bool) -> Callable[[Any], str]:
    """values -> jsonl line: the compiled renderer (export/fastrender.py) in front of the
    generated function, which it hands every row it does not render itself, or that
    function alone (pure-Python core)."""
    fast = _compile_fast(columns, "jsonl", newline=newline)
    if fastrender.JsonlRow is None:
        return fast
    kinds = bytes(1 if c in TIMESTAMP_COLUMNS else 2 if c in LIST_COLUMNS else 0 for c in columns)
    prefixes = tuple(("{" if i == 0 else ", ") + _enc_str(c) + ": " for i, c in enumerate(columns))
    try:
        return fastrender.JsonlRow(kinds, prefixes, "}\n" if newline else "}", fast)
    except ValueError:  # a column name that is not ASCII: the generated function alone
        return fast


class _FastRows:
    """Per-writer fast path for one column tuple (see above)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.getter = operator.attrgetter(*columns) if len(columns) > 1 else None
        self.direct = frozenset(t for t, cols in _MODEL_COLUMNS.items() if set(columns) <= cols)

    # Generated on first use: a writer needs one of the three (each exec costs ~0.7 ms at
    # start-up, in every --jobs worker too).
    @functools.cached_property
    def _jsonl(self):
        return _jsonl_renderer(self.columns, newline=False) if self.columns else None

    @functools.cached_property
    def jsonl_nl(self):
        return _jsonl_renderer(self.columns, newline=True) if self.columns else None

    @functools.cached_property
    def _csv(self):
        return _compile_fast(self.columns, "csv") if self.columns else None

    @functools.cached_property
    def line_of(self) -> Callable[[Any], str | None] | None:
        """The compiled renderer's line_of (a model row read from its slots, newline included;
        None for another object), when the C renderer runs and a model type of these
        columns has them all as slots: no tuple of values per row."""
        render = self.jsonl_nl
        if fastrender.JsonlRow is None or type(render) is not fastrender.JsonlRow:
            return None
        for row_type in sorted(self.direct, key=lambda t: t.__name__):
            try:
                render.bind(row_type, self.columns)
            except TypeError:
                continue
            return render.line_of
        return None

    def values(self, item: Any) -> Any:
        """The row's values in column order, or None when only the general path can tell."""
        if self.getter is None:
            return None
        if type(item) in self.direct:
            return self.getter(item)
        if type(item) is dict:
            get = item.get
            return [get(c) for c in self.columns]
        return None

    def jsonl(self, item: Any) -> str | None:
        vals = self.values(item)
        if vals is None:
            return None
        try:
            return self._jsonl(vals)
        except _Slow:
            return None

    def csv(self, item: Any) -> list[Any] | None:
        vals = self.values(item)
        if vals is None:
            return None
        try:
            return self._csv(vals)
        except _Slow:
            return None


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------


class RowWriter:
    """Base class: ``write(row)`` one at a time, ``close()`` once; a context manager.

    ``count`` is the number of rows written so far, also after an interruption:
    the CLI catches KeyboardInterrupt around its loop, closes the writer (which
    flushes and, for Parquet, writes a valid footer) and reports ``count``.
    """

    def __init__(self, table: str, columns: tuple[str, ...] | None = None) -> None:
        self.table = table
        self.columns = columns if columns is not None else columns_of(table)
        self.count = 0
        self.closed = False

    def write(self, item: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def write_text(self, text: str) -> None:
        """Write a row already rendered by a TextRenderer of this format and table."""
        raise TypeError(f"{type(self).__name__} takes rows, not rendered text")

    def write_all(self, items: Iterable[Any]) -> int:
        for item in items:
            self.write(item)
        return self.count

    def flush(self) -> None:
        """Push what was written to the output (live capture, on its idle ticks)."""

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_FILE_BUFFER = 1 << 20


class _TextOutput:
    """A text stream on a path or stdout; closes only what it opened."""

    def __init__(self, out: str | os.PathLike[str] | IO[str] | None, newline: str | None) -> None:
        self.owned = False
        if out is None or out == "-":
            stream = sys.stdout
            self.is_tty = stream.isatty()
        elif isinstance(out, str | os.PathLike):
            # A 1 MiB buffer: with the default 8 KiB, records rows (KBs each) cost a
            # write(2) every other row. Who wants rows sooner (live) flushes.
            stream = open(  # noqa: SIM115 - closed in close()
                out, "w", encoding="utf-8", newline=newline, buffering=_FILE_BUFFER
            )
            self.owned = True
            self.is_tty = False
        else:
            stream = out
            self.is_tty = bool(getattr(out, "isatty", lambda: False)())
        self.stream = stream

    def close(self) -> None:
        if self.owned:
            self.stream.close()
        else:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                pass


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes | bytearray | memoryview):
        return bytes(o).hex()
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return str(o)


class JsonlWriter(RowWriter):
    """One JSON object per line, keys in column order.

    On stdout each line is flushed as soon as it is written (``line_buffered``
    defaults to True there), so ``kwinspect ... | jq`` shows rows live.
    """

    def __init__(
        self,
        table: str,
        out: str | os.PathLike[str] | IO[str] | None = None,
        *,
        columns: tuple[str, ...] | None = None,
        line_buffered: bool | None = None,
    ) -> None:
        super().__init__(table, columns)
        self.out = _TextOutput(out, newline="\n")
        if line_buffered is None:
            line_buffered = not self.out.owned
        self.line_buffered = line_buffered
        self._dumps = json.JSONEncoder(
            ensure_ascii=False, allow_nan=False, default=_json_default, separators=(", ", ": ")
        ).encode
        self._fast = _FastRows(tuple(self.columns))

    def write(self, item: Any) -> None:
        stream = self.out.stream
        stream.write(self.line(item))
        if self.line_buffered:
            stream.flush()
        self.count += 1

    def line(self, item: Any) -> str:
        """The row's line, with its newline (what write() writes)."""
        fast = self._fast
        line = None
        line_of = fast.line_of  # a model row read from its slots (C), else the values path
        if line_of is not None:
            try:
                line = line_of(item)
            except _Slow:
                pass
        if line is None:
            vals = fast.values(item)
            if vals is not None:
                try:
                    line = fast.jsonl_nl(vals)
                except _Slow:
                    pass
        if line is None:
            line = self._dumps(normalize_row(item, self.columns)) + "\n"
        if not line.isascii() and _SURROGATE.search(line):
            # In JSON text the literal backslash must itself be escaped.
            line = _SURROGATE.sub(lambda m: "\\" + _surrogate_text(m), line)
        return line

    def text(self, items: list[Any]) -> str:
        """The lines of ``items`` joined: what line() makes of each, in order (a str item
        is a line a --jobs worker rendered, kept as it is). One pass of the compiled
        renderer over the batch, and the surrogate check once for all of it (the pattern
        is one character: checking the joined lines is checking each)."""
        line_of = self._fast.line_of
        lines = None
        if line_of is not None:
            try:
                lines = [line_of(item) for item in items]
            except _Slow:
                pass
        if lines is None or None in lines:  # (a str, a row of another type, a value it cannot render)
            line = self.line
            return "".join([item if type(item) is str else line(item) for item in items])
        text = "".join(lines)
        if not text.isascii() and _SURROGATE.search(text):
            text = _SURROGATE.sub(lambda m: "\\" + _surrogate_text(m), text)
        return text

    def write_text(self, text: str) -> None:
        stream = self.out.stream
        stream.write(text)
        if self.line_buffered:
            stream.flush()
        self.count += 1

    def close(self) -> None:
        if not self.closed:
            self.out.close()
        super().close()


def _csv_cell(column: str, v: Any) -> Any:
    if v is None:
        return ""
    if column in LIST_COLUMNS:
        v = json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    if isinstance(v, str):
        return _SURROGATE.sub(_surrogate_text, v) if _SURROGATE.search(v) else v
    if v is True:
        return "true"
    if v is False:
        return "false"
    return v


# OWASP's CSV injection rule: a spreadsheet runs a cell that starts with one of these as a
# formula (`=HYPERLINK(...)` from a record value), so text cells that do are written with
# a leading single quote unless the user asks for exact values (--csv-exact).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralize_formulas(cells: list[Any]) -> list[Any]:
    """Text cells a spreadsheet would run as a formula get a leading `'`; numbers stay numbers."""
    for i, v in enumerate(cells):
        if type(v) is str and v.startswith(_FORMULA_START):
            cells[i] = "'" + v
    return cells


class CsvWriter(RowWriter):
    """RFC 4180 CSV with a header row; lists are JSON-encoded strings in one cell.

    Text that a spreadsheet would take for a formula is prefixed with `'` unless
    ``exact`` (see ``neutralize_formulas``)."""

    def __init__(
        self,
        table: str,
        out: str | os.PathLike[str] | IO[str] | None = None,
        *,
        columns: tuple[str, ...] | None = None,
        header: bool = True,
        exact: bool = False,
    ) -> None:
        super().__init__(table, columns)
        self._exact = exact
        self._out = _TextOutput(out, newline="")
        self._csv = csv.writer(self._out.stream, lineterminator="\r\n")  # RFC 4180; quotes any \r in a value
        if header:
            self._csv.writerow(self.columns)
        self._fast = _FastRows(tuple(self.columns))

    def write(self, item: Any) -> None:
        cells = self._fast.csv(item)
        if cells is None:
            row = normalize_row(item, self.columns)
            cells = [_csv_cell(c, row[c]) for c in self.columns]
        if not self._exact:
            cells = neutralize_formulas(list(cells))
        self._csv.writerow(cells)
        self.count += 1

    def write_text(self, text: str) -> None:
        self._out.stream.write(text)
        self.count += 1

    def flush(self) -> None:
        """CSV is not flushed per row: flushed here, on the caller's schedule."""
        try:
            self._out.stream.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if not self.closed:
            self._out.close()
        super().close()


class TextRenderer:
    """A row -> exactly the text a JsonlWriter / CsvWriter (without header) writes for it.

    ``--jobs`` workers render rows with it, so the main process only merges and
    writes them (``RowWriter.write_text``).
    """

    def __init__(self, fmt: str, table: str, columns: tuple[str, ...] | None = None,
                 csv_exact: bool = False) -> None:
        self._buf = io.StringIO()
        if fmt == "jsonl":
            self._writer: RowWriter = JsonlWriter(table, self._buf, columns=columns, line_buffered=False)
        elif fmt == "csv":
            self._writer = CsvWriter(table, self._buf, columns=columns, header=False, exact=csv_exact)
        else:
            raise ValueError(f"cannot render {fmt!r} rows one at a time")
        # jsonl: the line itself, not through the StringIO (a copy, and after the
        # first truncate() a UCS-4 buffer: 4 bytes a char of KB record values)
        self._line = self._writer.line if fmt == "jsonl" else None

    def __call__(self, item: Any) -> str:
        if self._line is not None:
            return self._line(item)
        buf = self._buf
        self._writer.write(item)
        text = buf.getvalue()
        buf.seek(0)
        buf.truncate()
        return text


def _sanitize_strings(v: Any) -> Any:
    """Replace lone surrogates so Arrow (UTF-8 only) accepts the value."""
    if isinstance(v, str):
        return _SURROGATE.sub(_surrogate_text, v)
    if isinstance(v, list):
        return [_sanitize_strings(x) for x in v]
    if isinstance(v, dict):
        return {k: _sanitize_strings(x) for k, x in v.items()}
    return v


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[list]:
    """Holds back Ctrl-C (SIGINT handled by Python code, in the main thread) for the
    block; the list it yields is non-empty when one came, and the caller delivers it
    again (``signal.raise_signal``) to the handler now back in place. pyarrow creates
    the file before its writer exists: a Ctrl-C in between left a file with no footer
    (unreadable) and no writer to close it, where docs/cli.md promises a readable one."""
    old = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(old):
        yield []
        return
    came: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, old)


class ParquetWriter(RowWriter):
    """Parquet with the explicit table schema, written in row groups of ``batch_size``.

    Memory is bounded by one batch of rows.  ``out`` is a path or a binary
    stream; writing Parquet to a terminal is refused.
    """

    def __init__(
        self,
        table: str,
        out: str | os.PathLike[str] | IO[bytes] | None = None,
        *,
        columns: tuple[str, ...] | None = None,
        batch_size: int = 50_000,
        compression: str = "zstd",
    ) -> None:
        super().__init__(table, columns)
        self._pa, pq, types = _arrow()
        self.schema = self._pa.schema([self._pa.field(c, types[c]) for c in self.columns])
        if out is None or out == "-":
            if sys.stdout.isatty():
                raise ValueError("refusing to write Parquet to a terminal; use -o FILE.parquet")
            sys.stdout.flush()
            sink: Any = sys.stdout.buffer
        else:
            sink = out
        with _ctrl_c_deferred() as ctrl_c:
            self._writer = pq.ParquetWriter(sink, self.schema, compression=compression)
        self._batch_size = max(1, batch_size)
        self._cols: dict[str, list[Any]] = {c: [] for c in self.columns}
        self._pending = 0
        if ctrl_c:  # now that there is a writer to close, it is a Ctrl-C like any other
            self.close()
            signal.raise_signal(signal.SIGINT)

    def write(self, item: Any) -> None:
        row = _row_dict(item)
        cols = self._cols
        for c in self.columns:
            v = row.get(c)
            if c in TIMESTAMP_COLUMNS:
                v = ts_to_micros(v)
            elif c in LIST_COLUMNS:
                v = _clean_list(v)
            else:
                v = _clean_scalar(v)
            cols[c].append(v)
        self._pending += 1
        self.count += 1
        if self._pending >= self._batch_size:
            self._flush_batch()

    def _array(self, c: str, values: list[Any]) -> pa.Array:
        pa = self._pa
        typ = self.schema.field(c).type
        try:
            return pa.array(values, type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
            return pa.array(_sanitize_strings(values), type=typ)

    def _flush_batch(self) -> None:
        # Only whole rows: a Ctrl-C inside write() can leave some columns one value longer
        # than the others (``_pending`` counts rows whose every column was appended).
        cols, n = self._cols, self._pending
        self._cols = {c: [] for c in self.columns}
        self._pending = 0
        if not n:
            return
        arrays = [self._array(c, cols[c][:n]) for c in self.columns]
        self._writer.write_batch(self._pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        if not self.closed:
            try:
                self._flush_batch()
            finally:
                self._writer.close()
        super().close()


# ---------------------------------------------------------------------------
# Terminal tables
# ---------------------------------------------------------------------------

# What a human sees by default; every column is still available via `columns=`.
TABLE_DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "exchanges": (
        "frame", "request_ts", "client", "broker", "api_name", "api_version", "correlation_id",
        "client_id", "latency_ms", "status", "error_names", "topics",
    ),
    "records": (
        "frame", "direction", "topic", "partition", "offset", "timestamp", "key", "value",
        "headers", "compression", "crc_ok",
    ),
    "errors": (
        "frame", "ts", "kind", "name", "api_name", "correlation_id", "topic", "partition",
        "message", "stream",
    ),
    "stats": (
        "interval_start", "series", "api_name", "broker", "client_id", "topic", "partition",
        "group_id", "le_ms", "amount",
    ),
    "deliveries": (
        "topic", "partition", "offset", "key", "ack_ts", "produce_to_ack_ms", "times_fetched",
        "end_to_end_ms", "fetch_groups", "commit_group", "error",
    ),
}

# On a narrow terminal, default columns are dropped in this order until the
# rest fit with readable headers (explicit `columns=` are never dropped).
TABLE_DROP_ORDER: dict[str, tuple[str, ...]] = {
    "exchanges": ("client", "broker", "correlation_id", "api_version", "client_id", "topics", "frame",
                  "error_names"),
    "records": ("headers", "compression", "timestamp", "partition", "crc_ok", "frame"),
    "errors": ("stream", "correlation_id", "message", "partition", "api_name", "topic", "frame"),
    "stats": ("group_id", "client_id", "le_ms", "partition", "broker"),
    "deliveries": ("commit_group", "error", "produce_to_ack_ms", "key", "fetch_groups"),
}

# Columns that, on a terminal too narrow for them, move to an indented line under their
# row ("name: value", wrapped) instead of being dropped or cut: the text a reader needs
# whole (an error's message; the dimensions that tell one stats row from another).
# Moved in this order (those empty in the first rows first) until the row fits with every
# column whole, at the turn of the first of them in TABLE_DROP_ORDER.
TABLE_WRAP_COLUMNS: dict[str, tuple[str, ...]] = {
    "errors": ("message", "partition", "api_name", "topic"),
    "stats": ("group_id", "partition", "topic", "client_id", "broker", "api_version", "le_ms"),
}
_WRAP_MAX_CELL = 400  # a moved cell has lines to itself: cut later than in a column

# Widest a cell may get before it is cut with an ellipsis.
_MAX_CELL = {
    "key": 32, "value": 48, "headers": 40, "message": 60, "stream": 44, "topics": 40,
    "error_names": 32, "client_id": 28, "path": 40,
}
_DEFAULT_MAX_CELL = 36
LONG_POLL_STATUS = "long poll"  # the table's status of a paired Fetch with long_poll true
_SEP = "   "  # between table columns
_NUMERIC = frozenset(
    {"api_key", "api_version", "correlation_id", "latency_ms", "request_size", "response_size",
     "throttle_time_ms", "partition", "offset", "magic", "producer_id", "producer_epoch",
     "sequence", "code", "count", "mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms",
     "frame", "response_frame", "tcp_stream", "interval_s", "le_ms", "amount", "value_size",
     "produce_attempts", "times_fetched",
     "commit_offset", "produce_to_ack_ms", "ack_to_first_fetch_ms", "end_to_end_ms",
     "committed_after_ms", "produce_correlation_id"}
)


def _table_cell(column: str, v: Any, max_len: int | None = None) -> str:
    if v is None:
        return ""
    if column.endswith("_ms") and isinstance(v, float):
        text = f"{v:.3f}"
    elif column == "headers" and isinstance(v, list):
        text = ", ".join(
            f"{h.get('key')}={'null' if h.get('value') is None else h.get('value')}" for h in v
        )
    elif isinstance(v, list):
        text = ", ".join("" if x is None else str(x) for x in v)
    elif v is True:
        text = "true"
    elif v is False:
        text = "false"
    else:
        text = str(v)
    return term_safe(text, max_len or _MAX_CELL.get(column, _DEFAULT_MAX_CELL))


_DATE_LINE = object()  # marks a "── 2026-11-21 (UTC) ──" line among a chunk's rows


def _header_of(column: str) -> str:
    """Timestamp columns show the time of day (the date is on its own line): say so."""
    return column.replace("_ts", "_time") if column.endswith("_ts") else "time" if column == "ts" else column


def _floor_width(column: str, natural: int) -> int:
    """The narrowest a column may get: times and numbers never (a cut number or a
    time cut to its first digits misleads), text down to its header or 8 cells."""
    if column in TIMESTAMP_COLUMNS or column in _NUMERIC or column == "series":  # (a stats series name)
        return natural
    if column in _WHOLE_NAMES:  # api names, kinds, statuses: a cut name is a guess
        return min(natural, 16)
    if column == "name":  # an error code's name (UNKNOWN_TOPIC_OR_PARTITION is 26)
        return min(natural, 32)
    return min(natural, max(len(_header_of(column)), 8))


_WHOLE_NAMES = frozenset({"api_name", "kind", "status", "direction"})
_MOVED_INDENT = "    "  # moved cells under their row


def _table_width(is_tty: bool) -> int | None:
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return None if is_tty else 4096


class TableWriter(RowWriter):
    """Human table with rich.  Every cell goes through ``term_safe`` (control
    characters and ANSI escapes are shown escaped, never interpreted) and is cut
    to a per-column maximum.  Rows are printed in chunks, so a long stream
    starts showing at once and memory stays bounded; column widths are fixed
    from the first chunk so the chunks line up.
    """

    def __init__(
        self,
        table: str,
        out: str | os.PathLike[str] | IO[str] | None = None,
        *,
        columns: tuple[str, ...] | None = None,
        console: Any = None,
        chunk_size: int = 200,
        width: int | None = None,
        keep: tuple[str, ...] = (),
        wrap: tuple[str, ...] | None = None,
    ) -> None:
        from rich.console import Console

        self._droppable: tuple[str, ...] = ()
        if columns is None:
            columns = TABLE_DEFAULT_COLUMNS.get(table, columns_of(table))
            # `keep`: columns the user asked about (a filter on `error` keeps error_names)
            self._droppable = tuple(c for c in TABLE_DROP_ORDER.get(table, ()) if c not in keep)
        super().__init__(table, columns)
        # columns that may move under their row (TABLE_WRAP_COLUMNS), and those that did
        wrap = TABLE_WRAP_COLUMNS.get(table, ()) if wrap is None else wrap
        self._wrap = tuple(c for c in wrap if c in self.columns)
        self._moved: tuple[str, ...] = ()
        self._long: list[dict[str, str] | None] = []  # per row of _rows: its wrap cells, cut late
        self._row_columns = self.columns  # what a row is read for: the columns shown and the moved ones
        self._ts_cols = [i for i, c in enumerate(self.columns) if c in TIMESTAMP_COLUMNS]
        self._status_col = self.columns.index("status") if table == "exchanges" and "status" in self.columns else None
        self._date: str | None = None  # the day the time-of-day cells are on (a line says which)
        self._out: _TextOutput | None = None
        if console is None:
            self._out = _TextOutput(out, newline=None)
            console = Console(
                file=self._out.stream,
                # A terminal's own width (or COLUMNS when set); into a file or pipe,
                # rows are never squeezed unless COLUMNS says how wide to be.
                width=width if width is not None else _table_width(self._out.is_tty),
                highlight=False,
                markup=False,
                emoji=False,
                soft_wrap=False,
            )
        self.console = console
        self._chunk_size = max(1, chunk_size)
        self._rows: list[list[str]] = []
        self._widths: list[int] | None = None

    def write(self, item: Any) -> None:
        row = normalize_row(item, self._row_columns)
        cells = [_table_cell(c, row[c]) for c in self.columns]
        for i in self._ts_cols:
            cells[i] = self._time_of_day(cells[i])
        if self._status_col is not None and row.get("long_poll"):
            # a Fetch that waited for data: not a slow request (docs/columns.md, long_poll)
            cells[self._status_col] = LONG_POLL_STATUS
        self._rows.append(cells)
        self._long.append({c: _table_cell(c, row[c], _WRAP_MAX_CELL) for c in self._wrap}
                          if self._wrap else None)
        # (columns may shrink once, at the first chunk, on a narrow terminal)
        self.count += 1
        if len(self._rows) >= self._chunk_size:
            self._emit()

    def _time_of_day(self, text: str) -> str:
        """``2026-11-21T05:55:40.890434Z`` -> ``05:55:40.890434``: the date goes on a line of
        its own, printed before the first row and again wherever the day changes (a
        timestamp cut to its date tells nothing)."""
        date, sep, rest = text.partition("T")
        if not sep or not rest.endswith("Z"):
            return text
        if date != self._date:
            self._date = date
            self._rows.append([_DATE_LINE, date])
            self._long.append(None)
        return rest[:-1]

    def _emit(self) -> None:
        # Rows are laid out here rather than by rich.Table: widths are fixed after
        # the first chunk anyway, and rich's layout engine costs ~1 ms per row.
        from rich.cells import cell_len, set_cell_size
        from rich.text import Text

        first = self._widths is None
        if first:
            self._drop_columns_that_do_not_fit()
            self._widths = self._fit_widths()
        widths = self._widths
        assert widths is not None
        right = [c in _NUMERIC for c in self.columns]

        def cell(text: str, w: int, rjust: bool) -> str:
            n = cell_len(text)
            if n > w:
                text = set_cell_size(text, max(0, w - 1)) + ("…" if w else "")
                n = w
            pad = " " * (w - n)
            return pad + text if rjust else text + pad

        if first:
            header = _SEP.join(
                cell(_header_of(c), w, rj) for c, w, rj in zip(self.columns, widths, right, strict=True)
            )
            self.console.print(Text(header.rstrip(), style="bold"), soft_wrap=True)
            self.console.print("─" * cell_len(header), soft_wrap=True, markup=False,
                               highlight=False)
        if not self._rows:
            return
        lines = []
        for r, long in zip(self._rows, self._long, strict=True):
            if r[0] is _DATE_LINE:
                lines.append(f"── {r[1]} (UTC) ──")
                continue
            lines.append(_SEP.join(cell(x, w, rj) for x, w, rj in zip(r, widths, right, strict=True)).rstrip())
            if self._moved and long:
                lines.extend(self._moved_lines(long))
        self.console.file.write("\n".join(lines) + "\n")
        self._rows = []
        self._long = []

    def _moved_lines(self, long: dict[str, str]) -> list[str]:
        """The moved cells of a row, ``name: value``, wrapped to the width under the row."""
        import textwrap

        text = _SEP.join(f"{_header_of(c)}: {long[c]}" for c in self._moved if long.get(c))
        if not text:
            return []
        return textwrap.wrap(text, width=max(20, self.console.width), initial_indent=_MOVED_INDENT,
                             subsequent_indent=_MOVED_INDENT + "  ", break_on_hyphens=False)

    def _drop_columns_that_do_not_fit(self) -> None:
        cols = list(self.columns)
        rows = [r for r in self._rows if r[0] is not _DATE_LINE]
        moved: list[str] = []

        def natural(c: str) -> int:
            i = self.columns.index(c)
            return max([len(_header_of(c))] + [len(r[i]) for r in rows])

        def floor_total() -> int:
            # a column that can move under its row is shown whole or not at all
            return 3 * (len(cols) - 1) + sum(natural(c) if c in self._wrap else _floor_width(c, natural(c))
                                             for c in cols)

        def natural_total() -> int:
            return 3 * (len(cols) - 1) + sum(natural(c) for c in cols)

        def move() -> None:
            """Move what may move until the rest of the row fits uncut; columns with nothing
            to show in these rows first (moving them adds no line)."""
            empty = {c for c in self._wrap if not any(r[self.columns.index(c)] for r in rows)}
            for c in sorted(self._wrap, key=lambda c: c not in empty):
                if natural_total() <= self.console.width or len(cols) <= 2:
                    break
                if c in cols:
                    cols.remove(c)
                    moved.append(c)

        for c in self._droppable:
            if floor_total() <= self.console.width or len(cols) <= 2:
                break
            if c in self._wrap:  # the movable columns' turn: move them rather than drop them
                if not moved:
                    move()
                continue
            if c in cols:
                cols.remove(c)
        move()  # (tables whose columns were chosen, such as stats, drop nothing)
        self._moved = tuple(c for c in self.columns if c in moved)  # in the table's order
        self._wrap = self._moved  # from now on only these are kept per row
        if len(cols) != len(self.columns):
            keep = [self.columns.index(c) for c in cols]
            self._rows = [r if r[0] is _DATE_LINE else [r[i] for i in keep] for r in self._rows]
            self.columns = tuple(cols)
            self._row_columns = self.columns + self._moved
            self._ts_cols = [i for i, c in enumerate(self.columns) if c in TIMESTAMP_COLUMNS]
            self._status_col = self.columns.index("status") if self._status_col is not None else None

    def _fit_widths(self) -> list[int]:
        """Column widths from the first chunk, shrunk to the console width.

        The widest columns give way first, never below their header (or 8
        characters), so short columns such as api_name keep a readable header;
        only when even that does not fit does rich squeeze further.
        """
        from rich.cells import cell_len

        rows = [r for r in self._rows if r[0] is not _DATE_LINE]
        widths = [
            max([len(_header_of(c))] + [cell_len(r[i]) for r in rows])
            for i, c in enumerate(self.columns)
        ]
        floors = [_floor_width(c, w) for w, c in zip(widths, self.columns, strict=True)]
        available = self.console.width - 3 * (len(widths) - 1)
        excess = sum(widths) - available
        while excess > 0:
            i = max(range(len(widths)), key=lambda k: widths[k] - floors[k])
            room = widths[i] - floors[i]
            if room <= 0:
                break
            # Take from the widest column down to the next widest (at least 1).
            others = sorted((widths[k] - floors[k] for k in range(len(widths)) if k != i),
                            reverse=True)
            step = max(1, min(excess, room - (others[0] if others else 0), room))
            widths[i] -= step
            excess -= step
        # Still too wide (explicit columns on a narrow terminal): cut everything,
        # widest first, down to 3 characters.
        while excess > 0:
            i = max(range(len(widths)), key=lambda k: widths[k])
            if widths[i] <= 3:
                break
            widths[i] -= 1
            excess -= 1
        return widths

    def close(self) -> None:
        if not self.closed:
            if self._rows or self._widths is None:
                self._emit()
            if self._out is not None:
                self._out.close()
        super().close()


# ---------------------------------------------------------------------------
# Entry points for the CLI
# ---------------------------------------------------------------------------


def default_format(stream: IO[Any] | None = None) -> str:
    """``table`` when output goes to a terminal, else ``jsonl``."""
    stream = stream if stream is not None else sys.stdout
    try:
        return "table" if stream.isatty() else "jsonl"
    except (AttributeError, ValueError):
        return "jsonl"


def format_from_path(path: str | os.PathLike[str] | None) -> str | None:
    """Guess a format from an output file name (``.jsonl``/``.json``/``.csv``/``.parquet``)."""
    if path is None:
        return None
    suffix = Path(path).suffix.lower()
    return {
        ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
        ".parquet": "parquet", ".pq": "parquet", ".txt": "table",
    }.get(suffix)


_WRITERS: dict[str, Callable[..., RowWriter]] = {
    "jsonl": JsonlWriter,
    "csv": CsvWriter,
    "parquet": ParquetWriter,
    "table": TableWriter,
}


def open_writer(
    fmt: str,
    table: str,
    out: str | os.PathLike[str] | IO[Any] | None = None,
    **kwargs: Any,
) -> RowWriter:
    """A writer for ``table`` (exchanges|records|errors) in ``fmt`` to ``out``
    (a path, an open stream, or None/"-" for stdout)."""
    columns_of(table)
    try:
        cls = _WRITERS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})") from None
    return cls(table, out, **kwargs)


def write_rows(
    rows: Iterable[Any],
    table: str,
    fmt: str,
    out: str | os.PathLike[str] | IO[Any] | None = None,
    **kwargs: Any,
) -> int:
    """Write every row and close; returns the row count.

    The writer is closed even when the iteration is interrupted (Ctrl-C), so
    what was written is complete and valid (Parquet gets its footer); the
    KeyboardInterrupt is then re-raised for the caller to report.
    """
    writer = open_writer(fmt, table, out, **kwargs)
    if type(writer) is JsonlWriter and not writer.line_buffered:
        return _write_lines(writer, rows)
    return _write_each(writer, rows)


def write_row_batches(
    batches: Iterable[list[Any]],
    table: str,
    fmt: str,
    out: str | os.PathLike[str] | IO[Any] | None = None,
    **kwargs: Any,
) -> int:
    """write_rows for rows that come in lists (a batch of rows at a time from the packet
    loop): the same output, with the per-row Python only where a format needs it."""
    from itertools import chain

    writer = open_writer(fmt, table, out, **kwargs)
    if type(writer) is JsonlWriter and not writer.line_buffered:
        return _write_text_batches(writer, batches)
    return _write_each(writer, chain.from_iterable(batches))


def _write_each(writer: RowWriter, rows: Iterable[Any]) -> int:
    write, write_text = writer.write, writer.write_text
    try:
        for row in rows:
            if type(row) is str:  # rendered by a --jobs worker (TextRenderer)
                write_text(row)
            else:
                write(row)
    finally:
        writer.close()
    return writer.count


_LINES_PER_WRITE = 128


def _write_text_batches(writer: JsonlWriter, batches: Iterable[list[Any]]) -> int:
    """_write_lines for rows in lists: each list's text at once (JsonlWriter.text), one
    write per _LINES_PER_WRITE rows or more. What was rendered is written also when the
    iteration is interrupted."""
    text_of = writer.text
    stream_write = writer.out.stream.write
    pending: list[str] = []
    rows = 0
    try:
        for batch in batches:
            n = len(batch)
            # (a long list, all the rows a late watermark releases: rendered in pieces, so
            # the text held stays bounded)
            for part in (batch,) if n <= _LINES_PER_WRITE else (
                    batch[i:i + _LINES_PER_WRITE] for i in range(0, n, _LINES_PER_WRITE)):
                if not part:
                    continue
                pending.append(text_of(part))
                rows += len(part)
                if rows >= _LINES_PER_WRITE:  # (one text alone: written without another copy)
                    stream_write(pending[0] if len(pending) == 1 else "".join(pending))
                    writer.count += rows
                    pending.clear()
                    rows = 0
    finally:
        try:
            if pending:
                stream_write(pending[0] if len(pending) == 1 else "".join(pending))
                writer.count += rows
        finally:
            writer.close()
    return writer.count


def _write_lines(writer: JsonlWriter, rows: Iterable[Any]) -> int:
    """write_rows for a jsonl writer that need not flush every row: one write per
    _LINES_PER_WRITE lines (a TextIOWrapper.write a row was ~5% of `exchanges`).
    What was rendered is written also when the iteration is interrupted."""
    line = writer.line
    stream_write = writer.out.stream.write
    pending: list[str] = []
    add = pending.append
    try:
        for row in rows:
            add(row if type(row) is str else line(row))  # str: rendered by a --jobs worker
            if len(pending) >= _LINES_PER_WRITE:
                stream_write("".join(pending))
                writer.count += len(pending)
                pending.clear()
    finally:
        try:
            if pending:
                stream_write("".join(pending))
                writer.count += len(pending)
        finally:
            writer.close()
    return writer.count


__all__ = [
    "FORMATS", "TABLES", "TIMESTAMP_COLUMNS", "LIST_COLUMNS", "TABLE_DEFAULT_COLUMNS",
    "RowWriter", "JsonlWriter", "CsvWriter", "ParquetWriter", "TableWriter", "TextRenderer",
    "arrow_schema", "columns_of", "default_format", "format_from_path", "iso_utc",
    "normalize_row", "open_writer", "ts_to_micros", "write_row_batches", "write_rows",
]
