"""The three file formats agree row for row, and pandas reads the documented columns.

Oracle: pandas' own readers (read_json lines, read_csv, read_parquet) and
pyarrow's schema reader, compared with values computed from the model rows.
"""

from __future__ import annotations

import io
import json
import os
import re
import select

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kwinspect.export import JsonlWriter, open_writer, write_rows
from kwinspect.model import ERROR_COLUMNS, EXCHANGE_COLUMNS, RECORD_COLUMNS, Exchange
from tests.export.rows import (
    ROWS,
    T0_US,
    TEXT_COLUMNS,
    canonical_frame,
    canonical_model,
    make_exchanges,
    make_records,
)

COLUMNS = {"exchanges": EXCHANGE_COLUMNS, "records": RECORD_COLUMNS, "errors": ERROR_COLUMNS}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture(params=sorted(ROWS))
def table(request: pytest.FixtureRequest) -> str:
    return request.param


def read_jsonl(path):
    return pd.read_json(path, lines=True, dtype=False, precise_float=True)


def read_csv(path, columns):
    return pd.read_csv(path, keep_default_na=False, na_values=[""],
                       dtype={c: str for c in columns if c in TEXT_COLUMNS})


def write_all(tmp_path, table, rows, **kw):
    paths = {}
    for fmt, ext in (("jsonl", "jsonl"), ("csv", "csv"), ("parquet", "parquet")):
        paths[fmt] = tmp_path / f"{table}.{ext}"
        n = write_rows(rows, table, fmt, paths[fmt], **kw)
        assert n == len(rows)
    return paths


def csv_expected(rows):
    # CSV cannot tell "" from null (documented): both read back as null.
    return [{c: (None if v == "" and c in TEXT_COLUMNS else v) for c, v in r.items()} for r in rows]


def test_formats_agree_with_each_other_and_the_model(tmp_path, table):
    rows = ROWS[table]()
    paths = write_all(tmp_path, table, rows)
    cols = list(COLUMNS[table])
    frames = {
        "jsonl": read_jsonl(paths["jsonl"]),
        "csv": read_csv(paths["csv"], cols),
        "parquet": pd.read_parquet(paths["parquet"]),
    }
    for fmt, df in frames.items():
        assert list(df.columns) == cols, fmt
        assert len(df) == len(rows), fmt
    expected = canonical_model(rows)
    assert canonical_frame(frames["jsonl"]) == expected
    assert canonical_frame(frames["parquet"]) == expected
    assert canonical_frame(frames["csv"]) == csv_expected(expected)


def test_exact_values_spot_checks(tmp_path):
    rows = make_exchanges()
    paths = write_all(tmp_path, "exchanges", rows)
    first = json.loads(paths["jsonl"].read_text(encoding="utf-8").splitlines()[0])
    assert list(first) == list(EXCHANGE_COLUMNS)
    assert first["request_ts"] == "2024-01-02T03:04:05.123456Z"
    assert first["response_ts"] == "2024-01-02T03:04:05.124956Z"
    assert first["topics"] == ["orders.v1", "payments"]
    df = pd.read_parquet(paths["parquet"])
    assert df["request_ts"][0] == pd.Timestamp(T0_US, unit="us", tz="UTC")
    # NaN latency is null, not NaN text
    lines = paths["jsonl"].read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[3])["latency_ms"] is None
    for line in lines:
        for c in ("request_ts", "response_ts"):
            v = json.loads(line)[c]
            assert v is None or ISO.match(v), v
    # CSV: lists are JSON strings in one cell, header row is the column order
    csv_text = paths["csv"].read_text(encoding="utf-8")
    assert csv_text.splitlines()[0] == ",".join(EXCHANGE_COLUMNS)
    raw = pd.read_csv(paths["csv"], dtype=str, keep_default_na=False)
    assert json.loads(raw["topics"][0]) == ["orders.v1", "payments"]
    assert json.loads(raw["error_codes"][1]) == [6, 0]
    assert raw["client_id"][3] == "NA"


def test_parquet_schema_is_explicit(tmp_path):
    for table, rows in (("exchanges", make_exchanges()), ("records", make_records())):
        path = tmp_path / f"{table}.parquet"
        write_rows(rows, table, "parquet", path)
        schema = pq.read_schema(path)
        assert schema.names == list(COLUMNS[table])
        if table == "exchanges":
            assert schema.field("request_ts").type == pa.timestamp("us", tz="UTC")
            assert schema.field("error_codes").type == pa.list_(pa.int32())
            assert schema.field("topics").type == pa.list_(pa.string())
            assert schema.field("latency_ms").type == pa.float64()
        else:
            assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
            hdr = schema.field("headers").type
            assert pa.types.is_list(hdr)
            assert [f.name for f in hdr.value_type] == ["key", "value", "value_encoding"]
            assert all(f.type == pa.string() for f in hdr.value_type)
            assert schema.field("offset").type == pa.int64()
            assert schema.field("crc_ok").type == pa.bool_()


def test_parquet_is_written_in_bounded_batches(tmp_path):
    rows = make_exchanges() * 4  # 20 rows
    path = tmp_path / "x.parquet"
    write_rows(rows, "exchanges", "parquet", path, batch_size=6)
    meta = pq.ParquetFile(path).metadata
    assert meta.num_rows == 20
    assert meta.num_row_groups == 4  # 6 + 6 + 6 + 2
    assert canonical_frame(pd.read_parquet(path)) == canonical_model(rows)


