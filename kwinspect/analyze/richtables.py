"""Fitting rich tables to the terminal: numbers whole, text gives way.

Shared by `summary` and `latency`, whose tables are rich Tables (the row tables
of exchanges/records/errors are laid out by export.writers.TableWriter).
"""

from __future__ import annotations

from typing import Any


def fit_to_width(table: Any, width: int) -> None:
    """Numbers (right-aligned columns) keep their widest cell: on a narrow terminal the
    text columns give way instead, widest first, cut with … (never a count or a latency)."""
    from rich.text import Text

    def natural(col: Any) -> int:
        return max([len(str(col.header))] + [c.cell_len if isinstance(c, Text) else len(str(c))
                                              for c in col.cells])

    widths = [natural(c) for c in table.columns]
    for col, w in zip(table.columns, widths, strict=True):
        if col.justify == "right":
            col.min_width = w
    excess = sum(widths) + 3 * (len(widths) - 1) - width  # padding and the header rule
    text_cols = sorted((i for i, c in enumerate(table.columns) if c.justify != "right"),
                       key=lambda i: -widths[i])
    while excess > 0 and text_cols:
        i = max(text_cols, key=lambda k: widths[k])
        floor = max(len(str(table.columns[i].header)), 6)
        if widths[i] <= floor:
            text_cols.remove(i)
            continue
        widths[i] -= 1
        excess -= 1
        table.columns[i].max_width = widths[i]
