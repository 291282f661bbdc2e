"""The compiled row renderer (export/_crender.c) against the writers' Python paths.

Reference: the general path (normalize_row + json.JSONEncoder), which the generated
Python function already equals (test_fast_rows.py). Rows whose every value the C
renders must come out of the C itself (a fallback that fails the test proves it) and
equal the general path; any other row must reach the Python function and give what
it gives, an exception included.
"""

from __future__ import annotations

import io
import json

import pytest
from helpers.cores import require_compiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.export import fastrender, writers
from kwinspect.model import ERROR_COLUMNS, EXCHANGE_COLUMNS, RECORD_COLUMNS

COLUMNS = {"exchanges": EXCHANGE_COLUMNS, "records": RECORD_COLUMNS, "errors": ERROR_COLUMNS}


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


def general_line(table: str, row: dict, columns) -> str:
    """The line JsonlWriter writes for `row` the general way (no fast path at all)."""
    buf = io.StringIO()
    w = writers.JsonlWriter(table, buf, columns=columns)
    w._fast.values = lambda item: None  # noqa: SLF001 - the reference path, on purpose
    w._fast.line_of = None  # noqa: SLF001 - nor the C renderer reading the row's slots
    w.write(row)
    return buf.getvalue()


def c_renderer(columns, fallback):
    kinds = bytes(1 if c in writers.TIMESTAMP_COLUMNS else 2 if c in writers.LIST_COLUMNS else 0
                  for c in columns)
    prefixes = tuple(("{" if i == 0 else ", ") + json.dumps(c) + ": " for i, c in enumerate(columns))
    return fastrender.JsonlRow(kinds, prefixes, "}\n", fallback)


def _no_fallback(values):
    raise AssertionError(f"the C handed this row to Python: {values!r}")


# every kind of value the C renders itself: controls, quotes, backslashes, non-ASCII
# (2-, 3- and 4-byte UTF-8), ints past 64 bits, non-finite floats, bytes
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.text(
    alphabet=st.sampled_from(['"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1b", "\x1f", "\x7f",
                              "é", "日", "\U0001f600", "\u2028", "a", " "]), max_size=300)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(1 << 90), max_value=1 << 90),
                     st.sampled_from([0, -1, 9, 10, -10, (1 << 63) - 1, -(1 << 63), 1 << 63, -(1 << 63) - 1]),
                     st.floats(allow_nan=True, allow_infinity=True), _text, st.binary(max_size=12))
_header = st.fixed_dictionaries({"key": _scalars, "value": _scalars,
                                 "value_encoding": st.one_of(st.none(), st.sampled_from(["utf8", "hex"]))})
_lists = st.one_of(st.none(), st.lists(_scalars, max_size=4), st.lists(_header, max_size=3))
# inside years 1..9999 (the edges too), whole seconds, half microseconds (round half to even)
_ts = st.one_of(st.none(), st.floats(min_value=-62135596798.0, max_value=253402300797.0),
                st.integers(min_value=-62135596798, max_value=253402300797).map(float),
                st.integers(min_value=0, max_value=4_000_000_000 * 2_000_000).map(lambda n: n / 2_000_000),
                st.sampled_from([0.0, -0.0, 1e-7, -1e-7, 951782400.0, 1709164800.5, 4102444800.0]))


def _value(column: str):
    if column in writers.TIMESTAMP_COLUMNS:
        return _ts
    if column in writers.LIST_COLUMNS:
        return _lists
    return _scalars


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(sorted(COLUMNS)), data=st.data())
def test_rows_the_c_renders_equal_the_general_path(table, data):
    columns = COLUMNS[table]
    row = data.draw(st.fixed_dictionaries({c: _value(c) for c in columns}))
    line = c_renderer(columns, _no_fallback)(tuple(row[c] for c in columns))
    assert line == general_line(table, row, columns)


# values only the Python paths know: lone surrogates, subclasses, other types, timestamps
# that are ints or outside years 1..9999, a dict in a list of scalars
_odd = st.sampled_from(["\udcff", "a\ud800b", True.__class__, 1.5j, (1, 2), bytearray(b"\x01"), {"a": 1},
                        type("Sub", (str,), {})("s"), type("I", (int,), {})(3), float("nan")])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(sorted(COLUMNS)), data=st.data())
def test_other_rows_go_to_the_python_function_and_give_what_it_gives(table, data):
    columns = COLUMNS[table]
    row = data.draw(st.fixed_dictionaries({c: _value(c) for c in columns}))
    odd = data.draw(st.sampled_from(columns))
    row[odd] = data.draw(st.one_of(_odd, st.lists(_odd, min_size=1, max_size=2),
                                   st.integers(min_value=-(1 << 70), max_value=1 << 70), st.just(1e300)))
    values = tuple(row[c] for c in columns)
    python = writers._compile_fast(columns, "jsonl", newline=True)  # noqa: SLF001 - the reference
    try:
        want = python(values)
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the C must raise too
        with pytest.raises(type(exc)):
            c_renderer(columns, python)(values)
    else:
        assert c_renderer(columns, python)(values) == want


