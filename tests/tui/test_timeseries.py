"""The traffic-over-time view (`t`): what it shows equals `kwinspect stats --by api` of the
same capture at the interval the view names (the CLI's series are the oracle: they are
made by another code path, analyze/stats.py, and checked against `summary` themselves)."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from textual.widgets import DataTable

from kwinspect.cli import main
from kwinspect.tui.app import KwinspectApp

from .conftest import CAPTURES, indexed, wait_for
from .test_screens import screen_text

ERRORS = CAPTURES / "confluent-mock-errors.pcap"
PRODUCE_CONSUME = CAPTURES / "confluent-mock-produce-consume.pcap"


def _stats(pcap, interval: str, tmp_path) -> list[dict]:
    out = tmp_path / "stats.jsonl"
    assert main(["stats", "-q", str(pcap), "--by", "api", "--series", "requests,latency",
                 "--interval", interval, "-o", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("pcap", [ERRORS, PRODUCE_CONSUME])
async def test_the_view_shows_the_stats_series(pcap, tmp_path):
    app = KwinspectApp([pcap])
    async with app.run_test(size=(180, 50)) as pilot:
        await indexed(pilot)
        await pilot.press("t")
        await wait_for(pilot, lambda: "Traffic over time" in screen_text(app), "the traffic view")
        text = screen_text(app)
        table = app.screen.query_one("#ts-table", DataTable)
        shown = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)[1:]]
                 for i in range(table.row_count)}
    m = re.search(r"; ([\d.]+ m?s) intervals", text)
    assert m, text[:400]
    interval = m.group(1).replace(" ", "")
    seconds = float(interval[:-2]) / 1000 if interval.endswith("ms") else float(interval[:-1])
    rows = _stats(pcap, interval, tmp_path)
    requests, per_interval, p99 = defaultdict(int), defaultdict(int), defaultdict(float)
    for r in rows:
        if r["series"] == "requests":
            requests[r["api_name"]] += r["amount"]
            per_interval[r["api_name"]] = max(per_interval[r["api_name"]], r["amount"])
        elif r["series"] == "latency_p99_ms":
            p99[r["api_name"]] = max(p99[r["api_name"]], r["amount"])
    assert set(shown) == set(requests)
    for api, (count, peak, _mean, worst) in shown.items():
        assert int(count.replace(",", "")) == requests[api], api
        assert float(peak.replace(",", "")) == pytest.approx(per_interval[api] / seconds, abs=0.05), api
        if api in p99:
            assert float(worst) == pytest.approx(p99[api], abs=5e-4), api
        else:
            assert worst == "-", api
    assert "requests/s per api" in text and "p99 latency per api" in text


async def test_the_view_covers_the_current_filter():
    app = KwinspectApp([ERRORS], initial_filter='api == "Produce"')
    async with app.run_test(size=(120, 40)) as pilot:
        await indexed(pilot)
        await pilot.pause(0.3)
        await pilot.press("t")
        await wait_for(pilot, lambda: "Traffic over time" in screen_text(app), "the traffic view")
        table = app.screen.query_one("#ts-table", DataTable)
        apis = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert apis == ["Produce"]
        await pilot.press("escape")
        await wait_for(pilot, lambda: "Traffic over time" not in screen_text(app), "back to the list")


async def test_a_live_view_draws_the_new_exchanges_in():
    """Live mode: the unfiltered traffic view is redrawn as exchanges come in from the feed."""
    import queue

    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_file
    from kwinspect.tui.indexer import END

    evs = [e for e in dissect_file(PRODUCE_CONSUME) if isinstance(e, Exchange)]
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q, label="test feed")

    def total() -> int:
        table = app.screen.query_one("#ts-table", DataTable)
        return sum(int(str(table.get_row_at(i)[1]).replace(",", "")) for i in range(table.row_count))

    async with app.run_test(size=(120, 40)) as pilot:
        main = app.screen
        for ev in evs[:20]:
            q.put(ev)
        await wait_for(pilot, lambda: main.list.count == 20, "first rows")
        await pilot.press("t")
        await wait_for(pilot, lambda: "Traffic over time" in screen_text(app), "the traffic view")
        assert total() == 20
        for ev in evs[20:]:
            q.put(ev)
        q.put(END)
        await wait_for(pilot, lambda: total() == len(evs), "the new exchanges drawn in", steps=1500)
