"""The Deliveries view (`J`): every acknowledged record, its journey, jumps to the exchanges.

Expected values come from the capture's manifest (what the producer's delivery
reports and the consumer logged), never from the TUI or the tracker itself.
"""

from __future__ import annotations

from textual.widgets import DataTable

from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.screens.deliveries import DeliveriesScreen
from kwinspect.tui.screens.main import MainScreen
from rig.manifest import Manifest

from .conftest import CAPTURES, indexed, wait_for

SIZE = (200, 50)


async def test_deliveries_view_lists_every_record_and_jumps_to_its_fetch(produce_consume):
    m = Manifest.read(CAPTURES / "confluent-mock-produce-consume.manifest.json")
    consumed = {(r.topic, r.partition, r.offset): r for r in m.consumed}
    app = KwinspectApp([produce_consume])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await pilot.press("J")
        await wait_for(pilot, lambda: isinstance(app.screen, DeliveriesScreen), "deliveries screen")
        screen = app.screen
        await wait_for(pilot, lambda: screen.rows is not None, "deliveries rows")
        table = screen.query_one("#records", DataTable)
        assert sorted((r["topic"], r["partition"], r["offset"]) for r in screen.rows) == \
            sorted((r.topic, r.partition, r.offset) for r in m.produced)
        assert table.row_count == len(m.produced)

        # the fourth record: its journey names the consumer and group the manifest logged
        table.move_cursor(row=3)
        await pilot.pause()
        row = screen.current
        want = consumed[(row["topic"], row["partition"], row["offset"])]
        steps = [(s["step"], s["who"]) for s in screen.steps]
        assert steps[:2] == [("produce", "demo-producer"), ("ack", "demo-producer")]
        assert ("fetch 1", want.client_id) in steps and steps[-1] == ("commit", want.group_id)
        assert screen.steps[1]["what"] == f"offset {want.offset}"

        # Tab into the journey, pick the fetch, Enter: the list shows that Fetch exchange
        fetch_at = next(n for n, s in enumerate(screen.steps) if s["step"] == "fetch 1")
        steps_table = screen.query_one("#steps", DataTable)
        steps_table.focus()
        steps_table.move_cursor(row=fetch_at)
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back to the list")
        await pilot.pause()
        main = app.screen
        d = app.store.row_dict(main.list.row_at(main.list.cursor))
        assert (d["api_name"], d["client_id"]) == ("Fetch", want.client_id)
        assert (d["stream"], d["correlation_id"]) == (screen.steps[fetch_at]["stream"],
                                                     screen.steps[fetch_at]["correlation_id"])
