"""The records tab with schemas: Schema Registry values decoded, the highlighted
record's key and value as a tree (the shipped capture of confluent-kafka's own
serializers; the manifest holds what they were given)."""

from __future__ import annotations

import json

from textual.widgets import DataTable, Tree

from kwinspect.analyze.schema_source import FolderSchemas
from kwinspect.analyze.schema_values import SchemaValues
from kwinspect.tui.app import KwinspectApp

from .conftest import CAPTURES, indexed, wait_for

NAME = "confluent-mock-schemas"
SIZE = (200, 50)


def labels(node) -> list[str]:
    out = [str(node.label)]
    for child in node.children:
        out.extend(labels(child))
    return out


async def test_records_tab_shows_decoded_values_as_trees():
    manifest = json.loads((CAPTURES / f"{NAME}.manifest.json").read_text())
    truth = {(t["topic"], t["offset"]): t for t in manifest["schema_values"] if "problem" not in t}
    schemas = SchemaValues(FolderSchemas(str(CAPTURES / f"{NAME}.schemas")))
    app = KwinspectApp([CAPTURES / f"{NAME}.pcap"], initial_filter='api == "Produce"',
                       schemas=schemas)
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "filter")
        await pilot.press("home", "enter")
        await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail")
        await pilot.press("3")
        await pilot.pause()
        table = main.query_one("#records", DataTable)
        tree = main.query_one("#record-tree", Tree)
        assert table.row_count == main.detail.record_count > 1
        assert tree.display
        checked = 0
        for i, rec in enumerate(main.detail.record_rows):
            if (rec.topic, rec.offset) not in truth:
                continue  # a record framed badly on purpose: raw, no tree of it
            t = truth[(rec.topic, rec.offset)]
            table.move_cursor(row=i)
            await pilot.pause()
            shown = labels(tree.root)
            assert shown[0] == f"record {rec.topic}[0] @{rec.offset}"
            assert any(s.startswith(f"value ({rec.value_encoding}, schema id "
                                    f"{t['value_schema_id']})") for s in shown), shown
            assert f"order_id: {t['value']['order_id']}" in shown
            assert f"name: \"{t['value']['customer']['name']}\"" in shown
            checked += 1
        assert checked >= 9


async def test_without_schemas_the_records_tab_has_no_tree(produce_consume):
    app = KwinspectApp([produce_consume], initial_filter='api == "Produce"')
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        main = app.screen
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "filter")
        await pilot.press("home", "enter")
        await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail")
        await pilot.press("3")
        await pilot.pause()
        assert main.detail.record_count > 0
        assert not main.query_one("#record-tree", Tree).display
