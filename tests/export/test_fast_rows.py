"""The writers' fast text path (export/writers.py, _FastRows) against the general one.

The general path (normalize_row + json.JSONEncoder / _csv_cell) is the reference:
for every row the fast path must give byte-identical jsonl and csv, or decline
(_Slow) so the general path writes the row. Checked on the rows of the shipped
captures and on hypothesis-generated rows with awkward values.
"""

from __future__ import annotations

import glob
import io
import os
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.analyze.record_rows import records_from_exchange
from kwinspect.export import writers
from kwinspect.model import (
    ERROR_COLUMNS,
    EXCHANGE_COLUMNS,
    RECORD_COLUMNS,
    ErrorRow,
    Exchange,
    RecordRow,
)
from kwinspect.run.files import FileRun, dissect_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURES = sorted(glob.glob(os.path.join(ROOT, "captures", "*.pcap")))
COLUMNS = {"exchanges": EXCHANGE_COLUMNS, "records": RECORD_COLUMNS, "errors": ERROR_COLUMNS}


def _write(fmt: str, table: str, rows, *, fast: bool, columns=None) -> str:
    buf = io.StringIO()
    w = writers.open_writer(fmt, table, buf, columns=columns)
    if not fast:
        w._fast.values = lambda item: None  # every row the general way
        w._fast.line_of = None  # (and not read from its slots by the C renderer)
    for r in rows:
        w.write(r)
    w.close()
    return buf.getvalue()


def _same(table: str, rows, columns=None) -> None:
    for fmt in ("jsonl", "csv"):
        want = _write(fmt, table, rows, fast=False, columns=columns)
        got = _write(fmt, table, rows, fast=True, columns=columns)
        assert got == want, fmt


def _capture_rows(path: str) -> dict[str, list]:
    run = FileRun()
    out: dict[str, list] = {"exchanges": [], "records": [], "errors": []}
    for ev in dissect_files([path], run=run):
        if isinstance(ev, Exchange):
            out["exchanges"].append(ev)
            out["records"].extend(records_from_exchange(
                ev, values="auto", topic_names=run.dissector.shared.topic_names))
        else:
            out["errors"].append(ev)
    return out


@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_fast_path_equals_general_path_on_shipped_captures(path):
    rows = _capture_rows(path)
    taken = 0
    for table, items in rows.items():
        _same(table, items)
        # and as dicts (row()), as latency/other callers hand them
        _same(table, [r.row() for r in items])
        f = writers._FastRows(COLUMNS[table])
        taken += sum(f.jsonl(r) is not None for r in items)
    assert taken > 0  # the fast path is really used


def test_fast_path_is_taken_for_plain_model_rows():
    ex = Exchange(stream="a->b", client="a", broker="b", api_key=0, api_name="Produce", api_version=9,
                  correlation_id=1, client_id="c", request_ts=1.5, response_ts=None, latency_ms=0.25,
                  request_size=10, response_size=None, status="paired", error_codes=[1, 2],
                  error_names=["X", "Y"], topics=["t"])
    f = writers._FastRows(EXCHANGE_COLUMNS)
    assert f.jsonl(ex) is not None and f.csv(ex) is not None
    assert f.jsonl(ex) == _write("jsonl", "exchanges", [ex], fast=False).rstrip("\n")


# Values chosen to hit every branch: lone surrogates, non-finite floats, ints beyond
# 64 bits, bytes, bools, subclasses and types only the general path knows.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(1 << 80), max_value=1 << 80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.text(alphabet=st.sampled_from(["a", "é", "\udcff", "\ud800", '"', "\\", "\n", ",", "\x1b", "日"])),
    st.binary(max_size=8),
    st.just(bytearray(b"\x01\xff")),
    st.just(Decimal("1.5")),
    st.just((1, 2)),
)
_header = st.fixed_dictionaries(
    {"key": _scalars, "value": _scalars, "value_encoding": st.one_of(st.none(), st.sampled_from(["utf8", "hex"]))},
)
_lists = st.one_of(st.none(), st.lists(_scalars, max_size=4), st.lists(_header, max_size=3),
                   st.lists(st.one_of(_scalars, _header), max_size=3), st.just("ab"), st.just((1, 2)))
_ts = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                st.floats(min_value=-7e10, max_value=3e11), st.integers(min_value=-(1 << 70), max_value=1 << 70),
                st.booleans(), st.text(max_size=3))


def _value(column: str):
    if column in writers.TIMESTAMP_COLUMNS:
        return _ts
    if column in writers.LIST_COLUMNS:
        return _lists
    return _scalars


def _row_strategy(table: str):
    cols = COLUMNS[table]
    return st.fixed_dictionaries({c: _value(c) for c in cols})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(sorted(COLUMNS)), data=st.data())
def test_fast_path_equals_general_path_on_generated_rows(table, data):
    rows = data.draw(st.lists(_row_strategy(table), min_size=1, max_size=4))
    _same(table, rows)
    cls = {"exchanges": Exchange, "records": RecordRow, "errors": ErrorRow}[table]
    _same(table, [cls(**r) for r in rows])  # the attrgetter path of model rows


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_fast_path_with_a_subset_of_columns(data):
    cols = tuple(data.draw(st.lists(st.sampled_from(EXCHANGE_COLUMNS + ("index", "nope")),
                                    min_size=1, max_size=5, unique=True)))
    rows = data.draw(st.lists(_row_strategy("exchanges"), min_size=1, max_size=3))
    exchanges = [Exchange(**r) for r in rows]
    _same("exchanges", exchanges, columns=cols)
    _same("exchanges", rows, columns=cols)


