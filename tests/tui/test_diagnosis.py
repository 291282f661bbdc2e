"""The Diagnosis view (`D`): findings from the indexing process, evidence, jump to the exchange.

Expected findings come from `kwinspect diagnose -F jsonl` run on the same capture,
never from the TUI itself.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from pathlib import Path

from textual.widgets import DataTable

from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.screens.diagnosis import DiagnosisScreen
from kwinspect.tui.screens.main import MainScreen

from .conftest import indexed, wait_for

SIZE = (200, 50)


def cli_findings(path: Path) -> list[dict]:
    exe = Path(sys.executable).with_name("kwinspect")
    out = subprocess.run([str(exe), "diagnose", str(path), "-F", "jsonl"], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def selected(app: KwinspectApp) -> tuple[str, int | None]:
    main = app.screen
    assert isinstance(main, MainScreen)
    row = main.list.row_at(main.list.cursor)
    d = app.store.row_dict(row)
    return d["stream"], d["correlation_id"]


async def test_diagnosis_lists_findings_and_jumps_to_evidence(errors_capture):
    expected = cli_findings(errors_capture)
    by_kind = {f["kind"]: f for f in expected}
    assert by_kind["apiversions_fallback"]["severity"] == "info"
    assert by_kind["apiversions_failed"]["severity"] == "info"  # the admin client closed it itself

    app = KwinspectApp([errors_capture])
    async with app.run_test(size=SIZE) as pilot:
        await indexed(pilot)
        await wait_for(pilot, lambda: app.store.findings_generation > 0, "findings")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, DiagnosisScreen), "diagnosis screen")
        screen = app.screen
        await pilot.pause()
        shown = screen.shown
        # the same findings as the CLI, most severe first
        assert [(f["kind"], f["severity"], f["title"], f["count"]) for f in shown] == \
            [(f["kind"], f["severity"], f["title"], f["count"]) for f in expected]
        table = screen.query_one("#findings", DataTable)
        assert table.row_count == len(expected)
        rank = {"error": 0, "warning": 1, "info": 2}
        assert [rank[f["severity"]] for f in shown] == sorted(rank[f["severity"]] for f in shown)

        # select apiversions_fallback (5 connections), move into its evidence, Enter on the last item
        idx = next(n for n, f in enumerate(shown) if f["kind"] == "apiversions_fallback")
        table.move_cursor(row=idx)
        await pilot.pause()
        assert screen.current["kind"] == "apiversions_fallback"
        evidence = by_kind["apiversions_fallback"]["evidence"]
        ev_table = screen.query_one("#evidence", DataTable)
        assert ev_table.row_count == len(evidence) > 1
        ev_table.focus()
        ev_table.move_cursor(row=len(evidence) - 1)
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back to the list")
        await pilot.pause()
        target = evidence[-1]
        assert selected(app) == (target["stream"], target["correlation_id"])

        # Enter on a finding itself: its first evidence
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, DiagnosisScreen), "diagnosis screen again")
        screen = app.screen
        await pilot.pause()
        idx = next(n for n, f in enumerate(screen.shown) if f["kind"] == "apiversions_failed")
        screen.query_one("#findings", DataTable).move_cursor(row=idx)
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back to the list again")
        await pilot.pause()
        first = by_kind["apiversions_failed"]["evidence"][0]
        assert selected(app) == (first["stream"], first["correlation_id"])


async def test_live_feed_is_diagnosed_too(errors_capture):
    from kwinspect.analyze.diagnose import Diagnoser
    from kwinspect.run.files import dissect_file
    from kwinspect.tui.indexer import END

    evs = list(dissect_file(errors_capture))
    expected = Diagnoser(deliveries=True).add_all(evs).findings()  # live: events only, no connection-end info
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, label="test feed")
    async with app.run_test(size=SIZE) as pilot:
        for ev in evs:
            q.put(ev)
        q.put(END)
        await wait_for(pilot, app.indexer.done.is_set, "live feed end")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, DiagnosisScreen), "diagnosis screen")
        await pilot.pause()
        assert [(f["kind"], f["title"], f["count"]) for f in app.screen.shown] == \
            [(f.kind, f.title, f.count) for f in expected]
