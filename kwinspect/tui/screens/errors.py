"""Errors and anomalies: Kafka error codes and everything the dissector flagged."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import KAFKA_ERROR, ErrorRow
from kwinspect.protocol.errors import error_description
from kwinspect.tui.store import ExchangeStore

MAX_SHOWN = 20_000


def _clock(ts: float | None) -> str:
    if ts is None:
        return ""
    try:
        d = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return "?"
    return d.strftime("%H:%M:%S.") + f"{d.microsecond // 1000:03d}"


class ErrorsScreen(Screen[ErrorRow | None]):
    """Enter on a row dismisses with that ErrorRow; the app jumps to its exchange."""

    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("enter", "jump", "Go to exchange"),
    ]

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__()
        self.store = store
        self.shown: list[ErrorRow] = []

    def compose(self) -> ComposeResult:
        yield Static(id="errors-title")
        yield DataTable(id="errors", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        store = self.store
        with store.lock:  # (the packed rows: only the shown ones are made into ErrorRows)
            held = len(store.errors)
            self.shown = store.errors[:MAX_SHOWN]
            kinds = store.errors.label_counts(KAFKA_ERROR)
        top = ", ".join(f"{term_safe(k, 40)} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:8])
        more = f" (showing the first {MAX_SHOWN:,})" if held > MAX_SHOWN else ""
        dropped = f", {store.errors_dropped:,} dropped to bound memory" if store.errors_dropped else ""
        self.query_one("#errors-title", Static).update(
            Text.assemble((f"Errors and anomalies: {store.error_count:,}{more}{dropped}", "bold"),
                          "  " + top + "\nEnter: go to the exchange · Esc: back"))
        table = self.query_one("#errors", DataTable)
        for col in ("time", "kind", "error", "api", "corr", "topic/partition", "connection", "message"):
            table.add_column(col)
        for e in self.shown:
            is_err = e.kind == KAFKA_ERROR
            # a topic-level error has no partition: show the topic alone, never "topic/None"
            where = "" if e.topic is None else e.topic if e.partition is None else f"{e.topic}/{e.partition}"
            table.add_row(
                _clock(e.ts),
                Text(term_safe(e.kind, 30), style="red" if not is_err else ""),
                Text(term_safe(f"{e.name or ''}" + (f" ({e.code})" if e.code is not None else ""), 50),
                     style="bold red" if is_err else ""),
                term_safe(e.api_name, 30), "" if e.correlation_id is None else str(e.correlation_id),
                term_safe(where, 60), term_safe(e.stream, 60), term_safe(_message(e), 160),
            )
        table.focus()

    def action_jump(self) -> None:
        table = self.query_one("#errors", DataTable)
        if 0 <= table.cursor_row < len(self.shown):
            self.dismiss(self.shown[table.cursor_row])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_jump()

    def action_close(self) -> None:
        self.dismiss(None)


def _message(e: ErrorRow) -> str | None:
    """The row's message; for a broker's error code, the broker's own description of it."""
    if e.message or e.kind != KAFKA_ERROR or e.code is None:
        return e.message
    return error_description(e.code)
