"""Terminal tables never pass control characters or ANSI escapes from the wire."""

from __future__ import annotations

import io
import re

from rich.console import Console

from kwinspect.analyze.termsafe import term_safe
from kwinspect.export import TableWriter, write_rows
from tests.export.rows import make_errors, make_exchanges, make_records

SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colour codes
EVIL = "\x1b[2J\x1b]52;c;ZXZpbA==\x07\r\x08\x9b31m\u202eevil\u2066"


def render(table, rows, *, terminal, columns=None, width=160):
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=terminal, color_system="standard"
                      if terminal else None, highlight=False, markup=False)
    w = TableWriter(table, console=console, columns=columns, chunk_size=2)
    w.write_all(rows)
    w.close()
    return buf.getvalue()


def _assert_clean(text):
    body = SGR.sub("", text)
    bad = [c for c in body if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F
           or c in "\u202e\u2066"]
    assert not bad, f"unescaped control characters: {bad!r}"


def test_every_cell_is_escaped_on_a_real_terminal():
    exs = make_exchanges()
    for ex in exs:
        ex.client_id = f"id{EVIL}"
        ex.topics = [f"t{EVIL}"]
        ex.broker = f"b{EVIL}"
    for terminal in (True, False):
        out = render("exchanges", exs, terminal=terminal)
        _assert_clean(out)
        assert "\\x1b[2J" in out  # shown, escaped


def test_records_and_errors_tables_are_escaped_too():
    recs = make_records()
    for r in recs:
        r.key = EVIL
        r.value = EVIL
        r.headers = [{"key": EVIL, "value": EVIL, "value_encoding": "utf8"}]
        r.topic = EVIL
    _assert_clean(render("records", recs, terminal=True))
    errs = make_errors()
    for e in errs:
        e.message = EVIL
        e.stream = EVIL
    _assert_clean(render("errors", errs, terminal=True))


def test_wide_values_are_cut_and_lines_fit_the_width():
    recs = make_records()
    recs[0].value = "v" * 100_000
    out = render("records", recs, terminal=False, width=120)
    assert "…" in out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "v" * 200 not in out


def test_chunks_keep_one_header_and_all_rows():
    exs = make_exchanges() * 3  # 15 rows, chunk_size 2
    out = render("exchanges", exs, terminal=False, width=250)
    assert out.count("api_name") == 1
    assert sum(1 for line in out.splitlines() if "10.0.0.2:9092" in line) == 15


def test_default_columns_and_explicit_columns():
    out = render("exchanges", make_exchanges()[:1], terminal=False, width=250,
                 columns=("api_name", "latency_ms"))
    header = out.splitlines()[0].split()
    assert header == ["api_name", "latency_ms"]
    assert "1.500" in out


def test_table_to_a_stream_without_console():
    buf = io.StringIO()
    write_rows(make_errors(), "errors", "table", buf)
    text = buf.getvalue()
    assert "NOT_LEADER_OR_FOLLOWER" in text and "tcp_gap" in text
    _assert_clean(text)


def test_term_safe_rules():
    assert term_safe("plain é 日本") == "plain é 日本"
    assert term_safe("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert term_safe("\x1b[31m") == "\\x1b[31m"
    assert term_safe("\x9b") == "\\x9b"
    assert term_safe("\u202e") == "\\u202e"
    assert term_safe("\udcff") == "\\udcff"
    assert term_safe(None) == ""
    assert term_safe("x" * 50, 10) == "x" * 9 + "…"
    assert len(term_safe("\x00" * 1000, 20)) == 20


def test_narrow_terminal_drops_columns_instead_of_mangling_headers():
    for table, rows in (("exchanges", make_exchanges()), ("records", make_records()),
                        ("errors", make_errors())):
        out = render(table, rows, terminal=False, width=80)
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80
        assert "…" not in lines[0], lines[0]  # headers stay whole
        assert len(lines[0].split()) >= 5


def test_explicit_columns_are_never_dropped():
    cols = ("stream", "client", "broker", "api_name", "client_id", "topics", "status")
    out = render("exchanges", make_exchanges(), terminal=False, width=60, columns=cols)
    header = out.splitlines()[0]
    assert len(header.split()) == len(cols)
