"""The main screen: status line, filter bar, the exchange list and the detail pane."""

from __future__ import annotations

import os

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import ErrorRow, plural
from kwinspect.tui.record_match import ExchangeRecordFilter
from kwinspect.tui.view import (
    Cancelled,
    ViewResult,
    ViewSpec,
    compute_view,
    extend_view,
    view_columns,
)
from kwinspect.tui.widgets.detail import DetailPane
from kwinspect.tui.widgets.exchange_list import ExchangeList, header_text
from kwinspect.tui.widgets.filter_bar import FilterBar

POLL = 0.25  # seconds between looks at the store while rows arrive


class MainScreen(Screen):
    BINDINGS = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("E", "toggle_errors", "Errors only"),
        Binding("a", "toggle_api", "One api"),
        Binding("n", "toggle_conn", "One conn"),
        Binding("s", "toggle_sort", "Sort latency"),
        Binding("ctrl+r", "clear_view", "Clear", show=False),
        Binding("e", "errors", "Errors"),
        Binding("c", "connections", "Conns"),
        Binding("l", "latency", "Latency"),
        Binding("t", "timeseries", "Traffic", show=False),
        Binding("D", "diagnosis", "Diagnosis"),
        Binding("J", "deliveries", "Deliveries", show=False),
        Binding("x", "export", "Export"),
        Binding("d", "toggle_detail", "Detail", show=False),
        Binding("h", "hex_side", "Hex req/resp", show=False),
        Binding("1", "tab('tab-request')", "Request", show=False),
        Binding("2", "tab('tab-response')", "Response", show=False),
        Binding("3", "tab('tab-records')", "Records", show=False),
        Binding("4", "tab('tab-hex')", "Hex", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    MainScreen #status { height: 1; background: $primary-background; padding: 0 1; }
    MainScreen #list-header { height: 1; text-style: bold; background: $panel; }
    MainScreen #list-box { height: 3fr; }
    MainScreen DetailPane { height: 2fr; border-top: solid $primary; }
    MainScreen.-no-detail DetailPane { display: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.spec = ViewSpec()
        self.predicate = None
        self.result: ViewResult | None = None  # None while the view is the identity
        self.computing: ViewSpec | None = None
        self.filter_progress: float | None = None
        self._seen_generation = -1
        self._detail_timer: Timer | None = None
        self._extending = False
        self._follow_after = False

    @property
    def store(self):  # noqa: ANN201
        return self.app.store

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield FilterBar()
        with Vertical(id="list-box"):
            yield Static(Text(" " + header_text()), id="list-header")
            # a file opens at its first exchange, like Wireshark; a live feed follows its tail
            yield ExchangeList(self.app.store, follow=self.app.live is not None, id="list")
        yield DetailPane(self.app.store, id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.list.focus()
        self.set_interval(POLL, self.poll)
        if self.app.schemas is not None:
            self.prepare_fields()
        expr = self.app.initial_filter
        if expr:
            self.query_one(FilterBar).set_expr(expr)
            self.apply_spec(self.spec.with_(expr=expr), self.app.record_filtering.compile(expr))
        self.poll()

    @work(thread=True, group="fields")
    def prepare_fields(self) -> None:
        """The schemas' fields, built before the first key press in the filter bar needs them
        (building every decoder may run protoc)."""
        try:
            self.app.record_filtering.fields()
        except Exception:  # noqa: BLE001 - the filter bar reports it when it compiles
            pass

    @property
    def list(self) -> ExchangeList:
        return self.query_one("#list", ExchangeList)

    @property
    def detail(self) -> DetailPane:
        return self.query_one("#detail", DetailPane)

    # -- polling the store -------------------------------------------------------------

    def poll(self) -> None:
        store = self.store
        gen = store.generation
        if gen != self._seen_generation:
            self._seen_generation = gen
            if self.result is None and self.computing is None:
                self.list.data_changed()
            elif self.result is not None and not self._extending:
                self._extending = True
                self.extend_worker(self.result, self.predicate)
        self.update_status()

    @work(thread=True, exclusive=True, group="extend")
    def extend_worker(self, result: ViewResult, predicate) -> None:  # noqa: ANN001
        new = None
        try:
            new = extend_view(self.store, result, predicate)
        finally:
            self.app.call_from_thread(self._extended, result, new)

    def _extended(self, old: ViewResult, new: ViewResult | None) -> None:
        self._extending = False
        if new is None or self.result is not old:
            return
        self.result = new
        lst = self.list
        if lst.follow or self.spec.sort == "capture":
            lst.rows = new.rows
            lst.data_changed()
        else:
            lst.set_rows(new.rows, keep_row=lst.current_row)

    def update_status(self) -> None:
        app = self.app
        store = self.store
        ix = app.indexer
        parts = [Text(term_safe(app.source_label, 60), style="bold")]
        parts.append(Text(f"  {plural(len(store), 'exchange')}", style="bold"))
        if store.first:
            parts.append(Text(f" (oldest {store.first:,} dropped)", style="dim"))
        parts.append(Text(f"  {plural(store.error_count, 'error')}", style="red" if store.error_count else "dim"))
        if ix is not None and not ix.done.is_set():
            prog = ix.progress
            parts.append(Text(f"  indexing {prog:.0%}" if prog is not None else "  live", style="yellow"))
        elif app.live is not None:
            parts.append(Text("  feed ended", style="dim"))
        if ix is not None and ix.error:
            parts.append(Text("  " + term_safe(ix.error, 100), style="bold red"))
        lst = self.list
        if self.computing is not None:
            pct = f" {self.filter_progress:.0%}" if self.filter_progress is not None else ""
            parts.append(Text(f"  filtering{pct}…", style="yellow"))
        desc = self.spec.describe()
        if desc:
            parts.append(Text(f"  view {lst.count:,}: {term_safe(desc, 120)}", style="cyan"))
        if lst.follow and lst.count:
            parts.append(Text("  following", style="green"))
        self.query_one("#status", Static).update(Text.assemble(*parts))

    # -- the view -----------------------------------------------------------------------

    def apply_spec(self, spec: ViewSpec, predicate=None) -> None:  # noqa: ANN001
        self.spec = spec
        self.predicate = predicate
        self._mark_records(predicate)
        keep = self.list.current_row
        if spec.identity:
            self.computing = None
            self.result = None
            self.workers.cancel_group(self, "view")
            self.list.set_rows(None, keep_row=keep)
            self.update_status()
            return
        self.computing = spec
        self.filter_progress = None
        self._follow_after = self.list.follow and spec.sort == "capture"
        self.update_status()
        self.view_worker(spec, predicate, keep)

    @work(thread=True, exclusive=True, group="view")
    def view_worker(self, spec: ViewSpec, predicate, keep: int | None) -> None:  # noqa: ANN001
        worker = get_current_worker()

        def progress(frac: float) -> None:
            self.filter_progress = frac

        try:
            result = compute_view(self.store, spec, predicate, lambda: worker.is_cancelled, progress)
        except Cancelled:
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._view_ready, result, keep)

    def _view_ready(self, result: ViewResult, keep: int | None) -> None:
        if result.spec != self.spec:
            return
        self.computing = None
        self.result = result
        self._seen_generation = -1  # pick up rows that arrived meanwhile
        lst = self.list
        lst.follow = self._follow_after
        lst.set_rows(result.rows, keep_row=None if lst.follow else keep)
        if self.spec.sort == "latency" and keep is None:
            lst.move_to(0)
        self.update_status()
        self.app.post_message(self.app.ViewChanged(lst.count))

    def _mark_records(self, predicate) -> None:  # noqa: ANN001
        """The detail pane marks the records a key/value filter matches: redraw it when that changes."""
        flt = predicate if isinstance(predicate, ExchangeRecordFilter) else None
        detail = self.detail
        if detail.record_filter is flt:
            return
        detail.record_filter = flt
        if detail.pending_row is not None and not self.has_class("-no-detail"):
            detail.show(detail.pending_row)

    def on_filter_bar_applied(self, event: FilterBar.Applied) -> None:
        self.apply_spec(self.spec.with_(expr=event.expr), event.predicate)
        self.list.focus()

    def action_focus_filter(self) -> None:
        self.query_one("#filter-input", Input).focus()

    def on_key(self, event) -> None:  # noqa: ANN001
        # Esc from the filter bar or the detail pane returns to the list
        if event.key == "escape" and self.focused is not self.list:
            self.list.focus()
            event.stop()

    def action_toggle_errors(self) -> None:
        self.apply_spec(self.spec.with_(errors_only=not self.spec.errors_only), self.predicate)

    def action_toggle_api(self) -> None:
        if self.spec.api_key is not None:
            self.apply_spec(self.spec.with_(api_key=None, api_label=None), self.predicate)
            return
        row = self.list.current_row
        if row is None:
            return
        key = self.store.cell("api_key", row)
        self.apply_spec(self.spec.with_(api_key=key, api_label=self.store.api_label(row)), self.predicate)

    def action_toggle_conn(self) -> None:
        if self.spec.stream is not None:
            self.apply_spec(self.spec.with_(stream=None, stream_label=None), self.predicate)
            return
        row = self.list.current_row
        if row is None:
            return
        self.show_stream(self.store.stream(row))

    def show_stream(self, stream: str) -> None:
        idx = self.store.strings.get(stream)
        if idx is None:
            self.app.notify("no exchanges on that connection", severity="warning")
            return
        self.apply_spec(self.spec.with_(stream=idx, stream_label=stream), self.predicate)

    def action_toggle_sort(self) -> None:
        self.apply_spec(self.spec.with_(sort="capture" if self.spec.sort == "latency" else "latency"),
                        self.predicate)

    def action_clear_view(self) -> None:
        self.query_one(FilterBar).set_expr("")
        self.apply_spec(ViewSpec(), None)

    # -- detail -------------------------------------------------------------------------

    def on_exchange_list_highlighted(self, event: ExchangeList.Highlighted) -> None:
        if self._detail_timer is not None:
            self._detail_timer.stop()
        row = event.row
        # while following a growing tail the cursor moves on every poll: redraw the detail less often
        delay = 0.6 if self.list.follow and not self.app.indexer.done.is_set() else 0.05
        self._detail_timer = self.set_timer(delay, lambda: self._show_detail(row))

    def _show_detail(self, row: int | None) -> None:
        if self.has_class("-no-detail"):
            return
        detail = self.detail
        if detail.pending_row != row:
            detail.show(row)

    def on_exchange_list_resized(self, event: ExchangeList.Resized) -> None:
        self.query_one("#list-header", Static).update(Text(" " + header_text(event.width)))

    def on_exchange_list_selected(self, event: ExchangeList.Selected) -> None:
        if self.has_class("-no-detail"):
            self.remove_class("-no-detail")
        self.detail.show(event.row)
        self.app.post_message(self.app.DetailShown(event.row))
        tree = self.query_one("#tree-request")
        self.detail.active = "tab-request"
        tree.focus()

    def action_toggle_detail(self) -> None:
        self.toggle_class("-no-detail")
        if not self.has_class("-no-detail"):
            self.detail.show(self.list.current_row)

    def action_tab(self, tab: str) -> None:
        self.detail.active = tab
        self.remove_class("-no-detail")
        if self.detail.pending_row != self.list.current_row:
            self.detail.show(self.list.current_row)

    def action_hex_side(self) -> None:
        self.detail.toggle_hex_side()

    # -- other views --------------------------------------------------------------------

    def action_help(self) -> None:
        from kwinspect.tui.screens.help import HelpScreen

        self.app.push_screen(HelpScreen())

    def action_errors(self) -> None:
        from kwinspect.tui.screens.errors import ErrorsScreen

        self.app.push_screen(ErrorsScreen(self.store), self.jump_to_error)

    def action_diagnosis(self) -> None:
        from kwinspect.tui.screens.diagnosis import DiagnosisScreen

        self.app.push_screen(DiagnosisScreen(self.store), self.jump_to_evidence)

    def action_deliveries(self) -> None:
        from kwinspect.tui.screens.deliveries import DeliveriesScreen

        self.app.push_screen(DeliveriesScreen(self.store), self.jump_to_evidence)

    def jump_to_evidence(self, ev: ErrorRow | None) -> None:
        if ev is None:
            return
        row = self.find_exchange(ev)
        if row is None:
            self.app.notify("that exchange is not in the list (dropped to bound memory, or never decoded)",
                            severity="warning")
            return
        self.jump_to_row(row)

    def action_connections(self) -> None:
        from kwinspect.tui.screens.connections import ConnectionsScreen

        def chosen(stream: str | None) -> None:
            if stream:
                self.apply_spec(self.spec.with_(stream=None, stream_label=None), self.predicate)
                self.show_stream(stream)

        self.app.push_screen(ConnectionsScreen(self.store, self.app.dissector), chosen)

    def action_latency(self) -> None:
        from kwinspect.tui.screens.latency import LatencyScreen

        scope = self.spec.describe() or "all exchanges"
        self.app.push_screen(LatencyScreen(self.store, self.list.rows, scope))

    def action_timeseries(self) -> None:
        from kwinspect.tui.screens.timeseries import TimeSeriesScreen

        scope = self.spec.describe() or "all exchanges"
        self.app.push_screen(TimeSeriesScreen(self.store, self.list.rows, scope))

    def action_export(self) -> None:
        from kwinspect.tui.screens.export import ExportScreen

        base = os.path.splitext(os.path.basename(self.app.source_label))[0] or "kwinspect"
        self.app.push_screen(ExportScreen(self.list.count, f"{base}-exchanges.jsonl"), self.export_to)

    def export_to(self, path: str | None) -> None:
        if not path:
            return
        from kwinspect.tui.exporting import format_of

        if format_of(path) is None:
            self.app.notify(f"{term_safe(path, 80)}: use a .jsonl or .csv file name", severity="error")
            return
        lst = self.list
        rows = np.arange(self.store.first, self.store.total) if lst.rows is None else lst.rows.copy()
        self.export_worker(rows, path)

    @work(thread=True, group="export")
    def export_worker(self, rows: np.ndarray, path: str) -> None:
        from kwinspect.tui.exporting import write_view

        try:
            n = write_view(self.store, (int(r) for r in rows), path)
        except (OSError, ValueError) as exc:
            self.app.call_from_thread(self.app.notify, term_safe(str(exc), 200), title="export failed",
                                      severity="error")
            return
        self.app.call_from_thread(self._exported, n, path)

    def _exported(self, n: int, path: str) -> None:
        self.app.notify(f"wrote {n:,} exchanges to {term_safe(path, 100)}", title="export")
        self.app.post_message(self.app.Exported(path, n))

    # -- jumping from an error to its exchange --------------------------------------------

    def find_exchange(self, err: ErrorRow) -> int | None:
        store = self.store
        if err.stream is None:
            return None
        sidx = store.strings.get(err.stream)
        if sidx is None:
            return None
        stream, cid, ts, resp_ts = view_columns(store, ("stream", "cid", "ts", "resp_ts"), None)
        mask = stream == sidx
        if err.correlation_id is not None:
            exact = mask & (cid == err.correlation_id)
            if exact.any():
                mask = exact
        cand = np.nonzero(mask)[0]
        if not len(cand):
            return None
        if err.ts is not None:
            t = np.where(np.isnan(resp_ts[cand]), ts[cand], resp_ts[cand])
            t = np.where(np.isnan(t), np.inf, t)
            best = cand[int(np.argmin(np.abs(t - err.ts)))]
        else:
            best = cand[0]
        return int(best) + store.first

    def jump_to_error(self, err: ErrorRow | None) -> None:
        if err is None:
            return
        row = self.find_exchange(err)
        if row is None:
            self.app.notify("this error belongs to no exchange (e.g. a TCP gap or a non-Kafka connection)",
                            severity="warning")
            return
        self.jump_to_row(row)

    def jump_to_row(self, row: int) -> None:
        lst = self.list
        idx = lst.index_of(row)
        if idx is None:
            self.app.notify("the filter hid that exchange: filter cleared", severity="information")
            self.query_one(FilterBar).set_expr("")
            self.spec = ViewSpec()
            self.predicate = None
            self.detail.record_filter = None
            self.result = None
            self.computing = None
            lst.set_rows(None)
            idx = lst.index_of(row)
            if idx is None:
                return
        lst.follow = False
        lst.move_to(idx)
        lst.focus()
        self.detail.show(row)
        self.update_status()

    def cid_of(self, row: int) -> int | None:
        return self.store.int_cell("cid", row)