# Record keys/values of _LONG_TEXT chars or more take _enc_long (a byte-table test, then
# the plain quotes) instead of the C encoder: every char the encoder escapes, anywhere.
_long_text = st.builds(
    lambda head, mid, tail: head + mid + tail,
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=writers._LONG_TEXT,
            max_size=writers._LONG_TEXT + 300),
    st.text(alphabet=st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "\udcff", "\u2028"]),
            max_size=2),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(v=st.one_of(_long_text, st.text(min_size=writers._LONG_TEXT)))
def test_long_text_escapes_like_the_encoder(v):
    assert writers._enc_long(v) == writers._enc_str(v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_with_long_record_values(data):
    rows = data.draw(st.lists(_row_strategy("records"), min_size=1, max_size=3))
    plain = dict.fromkeys(RECORD_COLUMNS)
    plain.update(direction="produce", topic="t", partition=0, offset=1, timestamp=1.5,
                 headers=[{"key": "h", "value": "v", "value_encoding": "utf8"}])
    rows.append(plain)  # and a row the fast path surely takes
    for r in rows:
        r["key"] = data.draw(st.one_of(_long_text, _scalars))
        r["value"] = data.draw(_long_text)
    assert writers._FastRows(RECORD_COLUMNS).jsonl(rows[-1]) is not None or type(rows[-1]["key"]) not in (str, int, type(None))
    _same("records", rows)
    _same("records", [RecordRow(**r) for r in rows])


@pytest.mark.parametrize("n", [0, 1, writers._LINES_PER_WRITE, writers._LINES_PER_WRITE * 2 + 3])
def test_batched_file_writes_equal_row_by_row_writes(tmp_path, n):
    """write_rows to a file joins lines into one write per _LINES_PER_WRITE rows:
    same bytes as JsonlWriter.write row by row, worker-rendered text rows included,
    and on Ctrl-C every row handed over before it is on disk."""
    rows = _capture_rows(CAPTURES[0])["exchanges"]
    rows = (rows * (n // max(1, len(rows)) + 1))[:n]
    render = writers.TextRenderer("jsonl", "exchanges")
    mixed = [render(r) if i % 3 == 0 else r for i, r in enumerate(rows)]
    buf = io.StringIO()
    w = writers.JsonlWriter("exchanges", buf)
    for r in rows:
        w.write(r)
    want = buf.getvalue()
    out = tmp_path / "x.jsonl"
    assert writers.write_rows(iter(mixed), "exchanges", "jsonl", str(out)) == n
    assert out.read_text(encoding="utf-8") == want

    def interrupted():
        yield from mixed
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        writers.write_rows(interrupted(), "exchanges", "jsonl", str(out))
    assert out.read_text(encoding="utf-8") == want


def _text_of_batch(table: str, rows, columns=None) -> None:
    """JsonlWriter.text of a batch is the lines write() writes for each, in order."""
    w = writers.JsonlWriter(table, io.StringIO(), columns=columns)
    assert w.text(list(rows)) == "".join(w.line(r) for r in rows)


@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_text_of_a_batch_equals_its_lines_on_shipped_captures(path):
    for table, items in _capture_rows(path).items():
        _text_of_batch(table, items)
        _text_of_batch(table, [r.row() for r in items])  # dicts: not the compiled renderer's


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(sorted(COLUMNS)), data=st.data())
def test_text_of_a_batch_equals_its_lines_on_generated_rows(table, data):
    """Lone surrogates (escaped once for the batch), values the renderer declines, model
    rows and dicts mixed in one batch."""
    rows = data.draw(st.lists(_row_strategy(table), min_size=1, max_size=6))
    cls = {"exchanges": Exchange, "records": RecordRow, "errors": ErrorRow}[table]
    _text_of_batch(table, [cls(**r) for r in rows])
    _text_of_batch(table, [cls(**r) if i % 2 else r for i, r in enumerate(rows)])


@pytest.mark.parametrize("n", [0, 1, writers._LINES_PER_WRITE + 5, writers._LINES_PER_WRITE * 3 + 1])
@pytest.mark.parametrize("size", [7, 10**6])  # small lists, and all rows in one (rendered in pieces)
def test_row_batches_write_what_rows_write(tmp_path, n, size):
    """write_row_batches (lists of rows, worker-rendered text among them, empty lists too)
    writes the bytes write_rows writes, in every format."""
    rows = _capture_rows(CAPTURES[0])["exchanges"]
    rows = (rows * (n // max(1, len(rows)) + 1))[:n]
    render = writers.TextRenderer("jsonl", "exchanges")
    mixed = [render(r) if i % 3 == 0 else r for i, r in enumerate(rows)]
    for fmt, items in (("jsonl", mixed), ("csv", rows)):
        want, got = tmp_path / f"want.{fmt}", tmp_path / f"got.{fmt}"
        assert writers.write_rows(iter(items), "exchanges", fmt, str(want)) == n
        batches = [items[i:i + size] for i in range(0, n, size)] + [[]]
        assert writers.write_row_batches(iter(batches), "exchanges", fmt, str(got)) == n
        assert got.read_bytes() == want.read_bytes()


def test_text_of_a_batch_escapes_lone_surrogates_as_each_line_does():
    """The compiled renderer leaves a lone surrogate in its line; text() escapes the batch's
    at once, as line() does each line's (and the result is valid UTF-8)."""
    rows = _capture_rows(CAPTURES[0])["exchanges"][:3]
    for i, r in enumerate(rows):
        r.client_id = f"c{i}\udcff\ud800x"
    w = writers.JsonlWriter("exchanges", io.StringIO())
    text = w.text(rows)
    assert text == "".join(w.line(r) for r in rows)
    assert "\\udcff" in text and text.encode("utf-8")
