"""Live mode: events arrive on a queue from another thread, at a pace the test controls."""

from __future__ import annotations

import queue

from kwinspect.model import ErrorRow, Exchange
from kwinspect.run.files import dissect_file
from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.indexer import END, ReplaySource

from .conftest import wait_for

SIZE = (200, 30)


def events(path) -> list:
    return list(dissect_file(path))


async def test_rows_stream_in_and_the_view_follows_the_tail(produce_consume):
    evs = events(produce_consume)
    exchanges = [e for e in evs if isinstance(e, Exchange)]
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, label="test feed")
    async with app.run_test(size=SIZE) as pilot:
        main = app.screen
        lst = main.list
        first, rest = exchanges[:30], exchanges[30:]
        for ev in first:
            q.put(ev)
        await wait_for(pilot, lambda: lst.count == 30, "first rows")
        assert lst.follow and lst.cursor == 29
        # more rows: the cursor stays on the newest one
        for ev in rest[:5]:
            q.put(ev)
        await wait_for(pilot, lambda: lst.count == 35, "more rows")
        assert lst.cursor == 34 and lst.current_row == app.store.first + 34
        # the user scrolls away: new rows no longer move the view
        await pilot.press("up", "up")
        assert not lst.follow
        where = lst.current_row
        for ev in rest[5:]:
            q.put(ev)
        q.put(END)
        await wait_for(pilot, lambda: lst.count == len(exchanges), "all rows")
        assert lst.current_row == where
        # End follows the tail again
        await pilot.press("end")
        assert lst.follow and lst.cursor == lst.count - 1
        await wait_for(pilot, app.indexer.done.is_set, "end of feed")


async def test_live_filter_applies_to_new_rows(errors_capture):
    evs = events(errors_capture)
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, initial_filter='api == "Produce"')
    async with app.run_test(size=SIZE) as pilot:
        main = app.screen
        await wait_for(pilot, lambda: main.result is not None, "filter ready")
        for ev in evs:
            q.put(ev)
        q.put(END)
        want = sum(1 for e in evs if isinstance(e, Exchange) and e.api_name == "Produce")
        await wait_for(pilot, lambda: main.list.count == want and app.indexer.done.is_set(), "filtered rows")
        assert all(app.store.api_label(main.list.row_at(i)) == "Produce" for i in range(main.list.count))
        # live detail comes from the kept messages (no frames are tapped in live mode)
        await pilot.press("home", "enter")
        await wait_for(pilot, lambda: main.detail.row == main.list.current_row, "detail")
        req, resp = app.store.messages(main.list.current_row)
        assert req is not None and req.api_key == 0


async def test_memory_is_bounded_in_live_mode(produce_consume):
    exchanges = [e for e in events(produce_consume) if isinstance(e, Exchange)]
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, max_rows=20)
    async with app.run_test(size=SIZE) as pilot:
        for ev in exchanges:
            q.put(ev)
        q.put(END)
        await wait_for(pilot, app.indexer.done.is_set, "end of feed")
        main = app.screen
        main.poll()
        await pilot.pause()
        store = app.store
        assert store.total == len(exchanges)
        assert len(store) <= 20 + 2 and store.first > 0
        assert main.list.count == len(store)
        # the newest row is the last exchange of the feed
        assert store.row_dict(store.total - 1) == exchanges[-1].row()
        await pilot.press("home")
        assert main.list.current_row == store.first


async def test_replay_source_feeds_the_app(errors_capture):
    source = ReplaySource([str(errors_capture)], rate=2000.0)
    app = KwinspectApp(live=source.start(), label="replay")
    n = sum(1 for e in events(errors_capture) if isinstance(e, Exchange))
    n_err = sum(1 for e in events(errors_capture) if isinstance(e, ErrorRow))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.indexer.done.is_set, "replay")
        app.screen.poll()
        await pilot.pause()
        assert app.screen.list.count == n and app.store.error_count == n_err
    source.stop.set()


async def test_q_quits(errors_capture):
    app = KwinspectApp(live=queue.Queue())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, "exit")


async def test_following_survives_a_toggle(errors_capture):
    exchanges = [e for e in events(errors_capture) if isinstance(e, Exchange)]
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q)
    async with app.run_test(size=(200, 12)) as pilot:
        main = app.screen
        lst = main.list
        half = len(exchanges) // 2
        for ev in exchanges[:half]:
            q.put(ev)
        await wait_for(pilot, lambda: lst.count == half, "first half")
        assert lst.follow
        await pilot.press("E")
        await wait_for(pilot, lambda: main.result is not None and main.computing is None, "errors only")
        for ev in exchanges[half:]:
            q.put(ev)
        q.put(END)
        want = sum(1 for e in exchanges if e.error_codes or e.status not in ("paired", "no_response_expected"))
        await wait_for(pilot, lambda: lst.count == want and app.indexer.done.is_set(), "all error rows")
        await wait_for(pilot, lambda: lst.cursor == lst.count - 1, "cursor on the newest row")
        assert lst.follow
