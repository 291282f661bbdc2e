"""The virtualized exchange list: a Line API widget that renders only visible rows.

Nothing per row lives in widgets: ``render_line(y)`` reads the store's columns
for the row at ``scroll_y + y`` of the current view, so a million-row capture
costs the same to draw as a ten-row one.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kwinspect.analyze.termsafe import term_safe
from kwinspect.tui.store import ExchangeStore

# (title, width, right-aligned), in display order. A narrow terminal shows only the
# columns that fit, taken by PRIORITY, so 80x24 keeps No., time, API, latency and status.
COLUMNS = (
    ("No.", 7, True), ("Time (UTC)", 12, False), ("Client -> Broker", 44, False),
    ("API", 20, False), ("Corr", 7, True), ("Latency", 9, True), ("Status", 22, False),
    ("Req B", 8, True), ("Resp B", 8, True), ("Topics", 12, False),
)
PRIORITY = (0, 1, 3, 5, 6, 4, 2, 9, 7, 8)
# Columns that may grow into what is left of the width (the last shown one does).
FLEXIBLE = (9, 6, 3)
S_NORMAL = Style()
S_DIM = Style(dim=True)
S_ERR = Style(color="red", bold=True)
S_WARN = Style(color="yellow")
S_SLOW = Style(color="magenta")
S_CURSOR = Style(reverse=True)
S_CURSOR_BLUR = Style(bgcolor="grey30")


def layout(width: int) -> list[tuple[int, int]]:
    """(column index, width) of the columns shown in ``width`` cells, in display order."""
    chosen: set[int] = set()
    used = 0
    for i in PRIORITY:
        w = COLUMNS[i][1] + 1  # one space after every cell
        if used + w <= width or not chosen:
            chosen.add(i)
            used += w
    shown = [[i, COLUMNS[i][1]] for i in sorted(chosen)]
    spare = width - used
    if spare > 0:
        for i in FLEXIBLE:
            if i in chosen:
                next(c for c in shown if c[0] == i)[1] += spare
                break
    return [(i, w) for i, w in shown]


def header_text(width: int = 200) -> str:
    return " ".join(_fit(COLUMNS[i][0], w) for i, w in layout(width))


def _fit(text: str, width: int, right: bool = False) -> str:
    if width <= 0:
        return text
    if len(text) > width:
        return text[: width - 1] + "…"
    return text.rjust(width) if right else text.ljust(width)


def _clock(ts: float) -> str:
    if ts != ts:  # NaN
        return ""
    try:
        d = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return "?"
    return d.strftime("%H:%M:%S.") + f"{d.microsecond // 1000:03d}"


def _size(v: int | None) -> str:
    if v is None:
        return ""
    if v < 100_000:
        return str(v)
    if v < 10_000_000:
        return f"{v / 1024:.0f}K"
    return f"{v / 1048576:.0f}M"


def row_cells(store: ExchangeStore, row: int) -> list[tuple[str, Style]]:
    """The visible cells of one row, already terminal-safe."""
    p = store.pos(row)
    c = store.cols
    stream = store.stream_ends.get(c["stream"][p])
    ends = f"{stream[0]} -> {stream[1]}" if stream else store.strings[c["stream"][p]]
    key, ver = c["api_key"][p], c["api_version"][p]
    api = store.api_label(row) + (f" v{ver}" if ver >= 0 else "")
    cid = store.int_cell("cid", row)
    lat = c["lat"][p]
    st = store.status(row)
    errs = store.tuples[c["err_names"][p]]
    if errs:
        status, sstyle = ",".join(dict.fromkeys(errs)), S_ERR
    elif st == "paired":
        status, sstyle = "ok", S_DIM
    elif st == "no_response_expected":
        status, sstyle = "no response (acks=0)", S_DIM
    else:
        status, sstyle = st, S_WARN
    lat_text = "" if lat != lat else (f"{lat:.2f}" if lat < 1000 else f"{lat:.0f}")
    topics = ",".join(store.tuples[c["topics"][p]])
    del key
    return [
        (str(row + 1), S_DIM),  # No.: the row's place in capture order
        (_clock(c["ts"][p]), S_NORMAL),
        (term_safe(ends, 60), S_NORMAL),
        (term_safe(api, 40), S_NORMAL),
        ("" if cid is None else str(cid), S_DIM),
        (lat_text, S_SLOW if lat == lat and lat >= 100 else S_NORMAL),
        (term_safe(status, 60), sstyle),
        (_size(store.int_cell("req_size", row)), S_DIM),
        (_size(store.int_cell("resp_size", row)), S_DIM),
        (term_safe(topics, 200), S_NORMAL),
    ]


class ExchangeList(ScrollView, can_focus=True):
    """Rows of the current view; arrow keys, page keys, mouse; follows the tail."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown,space", "page(1)", "Page down", show=False),
        Binding("home,g", "home", "First", show=False),
        Binding("end,G", "end", "Last / follow", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    DEFAULT_CSS = """
    ExchangeList { height: 1fr; overflow-x: auto; overflow-y: scroll; }
    """

    class Highlighted(Message):
        """The cursor moved to another exchange (``row`` is an absolute store row id)."""

        def __init__(self, row: int | None) -> None:
            super().__init__()
            self.row = row

    class Resized(Message):
        """The list's width changed: the header shows the columns that now fit."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.width = width

    class Selected(Message):
        """Enter or a click on an exchange: open its detail."""

        def __init__(self, row: int) -> None:
            super().__init__()
            self.row = row

    def __init__(self, store: ExchangeStore, follow: bool = True, **kw) -> None:
        super().__init__(**kw)
        self.store = store
        self.rows: np.ndarray | None = None  # None: every row of the store in capture order
        self.cursor = 0
        self.follow = follow  # keep the cursor on the last row as rows arrive
        self._last_highlight: int | None = None
        self._n = 0  # store rows shown (identity view), updated in data_changed()

    # -- data ------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self._n if self.rows is None else len(self.rows)

    def row_at(self, i: int) -> int | None:
        if i < 0 or i >= self.count:
            return None
        return self.store.first + i if self.rows is None else int(self.rows[i])

    @property
    def current_row(self) -> int | None:
        return self.row_at(self.cursor)

    def set_rows(self, rows: np.ndarray | None, keep_row: int | None = None) -> None:
        """Show another view; keep the cursor on ``keep_row`` when it is still there."""
        self.rows = rows
        if rows is None:
            self._n = len(self.store)
        if keep_row is not None:
            idx = self.index_of(keep_row)
            self.cursor = idx if idx is not None else 0
        self._clamp()
        self.data_changed()

    def index_of(self, row: int) -> int | None:
        if self.rows is None:
            i = row - self.store.first
            return i if 0 <= i < self._n else None
        hits = np.nonzero(self.rows == row)[0]
        return int(hits[0]) if len(hits) else None

    def data_changed(self) -> None:
        """Rows were added or the view changed: resize, follow the tail, redraw."""
        if self.rows is None:
            old_first = getattr(self, "_first", self.store.first)
            self._n = len(self.store)
            self._first = self.store.first
            if not self.follow and self._first != old_first:  # live trimming shifted the rows
                self.cursor -= self._first - old_first
        self.virtual_size = Size(self.size.width, self.count)
        if self.follow and self.count:
            self.cursor = self.count - 1
            self.scroll_to(y=max(0, self.count - self.size.height), animate=False, immediate=True)
        self._clamp()
        self.refresh()
        self._post_highlight()

    def _clamp(self) -> None:
        self.cursor = max(0, min(self.cursor, self.count - 1)) if self.count else 0

    # -- rendering -------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        i = scroll_y + y
        width = self.size.width
        row = self.row_at(i)
        if row is None or not self.store.has(row):
            return Strip.blank(width, self.rich_style)
        cells = row_cells(self.store, row)
        segs = []
        for n, w in layout(self.content_width):
            text, style = cells[n]
            segs.append(Segment(_fit(text, w, COLUMNS[n][2]) + " ", style))
        strip = Strip(segs)
        if i == self.cursor:
            strip = strip.apply_style(S_CURSOR if self.has_focus else S_CURSOR_BLUR)
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)

    # -- movement --------------------------------------------------------------------

    def move_to(self, i: int) -> None:
        old = self.cursor
        self.cursor = i
        self._clamp()
        self.follow = self.count > 0 and self.cursor == self.count - 1
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False, immediate=True)
        for line in (old, self.cursor):
            self.refresh(Region(0, line - int(self.scroll_offset.y), self.size.width, 1))
        self.refresh()
        self._post_highlight()

    def _post_highlight(self) -> None:
        row = self.current_row
        if row != self._last_highlight:
            self._last_highlight = row
            self.post_message(self.Highlighted(row))

    def action_cursor(self, delta: int) -> None:
        self.move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self.move_to(self.cursor + direction * max(1, self.size.height - 1))

    def action_home(self) -> None:
        self.move_to(0)

    def action_end(self) -> None:
        self.move_to(self.count - 1)

    def action_select(self) -> None:
        row = self.current_row
        if row is not None:
            self.post_message(self.Selected(row))

    def on_click(self, event: events.Click) -> None:
        i = int(self.scroll_offset.y) + event.y
        if 0 <= i < self.count:
            self.move_to(i)
            if getattr(event, "chain", 1) >= 2:  # double click opens the detail
                self.action_select()

    @property
    def content_width(self) -> int:
        """Cells available for the columns (the vertical scrollbar takes its share)."""
        return max(1, self.scrollable_content_region.width - 1)

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(event.size.width, self.count)
        self.post_message(self.Resized(self.content_width))

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # scrolling away from the tail (wheel, scrollbar) stops following; a view that
        # shrank (clamped to its new bottom) does not
        if new_value < old_value and self.follow and new_value < self.max_scroll_y - 1:
            self.follow = False