def test_a_writer_renders_with_the_c():
    """What JsonlWriter uses when the compiled core is there."""
    assert type(writers.JsonlWriter("exchanges", io.StringIO())._fast.jsonl_nl) is fastrender.JsonlRow  # noqa: SLF001


def test_bad_construction_is_refused():
    with pytest.raises(ValueError):
        fastrender.JsonlRow(b"\x00\x01", ("{\"a\": ",), "}", _no_fallback)  # a prefix short
    with pytest.raises(ValueError):
        fastrender.JsonlRow(b"\x07", ("{\"a\": ",), "}", _no_fallback)  # unknown kind
    with pytest.raises(ValueError):
        fastrender.JsonlRow(b"\x00", ("{\"é\": ",), "}", _no_fallback)  # not ASCII
    row = fastrender.JsonlRow(b"\x00", ("{\"a\": ",), "}", lambda v: "python")
    assert row((1,)) == '{"a": 1}'
    assert row((1, 2)) == "python" and row([1]) == '{"a": 1}' and row("x") == "python"


def test_a_huge_value_then_small_rows():
    """A row past the buffer the renderer keeps between rows (1 MiB), with every kind of
    escape and non-ASCII text in it, then ordinary rows: each equal to the general path."""
    columns = RECORD_COLUMNS
    render = c_renderer(columns, _no_fallback)
    plain = dict.fromkeys(columns)
    plain.update(topic="t", partition=0, offset=1, timestamp=1.5, key="k")
    huge = dict(plain, value=('ab"\\\n\x01é日\U0001f600' * 150_000), key="\x1f" * 300_000)
    for row in (plain, huge, plain, dict(plain, value="v" * 2_000_000), plain):
        assert render(tuple(row[c] for c in columns)) == general_line("records", row, columns)


def test_line_of_reads_a_model_row_from_its_slots():
    """JsonlWriter renders a model row straight from its slots (no tuple of values): the
    same line as the general path, the generated function's for a value the C leaves to
    it, and None for anything but the bound type (the writer's other paths take it)."""
    from kwinspect.model import Exchange

    ex = Exchange("a->b", "a", "b", 3, "Metadata", 12, 7, "cl\u00e9nt \"x\"", 1_700_000_000.25, 1_700_000_000.5,
                  250.0, 40, 90, "paired", [0, 3], ["NONE", "UNKNOWN_TOPIC_OR_PARTITION"], ["t\n1"], None)
    w = writers.JsonlWriter("exchanges", io.StringIO())
    line_of = w._fast.line_of  # noqa: SLF001
    assert line_of is not None
    assert line_of(ex) == general_line("exchanges", ex, None)
    assert line_of(ex.row()) is None and line_of("x") is None

    class Text(str):  # a subclass: the C hands the row to the generated function, which
        pass           # leaves it to the general path (_Slow); the writer's line is that

    ex.client_id = Text("sub")
    with pytest.raises(writers._Slow):  # noqa: SLF001
        line_of(ex)
    assert w.line(ex) == general_line("exchanges", ex, None)
    with pytest.raises(TypeError):
        c_renderer(("stream", "nope"), _no_fallback).bind(Exchange, ("stream", "nope"))


def test_escapes_at_every_place_of_a_word():
    """Strings are scanned and copied 8 bytes at a time where no byte needs escaping: each
    character that must be escaped (and the bytes around the tests' thresholds), at every
    offset of strings of 0-26 characters, with ASCII and multi-byte text around it."""
    columns = ("v",)
    render = c_renderer(columns, _no_fallback)
    specials = ['"', "\\", "\n", "\x00", "\x1f", " ", "!", "#", "[", "]", "\x7f", "é", "日", "\U0001f600"]
    for fill in ("a", "é", "~"):
        for n in range(27):
            for at in range(n):
                for ch in specials:
                    text = fill * at + ch + fill * (n - at - 1)
                    assert render((text,)) == general_line("exchanges", {"v": text}, columns), (fill, n, at, ch)


def test_floats_of_three_decimals_are_repr_s_digits():
    """Values of at most 3 decimals (latencies) are written without repr's digit search:
    the same text as repr, from 0.001 to near 1e11, both signs, every last-digit pattern,
    and values just beside them (more digits: repr's own path)."""
    import random

    render = c_renderer(("v",), _no_fallback)
    rnd = random.Random(22)
    values = [0.001, 0.01, 0.1, 0.5, 1.0, 12.0, 0.496, 0.94, 100.25, 99999999999.999, 1e11, 1e11 - 0.001,
              123456.789, 0.0, -0.0, 5e-324, 1e-4, 2 ** 52 + 0.5]
    for scale in (1, 10, 1_000, 1_000_000, 10 ** 9, 10 ** 11, 10 ** 14):
        for _ in range(3000):
            k = rnd.randrange(-scale * 1000, scale * 1000)
            values += [k / 1000, round(k / 1000 + rnd.random() / 1000, 3), k / 1000 + rnd.random() / 1000,
                       float.fromhex(float.hex(k / 1000)) * (1 + 2 ** -52)]
    for v in values:
        assert render((v,)) == '{"v": ' + repr(v) + "}\n", v
