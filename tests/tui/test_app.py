"""The real app, driven headless with Pilot, on real shipped captures."""

from __future__ import annotations

import csv
import json

from textual.widgets import DataTable, Input, Tree

from kwinspect.model import EXCHANGE_COLUMNS, Exchange
from kwinspect.run.files import dissect_file
from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.widgets.exchange_list import ExchangeList

from .conftest import CAPTURES, indexed, wait_for

SIZE = (200, 50)


def line_text(lst: ExchangeList, y: int) -> str:
    return "".join(seg.text for seg in lst.render_line(y))


async def type_filter(pilot, expr: str) -> None:
    await pilot.press("slash")
    inp = pilot.app.screen.query_one("#filter-input", Input)
    inp.value = ""
    await pilot.press(*[c if c != " " else "space" for c in expr])
    await pilot.press("enter")


async def test_opens_capture_and_lists_every_exchange(produce_consume):
    expected = [e for e in dissect_file(produce_consume) if isinstance(e, Exchange)]
    app = KwinspectApp([produce_consume])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        lst = app.screen.list
        assert lst.count == len(expected)
        assert [app.store.row_dict(r) for r in range(len(expected))] == [e.row() for e in expected]
        # a file opens at its first exchange, like Wireshark; End goes to the last
        assert lst.cursor == 0 and not lst.follow
        await pilot.press("end")
        assert lst.cursor == lst.count - 1
        await pilot.press("home")
        assert lst.cursor == 0
        first = line_text(lst, 0)
        assert expected[0].api_name in first and expected[0].client in first
        status = str(app.screen.query_one("#status").render())
        assert f"{len(expected)} exchanges" in status


async def test_filter_bar_uses_the_filter_language(produce_consume):
    app = KwinspectApp([produce_consume])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        total = main.list.count
        await type_filter(pilot, 'api == "Produce"')
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "filter")
        rows = [main.list.row_at(i) for i in range(main.list.count)]
        assert 0 < len(rows) < total
        assert all(app.store.row_dict(r)["api_name"] == "Produce" for r in rows)
        # a bad expression is reported and leaves the view alone
        await type_filter(pilot, "latency_ms >")
        await pilot.pause()
        assert main.query_one("FilterBar").has_class("-invalid")
        assert main.list.count == len(rows)
        # ctrl+r clears everything
        await pilot.press("escape", "ctrl+r")
        await pilot.pause()
        assert main.list.count == total and main.spec.identity


async def test_produce_request_tree_and_records(produce_consume):
    manifest = json.loads((CAPTURES / "confluent-mock-produce-consume.manifest.json").read_text())
    produced = {(r["key"], r["value"]) for r in manifest["produced"]}
    app = KwinspectApp([produce_consume], initial_filter='api == "Produce"')
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "filter")
        await pilot.press("home", "enter")
        await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail")
        tree = main.query_one("#tree-request", Tree)
        assert tree.has_focus
        labels = []

        def walk(node, depth=0):
            labels.append(str(node.label))
            for child in node.children:
                walk(child, depth + 1)

        # expand the first topic and partition like a user would (lazy children)
        body = next(n for n in tree.root.children if str(n.label).startswith("body"))
        topic_data = next(n for n in body.children if str(n.label).startswith("topic_data"))
        topic0 = topic_data.children[0]
        topic0.expand()
        await pilot.pause()
        partition_data = next(n for n in topic0.children if str(n.label).startswith("partition_data"))
        partition_data.expand()
        await pilot.pause()
        partition_data.children[0].expand()
        await pilot.pause()
        walk(tree.root)
        assert any(label.startswith("records") for label in labels)
        assert any("acks" in label for label in labels)
        # the records tab lists what the producer sent (ground truth from the manifest)
        await pilot.press("3")
        table = main.query_one("#records", DataTable)
        assert table.row_count == main.detail.record_count > 0
        keys = [str(table.get_cell_at((i, 4))) for i in range(table.row_count)]
        values = [str(table.get_cell_at((i, 5))) for i in range(table.row_count)]
        for k, v in zip(keys, values, strict=True):
            assert (None if k == "null" else k, v) in produced
        headers = str(table.get_cell_at((0, 6)))
        assert headers.startswith("seq=")
        # selecting a field highlights its bytes in the hex view of the raw frame
        await pilot.press("1")
        header = next(n for n in tree.root.children if str(n.label) == "header")
        client_node = next(n for n in header.children if "client_id" in str(n.label))
        tree.move_cursor(client_node)
        await pilot.pause()
        frame = main.detail.frames["request"]
        start, end = main.detail.highlight
        client_id = app.store.row_dict(main.list.current_row)["client_id"]
        assert frame[start:end] == client_id.encode()
        await pilot.press("4")
        hex_text = str(main.query_one("#hex").render())
        assert "request frame" in hex_text and "00000000" in hex_text


