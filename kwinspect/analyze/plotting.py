"""Writing matplotlib figures as .png, .svg or a self-contained .html page: the machinery
`kwinspect latency --plot` and `kwinspect stats --plot` share (docs/cli.md says why
matplotlib and why the page has no script).
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

PLOT_SUFFIXES = (".png", ".svg", ".html", ".htm")
MAX_LINES = 8  # more groups than this share one grey "other"
OTHER_COLOUR = "#9a9a9a"


def plot_path(path: str | os.PathLike[str]) -> Path:
    """The path, after checking its extension names a plot type (ValueError otherwise)."""
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"cannot tell the plot type of {str(path)!r}: use .png, .svg or .html")
    return path


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise RuntimeError("plots need matplotlib: pip install 'kwinspect[plot]'") from None


def svg_data_uri(fig: Any) -> str:
    """The figure as an SVG ``data:`` URI: as an <img> it can run no script and load nothing."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def save_figure(fig: Any, path: Path, html_page: Callable[[str], str]) -> Path:
    """Write ``fig`` as the extension says; ``html_page(svg_uri)`` makes the .html page."""
    suffix = path.suffix.lower()
    if suffix == ".png":
        fig.savefig(path, format="png", dpi=110)
    elif suffix == ".svg":
        fig.savefig(path, format="svg")
    else:
        path.write_text(html_page(svg_data_uri(fig)), encoding="utf-8")
    return path


def html_page(title: str, note: str, head: list[str], rows: list[tuple[list[str], bool]],
              svg_uri: str, alt: str) -> str:
    """A static page: title, a note, a table (``head`` cells; rows of (cells, bold)), the figure.
    Cells and head are escaped here; ``note`` is HTML the caller wrote."""
    head_html = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for cells, bold in rows:
        cls = ' class="total"' if bold else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; }}
td:not(:first-child), th:not(:first-child) {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.total td {{ font-weight: bold; }}
img {{ max-width: 100%; }}
.note {{ color: #666; font-size: 0.9em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="note">{note}</p>
<table><thead><tr>{head_html}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
<img alt="{html.escape(alt)}" src="{svg_uri}">
</body></html>
"""


def top_groups(totals: dict[str, float]) -> list[str]:
    """The busiest MAX_LINES groups, by total, then name (the rest are drawn as one "other")."""
    return sorted(totals, key=lambda g: (-totals[g], g))[:MAX_LINES]


__all__ = ["MAX_LINES", "PLOT_SUFFIXES", "html_page", "plot_path", "require_matplotlib", "save_figure",
           "svg_data_uri", "top_groups"]
