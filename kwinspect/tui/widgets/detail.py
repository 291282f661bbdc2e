"""Detail pane of one exchange: decoded trees, records table, hex of the raw frames.

The request and response are shown as collapsible trees built lazily (children
are created when a node is expanded, so a Fetch response with thousands of
records opens instantly).  Nodes on the path of a decode issue are red.
Selecting a text/bytes field highlights where those bytes sit in the hex view
(a byte search: the decoder does not report field offsets).  With schemas
(``--schemas``/``--schema-registry``) Schema Registry keys and values are decoded
in the records table, and the highlighted record's decoded key and value are
shown as a tree below it.  While the filter names key/value fields
(``value.order_id == 7``), the records that match it are marked in a first
column, counted in the tab's label, and the cursor starts on the first of them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Static, TabbedContent, TabPane, Tree

from kwinspect.analyze.schema_values import DECODED_ENCODINGS
from kwinspect.analyze.termsafe import term_safe
from kwinspect.model import Message as KafkaMessage
from kwinspect.tui.record_match import ExchangeRecordFilter, exchange_records
from kwinspect.tui.store import ExchangeStore

HEX_LIMIT = 16 * 1024  # bytes of a frame shown in the hex view
RECORD_LIMIT = 5_000  # rows of the records table
MAX_CHILDREN = 500  # children created per tree node before a "... more" leaf
APPLY_REFRESHES = 100  # refreshes a finished decode waits for the pane's children


def _scalar_label(value: Any) -> Text:
    if value is None:
        return Text("null", style="dim")
    if isinstance(value, bool):
        return Text(str(value).lower(), style="cyan")
    if isinstance(value, int | float):
        return Text(repr(value), style="cyan")
    if isinstance(value, bytes | bytearray):
        return Text(f"<{len(value)} bytes> " + term_safe(bytes(value[:32]).hex(" "), 120), style="green")
    return Text('"' + term_safe(value, 300) + '"', style="green")


def _is_container(value: Any) -> bool:
    return isinstance(value, dict | list | tuple)


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class MessageTree(Tree):
    """One decoded message (header, body, issues) as a lazily built tree."""

    class FieldSelected(Message):
        """A leaf field was highlighted; ``needle`` is its bytes for the hex view."""

        def __init__(self, side: str, needle: bytes | None) -> None:
            super().__init__()
            self.side = side
            self.needle = needle

    def __init__(self, side: str, **kw) -> None:
        super().__init__(side, **kw)
        self.side = side
        self.issue_paths: list[str] = []
        self.show_root = False
        self.guide_depth = 3

    def show_message(self, msg: KafkaMessage | None, jsonish: dict | None, note: str | None = None,
                     frame: int | None = None, tcp_stream: int | None = None) -> None:
        self.clear()
        root = self.root
        root.expand()
        if note:
            root.add_leaf(Text(note, style="italic dim"))
        if msg is None or jsonish is None:
            return
        self.issue_paths = [i.path or "" for i in msg.issues]
        if msg.issues:
            issues = root.add(Text(f"issues ({len(msg.issues)})", style="bold red"), expand=True)
            for i in msg.issues:
                where = f" at {i.path}" if i.path else ""
                off = f" offset {i.offset}" if i.offset is not None else ""
                issues.add_leaf(Text(f"{i.severity} {i.kind}{where}{off}: {term_safe(i.message, 300)}",
                                     style="red" if i.severity == "error" else "yellow"))
        version = f" v{msg.api_version}" if msg.api_version is not None else ""
        if msg.decoded_version is not None and msg.decoded_version != msg.api_version:
            version += f" (decoded as v{msg.decoded_version})"
        # where Wireshark shows the same message: `frame.number == N`, `tcp.stream == K`
        where = f", Wireshark frame {frame}" if frame is not None else ""
        where += f" (tcp.stream {tcp_stream})" if frame is not None and tcp_stream is not None else ""
        root.add_leaf(Text(f"size {msg.size} bytes{version}{where}", style="dim"))
        header = root.add("header", data=(jsonish.get("header"), "header"), expand=False)
        self._populate(header)
        header.expand()
        body = jsonish.get("body")
        if body is None:
            root.add_leaf(Text("body: not decoded", style="yellow"))
            if jsonish.get("raw_body"):
                root.add_leaf(Text(f"raw body: {term_safe(jsonish['raw_body'].get('bytes'), 200)}"))
            return
        node = root.add(self._label("body", body, ""), data=(body, ""), expand=False)
        self._populate(node)
        node.expand()
        # open the first level of arrays too: topics / partitions is what people look for
        for child in node.children:
            if child.allow_expand:
                self._populate(child)
                child.expand()

    def _has_issue(self, path: str) -> bool:
        return any(p == path or p.startswith(path + ".") or p.startswith(path + "[") for p in self.issue_paths
                   if p) if path else False

    def _label(self, key: Any, value: Any, path: str) -> Text:
        name = f"[{key}]" if isinstance(key, int) else term_safe(key, 80)
        style = "bold red" if self._has_issue(path) else "bold"
        if isinstance(value, dict):
            if set(value) == {"bytes", "encoding", "size"}:  # rendered bytes
                return Text.assemble((name, style), ": ", (term_safe(value["bytes"], 300), "green"),
                                     (f"  ({value['encoding']}, {value['size']} B)", "dim"))
            return Text.assemble((name, style), (f" {{{len(value)}}}", "dim"))
        if isinstance(value, list | tuple):
            return Text.assemble((name, style), (f" [{len(value)}]", "dim"))
        return Text.assemble((name, style), ": ", _scalar_label(value))

    def _populate(self, node) -> None:  # noqa: ANN001
        if node.children or node.data is None:
            return
        value, path = node.data
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value or ()))
        for n, (key, child) in enumerate(items):
            if n >= MAX_CHILDREN:
                node.add_leaf(Text(f"... {len(items) - MAX_CHILDREN} more", style="dim"))
                break
            cpath = _child_path(path, key) if path != "header" else f"header.{key}"
            label = self._label(key, child, cpath)
            if _is_container(child) and not (isinstance(child, dict) and set(child) == {"bytes", "encoding", "size"}):
                node.add(label, data=(child, cpath), allow_expand=bool(child))
            else:
                node.add_leaf(label, data=(child, cpath))

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        self._populate(event.node)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        data = event.node.data
        needle = None
        if data is not None:
            value = data[0]
            if isinstance(value, str) and len(value) >= 3:
                needle = value.encode("utf-8", "surrogateescape")
            elif isinstance(value, dict) and value.get("encoding") == "hex":
                try:
                    needle = bytes.fromhex(value["bytes"])
                except (ValueError, TypeError):
                    needle = None
        self.post_message(self.FieldSelected(self.side, needle))


def hex_dump(data: bytes, highlight: tuple[int, int] | None = None, issue_from: int | None = None,
             limit: int = HEX_LIMIT) -> Text:
    """Offset, 16 hex bytes, ASCII; ``highlight`` = (start, end) in reverse video."""
    out = Text()
    shown = data[:limit]
    for base in range(0, len(shown), 16):
        chunk = shown[base: base + 16]
        out.append(f"{base:08x}  ", style="dim")
        for i, b in enumerate(chunk):
            pos = base + i
            style = ""
            if highlight and highlight[0] <= pos < highlight[1]:
                style = "reverse bold"
            elif issue_from is not None and pos >= issue_from:
                style = "red"
            out.append(f"{b:02x}", style=style)
            out.append("  " if i == 7 else " ")
        out.append("   " * (16 - len(chunk)) + (" " if len(chunk) <= 8 else ""))
        out.append(" ")
        for i, b in enumerate(chunk):
            pos = base + i
            ch = chr(b) if 32 <= b < 127 else "."
            style = "reverse bold" if highlight and highlight[0] <= pos < highlight[1] else "dim"
            out.append(ch, style=style)
        out.append("\n")
    if len(data) > limit:
        out.append(f"... {len(data) - limit} more bytes not shown\n", style="dim")
    return out


class DetailPane(Vertical):
    """Tabs: Request, Response, Records, Hex."""

    DEFAULT_CSS = """
    DetailPane TabbedContent { height: 1fr; }
    DetailPane TabPane { height: 1fr; padding: 0; }
    DetailPane Tree { height: 1fr; }
    DetailPane #hex-scroll { height: 1fr; }
    DetailPane #records { height: 1fr; }
    DetailPane #record-tree { display: none; height: 1fr; border-top: solid $primary; }
    DetailPane #record-tree.-decoded { display: block; }
    """

    def __init__(self, store: ExchangeStore, **kw) -> None:
        super().__init__(**kw)
        self.store = store
        self.row: int | None = None  # the exchange shown
        self.pending_row: int | None = None  # the exchange asked for (decoding in a worker); not `loading`, which is Textual's spinner switch
        self.frames: dict[str, bytes | None] = {"request": None, "response": None}
        self.issue_offsets: dict[str, int | None] = {"request": None, "response": None}
        self.hex_side = "request"
        self.highlight: tuple[int, int] | None = None
        self.record_count = 0
        self.record_rows: list = []  # the records table's RecordRows (decoded trees come from them)
        # the filter bar's filter when it names key/value fields: its records are marked
        self.record_filter: ExchangeRecordFilter | None = None
        self.record_matches: list[int] = []  # indexes of the records it matches

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs"):
            with TabPane("Request", id="tab-request"):
                yield MessageTree("request", id="tree-request")
            with TabPane("Response", id="tab-response"):
                yield MessageTree("response", id="tree-response")
            with TabPane("Records", id="tab-records"):
                yield DataTable(id="records", zebra_stripes=True, cursor_type="row")
                yield Tree("record", id="record-tree")
            with TabPane("Hex", id="tab-hex"), VerticalScroll(id="hex-scroll"):
                yield Static(id="hex")

    @property
    def active(self) -> str:
        return self.query_one("#tabs", TabbedContent).active

    @active.setter
    def active(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab

    def show(self, row: int | None) -> None:
        """Show an exchange: decoding runs in a thread worker, the widgets fill in when it is done."""
        self.pending_row = row
        if row is None or not self.store.has(row):
            self._apply(row, None)
            return
        self._load(row)

    @work(thread=True, exclusive=True, group="detail")
    def _load(self, row: int) -> None:
        try:
            data = self._compute(row)
        except Exception as exc:  # noqa: BLE001 - a core bug must not take the app down
            data = {"error": f"{type(exc).__name__}: {exc}"}
        self.app.call_from_thread(self._apply, row, data)

    def _compute(self, row: int) -> dict:
        """Everything slow (re-decode, JSON rendering, record decoding), off the UI thread."""
        from kwinspect.analyze.render import message_json

        store = self.store
        req, resp = store.messages(row)
        raw = store.raw_visible(row)
        frames = store.frames(row) if raw else (None, None)
        xref = store.row_dict(row)  # frame, response_frame, tcp_stream: Wireshark's numbers
        records = self._records(row, req, resp)
        flt = self.record_filter
        matches = flt.matching(xref, records[:RECORD_LIMIT]) if flt is not None and isinstance(records, list) else []
        return {
            "req": req, "resp": resp, "status": store.status(row),
            "req_json": message_json(req, store.values), "resp_json": message_json(resp, store.values),
            "frames": frames, "records": records, "matches": matches, "xref": xref,
        }

    def _apply(self, row: int | None, data: dict | None, waited: int = 0) -> None:
        if row != self.pending_row:
            return  # the user moved on
        try:
            req_tree = self.query_one("#tree-request", MessageTree)
            resp_tree = self.query_one("#tree-response", MessageTree)
            table = self.query_one("#records", DataTable)
        except NoMatches:
            # The decode finished while the pane has no children: still being composed
            # (try again after the next refresh) or being torn down as the app closes.
            # Composing takes a refresh or two; a pane still empty after many is not
            # coming back, and the next selection decodes anew.
            if self.is_attached and waited < APPLY_REFRESHES:
                self.call_after_refresh(self._apply, row, data, waited + 1)
            return
        self.row = row
        table.clear(columns=True)
        self.record_count = 0
        self.highlight = None
        if data is None or "error" in data:
            note = "no exchange selected" if data is None else term_safe(f"could not decode: {data['error']}", 300)
            req_tree.show_message(None, None, note)
            resp_tree.show_message(None, None, "")
            self.frames = {"request": None, "response": None}
            self._render_hex()
            return
        req, resp, status = data["req"], data["resp"], data["status"]
        req_note = None if req is not None else (
            "request not in the capture" if status == "request_missing" else "request frame not kept")
        resp_note = None if resp is not None else {
            "response_missing": "no response in the capture",
            "no_response_expected": "no response expected (acks=0)",
        }.get(status, "response frame not kept" if status == "paired" else "no response")
        xref = data["xref"]
        req_tree.show_message(req, data["req_json"], req_note, xref["frame"], xref["tcp_stream"])
        resp_tree.show_message(resp, data["resp_json"], resp_note, xref["response_frame"], xref["tcp_stream"])
        self.frames = {"request": data["frames"][0], "response": data["frames"][1]}
        self.issue_offsets = {"request": _first_issue_offset(req), "response": _first_issue_offset(resp)}
        self._render_hex()
        self._fill_records(table, data["records"], data["matches"])

    def _records(self, row: int, req, resp) -> list | str:  # noqa: ANN001
        # the same records (and schema decoding) a filter on value./key. fields reads
        schemas = getattr(self.app, "schemas", None)
        if req is None and resp is None:
            return []
        try:
            return list(exchange_records(self.store, row, schemas, req, resp))
        except Exception as exc:  # noqa: BLE001 - show, never crash the app
            return f"records could not be listed: {exc}"

    def _fill_records(self, table: DataTable, rows: list | str, matches: list[int] = ()) -> None:
        tree = self.query_one("#record-tree", Tree)
        self.record_rows = [] if isinstance(rows, str) else rows[:RECORD_LIMIT]
        self.record_matches = list(matches)
        tree.set_class(any(_is_decoded(r) for r in self.record_rows), "-decoded")
        self._show_record_tree(self.record_matches[0] if self.record_matches else 0)
        if isinstance(rows, str):
            table.add_column("error")
            table.add_row(term_safe(rows, 200))
            return
        self.record_count = len(rows)
        marked = self.record_filter is not None
        matched = set(self.record_matches)
        cols = ("topic", "partition", "offset", "timestamp", "key", "value", "headers", "compression", "crc_ok")
        if marked:  # the filter names key/value fields: which records match it
            table.add_column("filter", key="match")
        for col in cols:
            table.add_column(col, key=col)
        for i, rec in enumerate(rows[:RECORD_LIMIT]):
            headers = ", ".join(f"{h.get('key')}={'null' if h.get('value') is None else h.get('value')}"
                                for h in rec.headers or [])
            ts = rec.timestamp
            mark = (Text("match", style="bold yellow") if i in matched else "",) if marked else ()
            table.add_row(
                *mark,
                term_safe(rec.topic, 60), rec.partition, rec.offset if rec.offset is not None else "",
                _record_time(ts),
                term_safe(rec.key, 60) if rec.key is not None else Text("null", style="dim"),
                term_safe(rec.value, 120) if rec.value is not None else Text("null", style="dim"),
                term_safe(headers, 120), rec.compression,
                "" if rec.crc_ok is None else ("ok" if rec.crc_ok else Text("BAD", style="bold red")),
            )
        if len(rows) > RECORD_LIMIT:
            table.add_row(f"... {len(rows) - RECORD_LIMIT} more", *[""] * (len(cols) - 1 + marked))
        if self.record_matches:  # start on the first record the filter matched
            table.move_cursor(row=self.record_matches[0])
        try:
            tab = self.query_one("#tabs", TabbedContent).get_tab("tab-records")
            label = f"Records ({len(rows)})" if rows else "Records"
            if marked and rows:
                label = f"Records ({len(rows)}, {len(self.record_matches)} match)"
            tab.label = label
        except Exception:  # noqa: BLE001 - cosmetic
            pass

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "records":
            self._show_record_tree(event.cursor_row)

    def _show_record_tree(self, index: int) -> None:
        """The decoded key and value of record ``index`` as a tree (Schema Registry
        records only; the tree is hidden when no record of the exchange decoded)."""
        tree = self.query_one("#record-tree", Tree)
        tree.clear()
        if not 0 <= index < len(self.record_rows) or not tree.has_class("-decoded"):
            return
        rec = self.record_rows[index]
        offset = "?" if rec.offset is None else rec.offset
        tree.root.set_label(term_safe(f"record {rec.topic}[{rec.partition}] @{offset}", 120))
        for which in ("key", "value"):
            text, enc = getattr(rec, which), getattr(rec, f"{which}_encoding")
            sid = getattr(rec, f"{which}_schema_id")
            label = f"{which} ({enc}, schema id {sid})" if sid is not None else f"{which} ({enc or 'null'})"
            if enc in DECODED_ENCODINGS:
                try:
                    decoded = json.loads(text)
                except ValueError:
                    decoded = text
                node = tree.root.add(term_safe(label, 120), expand=True)
                _add_value(node, decoded, 0)
            else:
                shown = "null" if text is None else text
                tree.root.add_leaf(Text.assemble(term_safe(label, 60), ": ", term_safe(shown, 120)))
        tree.root.expand()

    def _render_hex(self) -> None:
        data = self.frames.get(self.hex_side)
        other = "response" if self.hex_side == "request" else "request"
        if self.row is not None and not self.store.raw_visible(self.row):
            text = Text("raw bytes hidden: SASL frames carry credentials (run with --no-redact to show them)",
                        style="italic")
        elif data is None:
            text = Text(f"no raw {self.hex_side} frame", style="dim")
        else:
            text = Text.assemble(
                (f"{self.hex_side} frame, {len(data)} bytes (size prefix not shown); ", "bold"),
                (f"press h for the {other}\n", "dim"))
            text.append_text(hex_dump(data, self.highlight, self.issue_offsets.get(self.hex_side)))
        try:
            self.query_one("#hex", Static).update(text)
        except Exception:  # noqa: BLE001 - not mounted yet
            pass

    def toggle_hex_side(self) -> None:
        self.hex_side = "response" if self.hex_side == "request" else "request"
        self.highlight = None
        self._render_hex()

    def on_message_tree_field_selected(self, event: MessageTree.FieldSelected) -> None:
        data = self.frames.get(event.side)
        self.highlight = None
        if data is not None and event.needle:
            pos = data.find(event.needle)
            if pos >= 0:
                self.highlight = (pos, pos + len(event.needle))
                self.hex_side = event.side
        self._render_hex()


def _is_decoded(rec: Any) -> bool:
    return rec.key_encoding in DECODED_ENCODINGS or rec.value_encoding in DECODED_ENCODINGS


def _add_value(node: Any, value: Any, depth: int) -> None:
    """A decoded key/value under ``node``: objects and lists as branches, the rest as
    ``name: value`` leaves (at most MAX_CHILDREN per node, 32 levels)."""
    items = list(value.items()) if isinstance(value, dict) else (
        list(enumerate(value)) if isinstance(value, list) else None)
    if items is None or depth > 32:
        node.add_leaf(_scalar_label(value))
        return
    for name, child in items[:MAX_CHILDREN]:
        label = f"[{name}]" if isinstance(name, int) else term_safe(str(name), 60)
        if isinstance(child, dict | list) and child:
            kind = f"{{{len(child)}}}" if isinstance(child, dict) else f"[{len(child)}]"
            _add_value(node.add(f"{label} {kind}", expand=depth < 2), child, depth + 1)
        else:
            node.add_leaf(Text.assemble(label, ": ", _scalar_label(child)))
    if len(items) > MAX_CHILDREN:
        node.add_leaf(Text(f"... {len(items) - MAX_CHILDREN} more", style="dim"))


def _record_time(ts: float | None) -> str:
    if ts is None:
        return ""
    try:
        d = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return str(ts)
    return d.strftime("%Y-%m-%d %H:%M:%S.") + f"{d.microsecond // 1000:03d}"


def _first_issue_offset(msg: KafkaMessage | None) -> int | None:
    if msg is None:
        return None
    offs = [i.offset for i in msg.issues if i.offset is not None and i.severity == "error"]
    return min(offs) if offs else None
