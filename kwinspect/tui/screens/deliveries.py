"""Deliveries (`J`): every acknowledged record and its journey; Enter jumps to a step's exchange.

The rows are the `kwinspect deliveries` table (analyze.deliveries), made by the
indexer's Diagnoser and published in ``store.deliveries`` when indexing ends (the
join needs the whole capture). Pick a record on the left; the right side lists its
journey: produce, acknowledgment, every Fetch that returned it, the first commit
that covered it, with capture times and the time since the produce.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import ErrorRow, plural
from kwinspect.tui.screens.diagnosis import _clock, evidence_row
from kwinspect.tui.store import ExchangeStore

MAX_LISTED = 100_000  # records listed (the table is bounded by the tracker's cap anyway)


def journey(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of one record: what happened, when, who, and the exchange (stream, correlation id)."""
    sent, ack = row.get("produce_ts"), row.get("ack_ts")
    produce = {"stream": row.get("produce_stream"), "correlation_id": row.get("produce_correlation_id"),
               "api_name": "Produce"}
    attempts = row.get("produce_attempts") or 1
    steps = [dict(produce, step="produce", ts=sent, who=row.get("producer_client_id"),
                  what=f"attempt {attempts}, after {row['error']}" if row.get("error") else "")]
    steps.append(dict(produce, step="ack", ts=ack, who=row.get("producer_client_id"),
                      what=f"offset {row.get('offset')}"))
    for n, (client, group, stream, cid, after) in enumerate(zip(
            row.get("fetch_clients") or [], row.get("fetch_groups") or [], row.get("fetch_streams") or [],
            row.get("fetch_correlation_ids") or [], row.get("fetch_after_ms") or [], strict=False)):
        ts = None if ack is None or after is None else ack + after / 1000.0
        steps.append({"step": f"fetch {n + 1}", "ts": ts, "who": client, "what": f"group {group}" if group else "",
                      "stream": stream, "correlation_id": cid, "api_name": "Fetch"})
    if row.get("commit_ts") is not None:
        steps.append({"step": "commit", "ts": row["commit_ts"], "who": row.get("commit_group"),
                      "what": f"offset {row.get('commit_offset')}", "stream": None, "correlation_id": None,
                      "api_name": None})
    return steps


class DeliveriesScreen(Screen[ErrorRow | None]):
    """Dismisses with the chosen step's exchange (as an ErrorRow); the app jumps to it."""

    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("enter", "jump", "Go to exchange"),
    ]
    DEFAULT_CSS = """
    DeliveriesScreen #dlv-body { height: 1fr; }
    DeliveriesScreen #records { width: 50%; height: 1fr; }
    DeliveriesScreen #dlv-side { width: 50%; height: 1fr; }
    DeliveriesScreen #journey-head { height: auto; padding: 0 1; }
    DeliveriesScreen #steps { height: 1fr; }
    """

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__()
        self.store = store
        self.rows: list[dict[str, Any]] | None = None
        self.current: dict[str, Any] | None = None
        self.steps: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Static(id="dlv-title")
        with Horizontal(id="dlv-body"):
            yield DataTable(id="records", cursor_type="row", zebra_stripes=True)
            with Vertical(id="dlv-side"):
                yield Static(id="journey-head")
                yield DataTable(id="steps", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#records", DataTable)
        for col in ("topic", "part", "offset", "key", "fetched", "e2e ms"):
            table.add_column(col, key=col)
        steps = self.query_one("#steps", DataTable)
        for col in ("time", "+ms", "step", "who", "", "connection", "corr"):
            steps.add_column(col)
        self.load()
        if self.rows is None:
            self.set_interval(0.5, self.load)
        table.focus()

    def load(self) -> None:
        if self.rows is not None:
            return
        with self.store.lock:
            rows, note = self.store.deliveries, self.store.deliveries_note
        title = self.query_one("#dlv-title", Static)
        if rows is None:
            title.update(Text("Deliveries: available when indexing ends (the join needs the whole capture)",
                              style="dim"))
            return
        self.rows = rows[:MAX_LISTED]
        unread = sum(1 for r in rows if not r.get("times_fetched"))
        again = sum(1 for r in rows if (r.get("times_fetched") or 0) > 1)
        head = Text.assemble(("Deliveries: ", "bold"), plural(len(rows), "acknowledged record"),
                             f" ({unread:,} never fetched, {again:,} fetched more than once)")
        if note:
            head.append(f"\n{note}", style="yellow")
        head.append("\nEnter: go to the exchange · Tab: records/journey · Esc: back", style="dim")
        title.update(head)
        table = self.query_one("#records", DataTable)
        for r in self.rows:
            e2e = r.get("end_to_end_ms")
            table.add_row(term_safe(str(r.get("topic")), 40), str(r.get("partition")), str(r.get("offset")),
                          term_safe("" if r.get("key") is None else str(r["key"]), 24),
                          str(r.get("times_fetched") or 0), "" if e2e is None else f"{e2e:.3f}")
        self.show(self.rows[0] if self.rows else None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "records" and self.rows and 0 <= event.cursor_row < len(self.rows):
            row = self.rows[event.cursor_row]
            if row is not self.current:
                self.show(row)

    def show(self, row: dict[str, Any] | None) -> None:
        self.current = row
        head = self.query_one("#journey-head", Static)
        table = self.query_one("#steps", DataTable)
        table.clear()
        if row is None:
            head.update(Text("No acknowledged records in this capture.", style="dim"))
            self.steps = []
            return
        text = Text.assemble((f"{term_safe(str(row.get('topic')), 80)}[{row.get('partition')}] "
                              f"offset {row.get('offset')}", "bold"))
        text.append(f"\nkey {term_safe(str(row.get('key')), 80)} · value sha256 {row.get('value_digest')} "
                    f"({row.get('value_size')} bytes)")
        text.append(f"\nfetched {row.get('times_fetched') or 0} times", style="dim")
        head.update(text)
        self.steps = journey(row)
        start = row.get("produce_ts")
        for s in self.steps:
            ts = s.get("ts")
            since = "" if ts is None or start is None else f"{(ts - start) * 1000:.3f}"
            cid = s.get("correlation_id")
            table.add_row(_clock(ts), since, s["step"], term_safe(str(s.get("who") or ""), 28),
                          term_safe(str(s.get("what") or ""), 40), term_safe(str(s.get("stream") or ""), 60),
                          "" if cid is None else str(cid))

    def action_jump(self) -> None:
        if self.current is None:
            return
        table = self.query_one("#steps", DataTable)
        step = self.steps[0] if self.steps else None
        if table.has_focus and 0 <= table.cursor_row < len(self.steps):
            step = self.steps[table.cursor_row]
        if step is None or step.get("correlation_id") is None:
            self.app.notify("this step has no exchange to show (a commit: see the OffsetCommit exchanges)",
                            severity="warning")
            return
        self.dismiss(evidence_row(step))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_jump()

    def action_close(self) -> None:
        self.dismiss(None)
