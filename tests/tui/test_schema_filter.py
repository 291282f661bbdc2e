"""The filter bar on decoded record keys and values (`value.order_id == 7`), on the
shipped capture of confluent-kafka's own serializers.

What a user sees is checked: the list rows on the screen after typing the filter,
the records the detail pane marks, the error text in the filter bar.  The expected
exchanges come from the capture's manifest: what the serializers were given
(``schema_values``), what the producer had delivered (``produced``) and what the
consumer got (``consumed``), never from kwinspect.
"""

from __future__ import annotations

import json

import pytest
from textual.widgets import DataTable

from kwinspect.analyze.schema_source import FolderSchemas
from kwinspect.analyze.schema_values import SchemaValues
from kwinspect.tui.app import KwinspectApp

from .conftest import CAPTURES, indexed, wait_for
from .test_app import type_filter
from .test_screens import screen_text

NAME = "confluent-mock-schemas"
PCAP = CAPTURES / f"{NAME}.pcap"
SCHEMAS = CAPTURES / f"{NAME}.schemas"
MANIFEST = json.loads((CAPTURES / f"{NAME}.manifest.json").read_text())
SIZE = (200, 50)


def field(obj, path: str):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def serialized(which: str, path: str, want) -> set[tuple[str, int]]:
    """(topic, offset) of the records whose key/value, as the serializer was given it,
    has ``want`` at ``path``."""
    return {(t["topic"], t["offset"]) for t in MANIFEST["schema_values"]
            if "problem" not in t and t.get(f"{which}_format") and field(t[which], path) == want}


def expected_rows(hits: set[tuple[str, int]]) -> tuple[set[str], int]:
    """(topics of the Produce rows, number of Fetch rows) the filter must leave: the
    producer's delivered records and the consumer's fetched ones among ``hits``."""
    produced = {(r["topic"], r["offset"]) for r in MANIFEST["produced"]} & hits
    consumed = {(r["topic"], r["offset"]) for r in MANIFEST["consumed"]} & hits
    assert produced, "the oracle found no record: the test would prove nothing"
    return {topic for topic, _ in produced}, 1 if consumed else 0


