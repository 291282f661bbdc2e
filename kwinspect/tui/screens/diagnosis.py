"""Diagnosis (`D`): the Diagnoser's findings, most severe first; Enter jumps to an evidence exchange.

The findings come from the indexer (file mode: the indexing process; live mode:
the live event path) as plain dicts (``Finding.as_dict``) in ``store.findings``;
this screen only reads them and refreshes when the indexer publishes new ones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import ErrorRow, plural
from kwinspect.tui.store import ExchangeStore

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
ORDER = ("error", "warning", "info")


def _clock(ts: float | None) -> str:
    if ts is None:
        return ""
    try:
        d = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return "?"
    return d.strftime("%H:%M:%S.") + f"{d.microsecond // 1000:03d}"


def evidence_row(ev: dict[str, Any]) -> ErrorRow:
    """What MainScreen.find_exchange matches on: stream, correlation id, time."""
    return ErrorRow(kind="diagnosis", stream=ev.get("stream"), correlation_id=ev.get("correlation_id"),
                    api_name=ev.get("api_name"), ts=ev.get("ts"))


class DiagnosisScreen(Screen[ErrorRow | None]):
    """Dismisses with the chosen evidence (as an ErrorRow); the app jumps to its exchange."""

    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("enter", "jump", "Go to exchange"),
    ]
    DEFAULT_CSS = """
    DiagnosisScreen #diag-body { height: 1fr; }
    DiagnosisScreen #findings { width: 55%; height: 1fr; }
    DiagnosisScreen #diag-side { width: 45%; height: 1fr; }
    DiagnosisScreen #finding-detail { height: auto; max-height: 60%; padding: 0 1; }
    DiagnosisScreen #evidence { height: 1fr; }
    """

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__()
        self.store = store
        self.shown: list[dict[str, Any]] = []
        self.seen_generation = -1
        self.current: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="diag-title")
        with Horizontal(id="diag-body"):
            yield DataTable(id="findings", cursor_type="row", zebra_stripes=True)
            with Vertical(id="diag-side"):
                yield Static(id="finding-detail")
                yield DataTable(id="evidence", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#findings", DataTable)
        for col in ("severity", "kind", "count", "title"):
            table.add_column(col, key=col)
        ev = self.query_one("#evidence", DataTable)
        for col in ("time", "api", "corr", "connection"):
            ev.add_column(col)
        self.refresh_findings()
        self.set_interval(0.5, self.refresh_findings)
        table.focus()

    # -- the list of findings -------------------------------------------------------------

    def refresh_findings(self) -> None:
        store = self.store
        with store.lock:
            gen = store.findings_generation
            if gen == self.seen_generation:
                return
            findings = list(store.findings)
            examined = store.findings_examined
        self.seen_generation = gen
        rank = {s: n for n, s in enumerate(ORDER)}
        findings.sort(key=lambda f: rank.get(f.get("severity"), len(ORDER)))  # stable: keeps time order
        table = self.query_one("#findings", DataTable)
        keep = self.current
        self.shown = findings
        table.clear()
        for f in findings:
            sev = str(f.get("severity"))
            table.add_row(Text(sev, style=STYLE.get(sev, "")), term_safe(str(f.get("kind")), 30),
                          str(f.get("count", "")), term_safe(str(f.get("title")), 300))
        counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in ORDER}
        done = self.app.indexer.done.is_set() if hasattr(self.app, "indexer") else True
        state = "" if done else "  (indexing: updated as it goes)"
        self.query_one("#diag-title", Static).update(Text.assemble(
            ("Diagnosis: ", "bold"), (plural(counts['error'], "error"), STYLE["error"]), ", ",
            (plural(counts['warning'], "warning"), STYLE["warning"]), ", ", (f"{counts['info']} info", STYLE["info"]),
            f"  ({examined:,} exchanges examined){state}",
            "\nEnter: go to the evidence exchange (on a finding: its first) · Tab: findings/evidence · Esc: back"))
        if not findings:
            self.show_finding(None)
            return
        idx = 0
        if keep is not None:
            for n, f in enumerate(findings):
                if (f.get("kind"), f.get("title")) == (keep.get("kind"), keep.get("title")):
                    idx = n
                    break
        table.move_cursor(row=idx)
        self.show_finding(findings[idx])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "findings" and 0 <= event.cursor_row < len(self.shown):
            f = self.shown[event.cursor_row]
            if f is not self.current:
                self.show_finding(f)

    # -- one finding: detail and evidence -------------------------------------------------

    def show_finding(self, f: dict[str, Any] | None) -> None:
        self.current = f
        detail = self.query_one("#finding-detail", Static)
        ev = self.query_one("#evidence", DataTable)
        ev.clear()
        if f is None:
            detail.update(Text("No findings yet." if not self.app.indexer.done.is_set() else "No findings.",
                               style="dim"))
            return
        sev = str(f.get("severity"))
        text = Text.assemble((f"[{term_safe(str(f.get('kind')), 40)}] ", STYLE.get(sev, "")),
                             (term_safe(str(f.get("title")), 500), "bold"), "\n")
        if f.get("detail"):
            text.append(term_safe(str(f["detail"]), 4000) + "\n")
        first, last = _clock(f.get("first_ts")), _clock(f.get("last_ts"))
        if first:
            text.append(f"when: {first}" + (f" .. {last}" if last and last != first else ""), style="dim")
        evidence = f.get("evidence") or []
        count = f.get("count") or 0
        text.append(f"\nevidence: {len(evidence)}" + (f" of {count}" if count > len(evidence) else ""),
                    style="dim")
        detail.update(text)
        for e in evidence:
            cid = e.get("correlation_id")
            ev.add_row(_clock(e.get("ts")), term_safe(str(e.get("api_name") or ""), 30),
                       "" if cid is None else str(cid), term_safe(str(e.get("stream") or ""), 80))

    # -- jumping --------------------------------------------------------------------------

    def chosen_evidence(self) -> dict[str, Any] | None:
        f = self.current
        if f is None:
            return None
        evidence = f.get("evidence") or []
        ev_table = self.query_one("#evidence", DataTable)
        if ev_table.has_focus and 0 <= ev_table.cursor_row < len(evidence):
            return evidence[ev_table.cursor_row]
        return evidence[0] if evidence else None

    def action_jump(self) -> None:
        ev = self.chosen_evidence()
        if ev is None:
            if self.current is not None:
                self.app.notify("this finding has no evidence exchange", severity="warning")
            return
        self.dismiss(evidence_row(ev))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_jump()

    def action_close(self) -> None:
        self.dismiss(None)
