"""Write the TUI's current view as jsonl or csv: the `exchanges` table, written by the
same writers as `kwinspect exchanges -F jsonl|csv` (export/writers.py), so a view and
the command's output have the same bytes for the same rows.

Rows come from the compact store as plain dicts, so exporting a million-row view
never builds a million Exchange objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from kwinspect.export.writers import format_from_path, open_writer
from kwinspect.tui.store import ExchangeStore

EXPORT_FORMATS = ("jsonl", "csv")


def format_of(path: str) -> str | None:
    """The export format a file name asks for, None for anything but jsonl or csv."""
    fmt = format_from_path(path)
    return fmt if fmt in EXPORT_FORMATS else None


def write_view(store: ExchangeStore, rows: Iterable[int], path: str | os.PathLike[str],
               fmt: str | None = None, progress: Callable[[int], None] | None = None) -> int:
    """Write the rows (absolute ids) to ``path``; returns how many were written.
    The file appears whole or not at all (written beside it, then renamed)."""
    path = os.fspath(path)
    fmt = fmt or format_of(path)
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"{path}: use a .jsonl or .csv file name")
    n = 0
    tmp = path + ".part"
    with open_writer(fmt, "exchanges", tmp) as writer:
        for row in rows:
            if not store.has(row):
                continue
            writer.write(store.row_dict(row))
            n += 1
            if progress is not None and n % 50_000 == 0:
                progress(n)
    os.replace(tmp, path)
    return n
