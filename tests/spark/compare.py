"""Row-for-row comparison of the pipeline's tables with the single-process exporters' output."""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kwinspect.dissect import DissectConfig
from kwinspect.export.tables import records_of
from kwinspect.export.writers import ParquetWriter, arrow_schema, columns_of
from kwinspect.model import ErrorRow, Exchange
from kwinspect.run.files import FileRun, dissect_files


def single_process_tables(paths: list[str], out_dir: str, config: DissectConfig | None = None,
                          values: str = "auto") -> dict[str, str]:
    """dissect_files + the Parquet exporter, as `kwinspect exchanges|records|errors -F parquet` do."""
    os.makedirs(out_dir, exist_ok=True)
    files = {t: os.path.join(out_dir, f"{t}.parquet") for t in ("exchanges", "records", "errors")}
    writers = {t: ParquetWriter(t, p) for t, p in files.items()}
    run = FileRun()
    try:
        for ev in dissect_files(paths, config, run=run):
            if isinstance(ev, Exchange):
                writers["exchanges"].write(ev)
                for rec in records_of(ev, values, run.dissector.shared.topic_names):
                    writers["records"].write(rec)
            elif isinstance(ev, ErrorRow):
                writers["errors"].write(ev)
    finally:
        for w in writers.values():
            w.close()
    return files


def read_pipeline_table(out_dir: str, table: str) -> pa.Table:
    """A pipeline table without its partition columns, cast to the exporter's schema."""
    path = os.path.join(out_dir, table)
    files = sorted(f.path for f in ds.dataset(path, format="parquet").get_fragments())
    schema = arrow_schema(table)
    parts = [pq.read_table(f).select(list(columns_of(table))) for f in files]
    if not parts:
        return schema.empty_table()
    return pa.concat_tables([p.cast(schema) for p in parts])


def _key(row: tuple) -> str:
    return json.dumps(row, default=str, sort_keys=True)


def rows(table: pa.Table) -> Counter:
    cols = table.column_names
    return Counter(_key(tuple(r[c] for c in cols)) for r in table.to_pylist())


def diff(expected: pa.Table, got: pa.Table, limit: int = 5) -> str:
    e, g = rows(expected), rows(got)
    missing = list((e - g).elements())[:limit]
    extra = list((g - e).elements())[:limit]
    return (f"{expected.num_rows} expected rows, {got.num_rows} pipeline rows\n"
            f"missing from the pipeline: {missing}\nonly in the pipeline: {extra}")


def _without_capture_wide(table: pa.Table) -> pa.Table:
    """The table with frame/response_frame/tcp_stream nulled: the pipeline leaves them null
    (a task sees one connection, not the capture's packet order)."""
    for name in ("frame", "response_frame", "tcp_stream"):
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, table.schema.field(i), pa.nulls(table.num_rows, table.schema.field(i).type))
    return table


def compare(expected_file: str, out_dir: str, table: str) -> tuple[bool, str]:
    expected = pq.read_table(expected_file)
    got = read_pipeline_table(out_dir, table)
    assert expected.schema.equals(arrow_schema(table)), expected.schema
    assert all(v is None for name in ("frame", "response_frame", "tcp_stream") if name in got.column_names
               for v in got.column(name).to_pylist())
    expected = _without_capture_wide(expected)
    ok = rows(expected) == rows(got)
    return ok, "" if ok else diff(expected, got)