def list_rows(app) -> list[list[str]]:
    """The exchange list's rows as the screen shows them, split into cells."""
    lines = screen_text(app).splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("No."))
    rows = []
    for line in lines[header + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows.append(cells)
    return rows


def marked_records(table: DataTable) -> set[tuple[str, int]]:
    """(topic, offset) of the records the records tab marks as matching."""
    cols = [str(c.label) for c in table.columns.values()]
    assert cols[0] == "filter"
    t_col, o_col = cols.index("topic"), cols.index("offset")
    return {(str(table.get_cell_at((i, t_col))), int(str(table.get_cell_at((i, o_col)))))
            for i in range(table.row_count) if str(table.get_cell_at((i, 0))) == "match"}


async def settled(pilot) -> None:
    main = pilot.app.screen
    await wait_for(pilot, lambda: main.computing is None and main.result is not None, "filter")
    await pilot.pause()


@pytest.mark.parametrize(("expr", "which", "path", "want"), [
    ("value.order_id == 7", "value", "order_id", 7),  # Avro
    ("value.order_id == 107", "value", "order_id", 107),  # Protobuf
    ("value.order_id == 203", "value", "order_id", 203),  # JSON Schema
    ('value.customer.name == "carol"', "value", "customer.name", "carol"),  # all three
    ('key.customer == "bob"', "key", "customer", "bob"),  # an Avro record key
])
async def test_a_field_filter_lists_the_exchanges_holding_a_matching_record(expr, which, path, want):
    hits = serialized(which, path, want)
    produce_topics, fetches = expected_rows(hits)
    schemas = SchemaValues(FolderSchemas(str(SCHEMAS)))
    app = KwinspectApp([PCAP], schemas=schemas)
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        await type_filter(pilot, expr)
        await settled(pilot)
        rows = list_rows(app)
        # No. time client -> broker API vN corr latency status req resp topics
        shown = [(cells[5], cells[-1]) for cells in rows]
        assert sorted(t for api, t in shown if api == "Produce") == sorted(produce_topics)
        assert sum(api == "Fetch" for api, _ in shown) == fetches
        assert {api for api, _ in shown} <= {"Produce", "Fetch"}
        assert f"view {len(rows)}: {expr}" in screen_text(app)
        # each listed exchange marks exactly its matching records in the records tab
        await pilot.press("3")
        for n in range(len(rows)):
            await pilot.press("home", *["down"] * n)
            await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail")
            table = main.query_one("#records", DataTable)
            api, topics = shown[n]
            mine = {h for h in hits if h[0] in topics.split(",")}
            assert marked_records(table) == mine, (api, topics)
            assert f"Records ({table.row_count}, {len(mine)} match)" in screen_text(app)
            # the cursor starts on the first match, and its decoded tree is shown
            first = sorted(i for i in range(table.row_count) if str(table.get_cell_at((i, 0))) == "match")[0]
            assert table.cursor_row == first


async def test_a_filter_matching_no_record_lists_nothing():
    assert not serialized("value", "order_id", 9999)
    app = KwinspectApp([PCAP], schemas=SchemaValues(FolderSchemas(str(SCHEMAS))))
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await type_filter(pilot, "value.order_id == 9999")
        await settled(pilot)
        assert list_rows(app) == []
        assert "view 0: value.order_id == 9999" in screen_text(app)


@pytest.mark.parametrize(("expr", "message"), [
    ('value.order_id == "seven"', "column 'value.order_id' holds numbers, got \"seven\" at column 19"),
    ("value.order_idd == 7", "unknown column 'value.order_idd' at column 1 (did you mean value.order_id?)"),
    ('value.customer.name > 3', "column 'value.customer.name' holds text, got 3 at column 23"),
])
async def test_wrong_paths_and_types_show_the_filter_language_error(expr, message):
    app = KwinspectApp([PCAP], schemas=SchemaValues(FolderSchemas(str(SCHEMAS))))
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        total = main.list.count
        await type_filter(pilot, expr)
        await pilot.pause()
        assert message in screen_text(app)
        assert main.query_one("FilterBar").has_class("-invalid")
        assert main.list.count == total  # the view is left alone


async def test_without_schemas_a_field_filter_says_what_it_needs():
    app = KwinspectApp([PCAP])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await type_filter(pilot, "value.order_id == 7")
        await pilot.pause()
        assert ("unknown column 'value.order_id' at column 1 (fields of keys and values need "
                "--schemas or --schema-registry)") in screen_text(app)


@pytest.mark.parametrize(("args", "message"), [
    ([], "fields of keys and values need --schemas or --schema-registry"),
    (["--schemas", str(SCHEMAS)], "column 'value.order_id' holds numbers, got \"x\""),
])
def test_tui_refuses_a_bad_field_filter_before_the_screen_opens(args, message):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kwinspect.cli", "tui", str(PCAP), *args,
                           "-f", 'value.order_id == "x"' if args else "value.order_id == 7"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert message in proc.stderr


async def test_a_live_feed_is_matched_too_and_new_rows_as_they_arrive():
    """Live feeds have no frame spill: their records are matched in the app's worker
    thread, from the decoded messages the store keeps; rows that arrive after the
    filter was applied are matched as they come."""
    import queue

    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_file
    from kwinspect.tui.indexer import END

    hits = serialized("value", "order_id", 7)
    produce_topics, fetches = expected_rows(hits)
    events = list(dissect_file(PCAP))
    first_fetch = next(i for i, e in enumerate(events) if isinstance(e, Exchange) and e.api_name == "Fetch")
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, schemas=SchemaValues(FolderSchemas(str(SCHEMAS))),
                       initial_filter="value.order_id == 7")
    async with app.run_test(size=SIZE) as pilot:
        main = app.screen
        for ev in events[:first_fetch]:
            q.put(ev)
        await wait_for(pilot, lambda: main.result is not None and main.list.count == len(produce_topics),
                       "the Produce row")
        assert [(c[5], c[-1]) for c in list_rows(app)] == [("Produce", t) for t in sorted(produce_topics)]
        for ev in events[first_fetch:]:
            q.put(ev)
        q.put(END)
        await wait_for(pilot, app.indexer.done.is_set, "end of feed")
        await wait_for(pilot, lambda: main.list.count == len(produce_topics) + fetches, "the Fetch row")
        assert [c[5] for c in list_rows(app)] == ["Produce"] * len(produce_topics) + ["Fetch"] * fetches


async def test_a_field_filter_with_the_schemas_from_a_registry(tmp_path, monkeypatch):
    """`--schema-registry URL`: the filter's fields are fetched over the registry's REST
    paths (basic auth from the environment) by whichever side decodes first."""
    import http.server
    import threading

    from kwinspect.analyze.schema_source import AUTH_ENV, open_schema_source
    from tests.analyze.test_schema_values import Registry

    Registry.export = json.loads((CAPTURES / f"{NAME}.registry.json").read_text())
    Registry.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(AUTH_ENV, Registry.auth)
    hits = serialized("value", "order_id", 107)
    produce_topics, fetches = expected_rows(hits)
    try:
        source = open_schema_source(None, f"http://127.0.0.1:{server.server_address[1]}",
                                    str(tmp_path / "cache"))
        app = KwinspectApp([PCAP], schemas=SchemaValues(source))
        async with app.run_test(size=SIZE) as pilot:
            await indexed(pilot)
            await type_filter(pilot, "value.order_id == 107")
            await settled(pilot)
            shown = [(c[5], c[-1]) for c in list_rows(app)]
            assert sorted(t for api, t in shown if api == "Produce") == sorted(produce_topics)
            assert sum(api == "Fetch" for api, _ in shown) == fetches
        assert any(h.startswith("/schemas/ids/") for h in Registry.hits)
    finally:
        server.shutdown()
        server.server_close()
