"""Exporters: jsonl, csv, parquet and terminal tables for the public tables.

See :mod:`kwinspect.export.writers` for the value conventions and
docs/cli.md ("Output formats") for the user-facing description.
"""

from kwinspect.export.progress import Progress, interrupted_message
from kwinspect.export.writers import (
    FORMATS,
    TABLES,
    CsvWriter,
    JsonlWriter,
    ParquetWriter,
    RowWriter,
    TableWriter,
    arrow_schema,
    default_format,
    format_from_path,
    iso_utc,
    open_writer,
    write_rows,
)

__all__ = [
    "FORMATS", "TABLES", "CsvWriter", "JsonlWriter", "ParquetWriter", "RowWriter",
    "TableWriter", "arrow_schema", "default_format", "format_from_path", "iso_utc",
    "open_writer", "write_rows", "Progress", "interrupted_message",
]
