"""What a user sees: the rendered screens, at 80x24 and 180x50.

Two kinds of test: assertions on the screen's text (the detail pane of a row
other than the first, the columns an 80-column list keeps, no `None` in the
errors view, whole API names in the connections view), and SVG snapshots of every
view (pytest-textual-snapshot; `pytest tests/tui --snapshot-update` rewrites them
after a deliberate change; look at the SVGs before committing them).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kwinspect.model import Exchange
from kwinspect.run.files import dissect_files
from kwinspect.tui.app import KwinspectApp

from .conftest import CAPTURES, indexed, wait_for

PRODUCE_CONSUME = CAPTURES / "confluent-mock-produce-consume.pcap"
ERRORS = CAPTURES / "confluent-mock-errors.pcap"
TANSU_ERRORS = CAPTURES / "tansu-errors.pcap"


def screen_text(app) -> str:
    """The screen as plain text, as a terminal shows it (the compositor's full frame)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      color_system=None, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def exchanges_of(path) -> list[Exchange]:
    return [e for e in dissect_files([str(path)]) if isinstance(e, Exchange)]


@pytest.mark.parametrize("size", [(80, 24), (180, 50)])
async def test_detail_pane_shows_the_fourth_exchange_after_home_and_three_downs(size):
    fourth = exchanges_of(PRODUCE_CONSUME)[3]
    app = KwinspectApp([PRODUCE_CONSUME])
    async with app.run_test(size=size) as pilot:
        await indexed(pilot)
        await pilot.press("home", "down", "down", "down")
        want = [f"correlation_id: {fourth.correlation_id}", f"request_api_key: {fourth.api_key}",
                f"request_api_version: {fourth.api_version}"]
        await wait_for(pilot, lambda: all(w in screen_text(app) for w in want), "the 4th exchange's header")
        text = screen_text(app)
        assert f'client_id: "{fourth.client_id}"' in text
        # and no loading indicator stays over the pane
        assert not app.screen.query("LoadingIndicator")


async def test_the_detail_pane_follows_the_cursor_to_the_last_row_and_back():
    exchanges = exchanges_of(PRODUCE_CONSUME)
    app = KwinspectApp([PRODUCE_CONSUME])
    async with app.run_test(size=(80, 24)) as pilot:
        await indexed(pilot)
        for key, ex in (("end", exchanges[-1]), ("home", exchanges[0]), ("pagedown", None)):
            await pilot.press(key)
            if ex is None:
                ex = exchanges[app.screen.list.cursor]
            want = f"correlation_id: {ex.correlation_id}"
            await wait_for(pilot, lambda w=want, a=ex.api_key: w in screen_text(app)
                           and f"request_api_key: {a}" in screen_text(app), f"detail after {key}")


async def test_a_file_opens_at_its_first_exchange():
    first = exchanges_of(PRODUCE_CONSUME)[0]
    app = KwinspectApp([PRODUCE_CONSUME])
    async with app.run_test(size=(80, 24)) as pilot:
        await indexed(pilot)
        lines = screen_text(app).splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip().startswith("No."))
        assert lines[header + 1].split()[0] == "1"
        await wait_for(pilot, lambda: f"correlation_id: {first.correlation_id}" in screen_text(app), "row 1")


async def test_80_columns_keep_number_time_api_latency_and_status():
    exchanges = exchanges_of(PRODUCE_CONSUME)
    app = KwinspectApp([PRODUCE_CONSUME])
    async with app.run_test(size=(80, 24)) as pilot:
        await indexed(pilot)
        lines = screen_text(app).splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip().startswith("No."))
        assert lines[header].split()[:6] == ["No.", "Time", "(UTC)", "API", "Latency", "Status"]
        for n, ex in enumerate(exchanges[:5]):
            cells = lines[header + 1 + n].split()
            assert cells[0] == str(n + 1)
            assert cells[2] == ex.api_name and cells[3] == f"v{ex.api_version}"
            assert cells[4] == f"{ex.latency_ms:.2f}"
            assert cells[5] == (",".join(dict.fromkeys(ex.error_names)) if ex.error_names else "ok")
        assert all(len(line) <= 80 for line in lines)


async def test_errors_view_never_shows_none():
    app = KwinspectApp([ERRORS])
    async with app.run_test(size=(180, 50)) as pilot:
        await indexed(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: "UNKNOWN_TOPIC_OR_PARTITION" in screen_text(app), "errors view")
        text = screen_text(app)
        assert "None" not in text
        assert "no-such-topic" in text


async def test_connections_view_shows_api_names_whole_at_80_columns():
    app = KwinspectApp([PRODUCE_CONSUME])
    async with app.run_test(size=(80, 24)) as pilot:
        await indexed(pilot)
        await pilot.press("c")
        await wait_for(pilot, lambda: "ApiVersions of" in screen_text(app), "connections view")
        text = screen_text(app)
        assert "ApiVersions (18)" in text or "Produce (0)" in text or "Metadata (3)" in text


# -- snapshots --------------------------------------------------------------------------

VIEWS = {
    "main": [],
    "detail_row4": ["home", "down", "down", "down"],
    "errors": ["e"],
    "connections": ["c"],
    "latency": ["l"],
    "timeseries": ["t"],
    "diagnosis": ["D"],
    "deliveries": ["J"],
    "help": ["question_mark"],
    "export": ["x"],
}


@pytest.mark.parametrize("size", [(80, 24), (180, 50)], ids=["80x24", "180x50"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_snapshot(snap_compare, view, size):
    keys = VIEWS[view]

    async def settle(pilot):
        await indexed(pilot)
        main = pilot.app.screen
        for key in keys:
            await pilot.press(key)
            if key in ("home", "down"):
                # the detail pane decodes in a worker: wait until it shows the row under the cursor
                await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail pane")
        await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail pane")
        await pilot.app.workers.wait_for_complete()
        for field in pilot.app.screen.query("Input"):
            field.cursor_blink = False  # a blinking cursor is on or off depending on when the picture is taken
        await pilot.pause(0.2)

    assert snap_compare(KwinspectApp([ERRORS]), terminal_size=size, run_before=settle)
