"""Connections and brokers: who talked to whom, and the ApiVersions each connection negotiated."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from kwinspect.analyze.termsafe import term_safe
from kwinspect.protocol.apis import api_name
from kwinspect.tui.store import ExchangeStore

MAX_ROWS = 2_000


def _counts(store: ExchangeStore) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with store.lock:
        n = len(store)
        stream = np.frombuffer(store.cols["stream"], dtype=np.uint32, count=n).copy()
        errs = np.frombuffer(store.cols["err_codes"], dtype=np.uint32, count=n).copy()
        keys = np.frombuffer(store.cols["api_key"], dtype=np.int16, count=n).copy()
        vers = np.frombuffer(store.cols["api_version"], dtype=np.int16, count=n).copy()
    return stream, errs, keys, vers


class ConnectionsScreen(Screen[str | None]):
    """Enter on a connection dismisses with its stream: the app filters the list to it."""

    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("enter", "only", "Show its exchanges"),
    ]
    DEFAULT_CSS = """
    ConnectionsScreen #conns { height: 2fr; }
    ConnectionsScreen #lower { height: 1fr; }
    ConnectionsScreen #brokers { width: 1fr; }
    ConnectionsScreen #versions { width: 2fr; }
    """

    def __init__(self, store: ExchangeStore, dissector: Any = None) -> None:
        super().__init__()
        self.store = store
        self.dissector = dissector
        self.streams: list[str] = []
        self.infos: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="conns-title")
        yield DataTable(id="conns", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="lower"):
            with Vertical(id="brokers"):
                yield Static(Text("Brokers (Metadata, FindCoordinator)", style="bold"))
                yield DataTable(id="broker-table", cursor_type="row")
            with Vertical(id="versions"):
                yield Static(id="versions-title")
                yield DataTable(id="version-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        store = self.store
        stream, errs, keys, vers = self._data = _counts(store)
        n_streams = len(store.strings)
        per = np.bincount(stream, minlength=n_streams)
        per_err = np.bincount(stream[errs != 0], minlength=n_streams)
        if self.dissector is not None:
            for _ in range(3):
                try:
                    self.infos = {i.stream: i for i in list(self.dissector.connections.values())}
                    break
                except RuntimeError:  # the indexer added a connection meanwhile
                    continue
        names = set(self.infos) | {store.strings[i] for i in store.stream_ends}
        table = self.query_one("#conns", DataTable)
        for col in ("connection", "kind", "exchanges", "errors", "client software", "SASL", "to broker",
                    "to client", "gap bytes", "closed"):
            table.add_column(col)
        rows = []
        for name in names:
            idx = store.strings.get(name)
            count = int(per[idx]) if idx is not None and idx < len(per) else 0
            nerr = int(per_err[idx]) if idx is not None and idx < len(per_err) else 0
            rows.append((count, name, nerr))
        rows.sort(key=lambda r: (-r[0], r[1]))
        n_all = len(rows)
        rows = rows[:MAX_ROWS]  # the busiest; a DataTable row costs a few hundred microseconds to add
        self.streams = [r[1] for r in rows]
        for count, name, nerr in rows:
            info = self.infos.get(name)
            conv = getattr(info, "conversation", None)
            sw = " ".join(conv.client_software) if conv is not None and conv.client_software else ""
            table.add_row(
                term_safe(name, 60), getattr(info, "kind", "kafka"), f"{count:,}",
                Text(f"{nerr:,}", style="red" if nerr else "dim"), term_safe(sw, 40),
                term_safe(getattr(conv, "sasl_mechanism", None) or "", 20),
                f"{info.bytes.get('to_broker', 0):,}" if info else "", f"{info.bytes.get('to_client', 0):,}" if info else "",
                f"{info.gap_bytes:,}" if info and info.gap_bytes else "", getattr(info, "closed", None) or "",
            )
        self.query_one("#conns-title", Static).update(Text.assemble(
            (f"Connections: {n_all:,}" + (f" (the {MAX_ROWS:,} busiest shown)" if n_all > MAX_ROWS else ""), "bold"), "   Enter: show only this connection's exchanges · Esc: back"))
        brokers = self.query_one("#broker-table", DataTable)
        for col in ("node id", "host:port", "exchanges"):
            brokers.add_column(col)
        shared = getattr(self.dissector, "shared", None)
        per_broker: dict[str, int] = {}
        for idx, (_client, broker) in store.stream_ends.items():
            if idx < len(per):
                per_broker[broker] = per_broker.get(broker, 0) + int(per[idx])
        known = dict(shared.brokers) if shared is not None else {}
        seen = set()
        for nid, (host, port) in sorted(known.items()):
            addr = f"{host}:{port}"
            seen.add(addr)
            brokers.add_row(str(nid), term_safe(addr, 60), f"{per_broker.get(addr, 0):,}")
        for addr, count in sorted(per_broker.items()):
            if addr not in seen:
                brokers.add_row("?", term_safe(addr, 60), f"{count:,}")
        table.focus()
        self._show_versions(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "conns":
            self._show_versions(event.cursor_row)

    def _show_versions(self, i: int) -> None:
        title = self.query_one("#versions-title", Static)
        table = self.query_one("#version-table", DataTable)
        table.clear(columns=True)
        if not (0 <= i < len(self.streams)):
            title.update("")
            return
        name = self.streams[i]
        info = self.infos.get(name)
        conv = getattr(info, "conversation", None)
        advertised = dict(conv.advertised) if conv is not None and conv.advertised else {}
        stream, _errs, keys, vers = self._data
        idx = self.store.strings.get(name)
        used: dict[int, set[int]] = {}
        if idx is not None:
            m = stream == idx
            for k, v in set(zip(keys[m].tolist(), vers[m].tolist(), strict=True)):
                if k >= 0:
                    used.setdefault(k, set()).add(v)
        title.update(Text.assemble(("ApiVersions of ", "bold"), term_safe(name, 60),
                                   ("" if advertised else "  (no ApiVersions response seen)", "dim")))
        rows = []
        for key in sorted(set(advertised) | set(used)):
            rng = advertised.get(key)
            u = sorted(used.get(key, ()))
            bad = [v for v in u if rng is not None and not (rng[0] <= v <= rng[1])]
            rows.append((
                f"{api_name(key) or key} ({key})", ",".join(f"v{v}" for v in u),
                f"v{rng[0]}-v{rng[1]}" if rng else "",
                Text("outside the advertised range", style="bold red") if bad else "",
            ))
        # explicit widths: the table is refilled on every cursor move, and auto widths
        # computed then kept the header's width ("Pro" for Produce) at 80 columns
        for n, col in enumerate(("api", "used", "broker supports", "note")):
            table.add_column(col, width=max([len(col)] + [len(str(r[n])) for r in rows]))
        for r in rows:
            table.add_row(*r)

    def action_only(self) -> None:
        table = self.query_one("#conns", DataTable)
        if 0 <= table.cursor_row < len(self.streams):
            self.dismiss(self.streams[table.cursor_row])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table.id == "conns":
            self.action_only()

    def action_close(self) -> None:
        self.dismiss(None)