def test_empty_input_gives_readable_files(tmp_path):
    paths = write_all(tmp_path, "errors", [])
    assert paths["jsonl"].read_text() == ""
    df = read_csv(paths["csv"], ERROR_COLUMNS)
    assert list(df.columns) == list(ERROR_COLUMNS) and len(df) == 0
    pdf = pd.read_parquet(paths["parquet"])
    assert list(pdf.columns) == list(ERROR_COLUMNS) and len(pdf) == 0


def test_interrupt_leaves_valid_files(tmp_path):
    rows = make_exchanges()

    def interrupted():
        yield from rows[:3]
        raise KeyboardInterrupt

    for fmt in ("jsonl", "csv", "parquet"):
        path = tmp_path / f"cut.{fmt}"
        with pytest.raises(KeyboardInterrupt):
            write_rows(interrupted(), "exchanges", fmt, path)
    assert len(pd.read_parquet(tmp_path / "cut.parquet")) == 3
    assert len(read_jsonl(tmp_path / "cut.jsonl")) == 3
    assert len(read_csv(tmp_path / "cut.csv", EXCHANGE_COLUMNS)) == 3


def test_out_of_range_timestamps_are_null_everywhere(tmp_path):
    ex = make_exchanges()[0]
    ex.request_ts = 1e13  # year ~318857
    ex.response_ts = float("inf")
    paths = write_all(tmp_path, "exchanges", [ex])
    assert read_jsonl(paths["jsonl"])["request_ts"].isna().all()
    assert read_csv(paths["csv"], EXCHANGE_COLUMNS)["request_ts"].isna().all()
    assert pd.read_parquet(paths["parquet"])["response_ts"].isna().all()


def test_lone_surrogates_do_not_break_any_format(tmp_path):
    ex = make_exchanges()[0]
    ex.client_id = "bad\udcffbyte"
    paths = write_all(tmp_path, "exchanges", [ex])
    assert "bad" in pd.read_parquet(paths["parquet"])["client_id"][0]
    assert "bad" in read_jsonl(paths["jsonl"])["client_id"][0]


def test_dict_rows_are_accepted_and_missing_keys_are_null(tmp_path):
    path = tmp_path / "d.jsonl"
    write_rows([{"kind": "tcp_gap", "ts": 0.0}], "errors", "jsonl", path)
    obj = json.loads(path.read_text())
    assert list(obj) == list(ERROR_COLUMNS)
    assert obj["ts"] == "1970-01-01T00:00:00.000000Z"
    assert obj["code"] is None


def test_unknown_format_and_table_are_rejected():
    with pytest.raises(ValueError, match="unknown format"):
        open_writer("xml", "exchanges", io.StringIO())
    with pytest.raises(ValueError, match="unknown table"):
        open_writer("jsonl", "packets", io.StringIO())


def test_jsonl_lines_reach_a_pipe_immediately():
    """Line-buffered: each row is readable from the pipe before the writer closes."""
    r, w = os.pipe()
    try:
        out = os.fdopen(w, "w", buffering=1 << 20, encoding="utf-8")
        writer = JsonlWriter("exchanges", out)
        writer.write(make_exchanges()[0])
        ready, _, _ = select.select([r], [], [], 5)
        assert ready, "row still sitting in a buffer"
        line = os.read(r, 1 << 16).decode()
        assert line.endswith("\n") and json.loads(line)["correlation_id"] == 1
        writer.close()
        out.close()
    finally:
        os.close(r)


def test_parquet_to_a_terminal_is_refused(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", Tty())
    with pytest.raises(ValueError, match="terminal"):
        open_writer("parquet", "exchanges", None)


def test_model_rows_and_exchange_row_are_the_same(tmp_path):
    ex = Exchange(stream="s", client="c", broker="b", api_key=18, api_name="ApiVersions",
                  api_version=3, correlation_id=0, client_id="x", request_ts=None,
                  response_ts=None, latency_ms=None, request_size=None, response_size=None,
                  status="response_missing")
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_rows([ex], "exchanges", "csv", a)
    write_rows([ex.row()], "exchanges", "csv", b)
    assert a.read_text() == b.read_text()


def test_latency_rows_export_like_the_other_tables(tmp_path):
    from kwinspect.analyze.latency import LATENCY_COLUMNS, LatencyStats

    stats = LatencyStats("api").add_all(make_exchanges())
    rows = stats.rows()
    paths = {}
    for fmt in ("jsonl", "csv", "parquet"):
        paths[fmt] = tmp_path / f"lat.{fmt}"
        write_rows(rows, "latency", fmt, paths[fmt])
    frames = [read_jsonl(paths["jsonl"]), read_csv(paths["csv"], ("by", "group")),
              pd.read_parquet(paths["parquet"])]
    for df in frames:
        assert list(df.columns) == list(LATENCY_COLUMNS)
        assert df.to_dict("records") == frames[0].to_dict("records")
    assert frames[2]["group"].tolist() == ["Fetch", "Metadata", "Produce", "(all)"]  # busiest first, then by name
    assert frames[2]["p99_ms"].tolist() == [500.998, 0.1, 1.5, 500.998]