async def test_jump_from_error_to_its_exchange(errors_capture):
    app = KwinspectApp([errors_capture])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ErrorsScreen", "errors screen")
        errors = app.screen
        target = next(i for i, e in enumerate(errors.shown) if e.name == "NOT_ENOUGH_REPLICAS")
        err = errors.shown[target]
        table = errors.query_one(DataTable)
        table.move_cursor(row=target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "MainScreen", "main screen")
        main = app.screen
        row = main.list.current_row
        got = app.store.row_dict(row)
        assert "NOT_ENOUGH_REPLICAS" in got["error_names"]
        assert got["correlation_id"] == err.correlation_id and got["stream"] == err.stream
        await wait_for(pilot, lambda: main.detail.row == row, "detail of the exchange")


async def test_quick_toggles_and_latency_sort(errors_capture):
    app = KwinspectApp([errors_capture])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        store = app.store
        total = main.list.count

        async def settled():
            await wait_for(pilot, lambda: main.computing is None, "view")
            await pilot.pause()

        def shown():
            return [main.list.row_at(i) for i in range(main.list.count)]

        await pilot.press("E")
        await settled()
        assert 0 < main.list.count < total
        assert all(store.has_error(r) for r in shown())
        await pilot.press("E", "s")
        await settled()
        lats = [store.row_dict(r)["latency_ms"] for r in shown()]
        known = [x for x in lats if x is not None]
        assert known == sorted(known, reverse=True) and known[0] > 50  # the mock delayed broker 1 by 60 ms
        await pilot.press("s", "home")
        await settled()
        api = store.api_label(main.list.current_row)
        await pilot.press("a")
        await settled()
        assert {store.api_label(r) for r in shown()} == {api}
        await pilot.press("a", "n")
        await settled()
        streams = {store.stream(r) for r in shown()}
        assert len(streams) == 1 and main.list.count < total


async def test_export_current_view(errors_capture, tmp_path):
    app = KwinspectApp([errors_capture], initial_filter="error")
    exported = []
    async with app.run_test(size=SIZE, message_hook=lambda m: exported.append(m)
                            if isinstance(m, KwinspectApp.Exported) else None) as pilot:
        await indexed(pilot)
        main = app.screen
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "filter")
        want = [app.store.row_dict(main.list.row_at(i)) for i in range(main.list.count)]
        for n, ext in enumerate(("jsonl", "csv")):
            await pilot.press("x")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ExportScreen", "export dialog")
            app.screen.query_one(Input).value = str(tmp_path / f"view.{ext}")
            await pilot.press("enter")
            await wait_for(pilot, lambda n=n: len(exported) > n, "export")
    assert [e.count for e in exported] == [len(want)] * 2 and want
    rows = [json.loads(line) for line in (tmp_path / "view.jsonl").read_text().splitlines()]
    assert [list(r) for r in rows] == [list(EXCHANGE_COLUMNS)] * len(want)
    assert [r["correlation_id"] for r in rows] == [w["correlation_id"] for w in want]
    assert rows[0]["request_ts"].endswith("Z")
    with (tmp_path / "view.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == EXCHANGE_COLUMNS
    assert len(rows) == len(want) + 1
    assert json.loads(rows[1][EXCHANGE_COLUMNS.index("error_names")]) == want[0]["error_names"]


async def test_other_views_open(produce_consume):
    app = KwinspectApp([produce_consume])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await pilot.press("c")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ConnectionsScreen", "connections")
        conns = app.screen.query_one("#conns", DataTable)
        n_streams = len({app.store.stream(r) for r in range(len(app.store))})
        assert conns.row_count >= n_streams
        versions = app.screen.query_one("#version-table", DataTable)
        assert versions.row_count > 0
        await pilot.press("escape", "l")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "LatencyScreen", "latency")
        lat = app.screen.query_one("#lat-table", DataTable)
        apis = [str(lat.get_cell_at((i, 0))) for i in range(lat.row_count)]
        assert "Produce" in apis and "(all)" in apis
        await pilot.press("escape", "question_mark")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "help")
        await pilot.press("escape")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "MainScreen", "main")
