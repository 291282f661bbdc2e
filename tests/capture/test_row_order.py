"""Rows come in capture order: exchanges by the time of their request's first byte,
error rows by their time, whatever order the responses completed in, with --jobs too."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.pcapgen import conversation, write_pcap

from kwinspect.model import Exchange
from kwinspect.run.files import dissect_files
from kwinspect.run.parallel import dissect_files_parallel
from kwinspect.stream import row_order
from kwinspect.stream.row_order import RowOrder

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((ROOT / "captures").glob("*.pcap"))
DEMO = ROOT / "captures" / "confluent-mock-produce-consume.pcap"


def cli(table: str, path: Path, jobs: int) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "kwinspect", table, "-F", "jsonl", "-j", str(jobs), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_row_order_releases_below_the_watermark_and_keeps_ties_in_arrival_order():
    rows = RowOrder(max_rows=10)
    for key, name in [(5, "e"), (1, "a"), (3, "c1"), (3, "c2"), (9, "z")]:
        rows.push(key, name)
    assert rows.pop_ready(4) == ["a", "c1", "c2"]
    assert rows.pop_ready(4) == []
    assert rows.pop_all() == ["e", "z"]


def test_row_order_holds_at_most_max_rows():
    rows = RowOrder(max_rows=3)
    for key in range(10, 0, -1):
        rows.push(key, key)
    assert rows.pop_ready(0) == [1, 2, 3, 4, 5, 6, 7]  # nothing is ready: the oldest go early
    assert len(rows) == 3


def test_the_demo_capture_has_responses_completing_out_of_request_order():
    """What makes the next tests able to fail: in completion order the rows would not be sorted."""
    rows = [r for r in cli("exchanges", DEMO, 1) if r["request_ts"] and r["response_ts"]]
    assert any(a["request_ts"] < b["request_ts"] and a["response_ts"] > b["response_ts"]
               for i, a in enumerate(rows) for b in rows[i + 1:])


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_exchanges_are_in_request_order_and_errors_in_time_order(path, jobs):
    starts = [r["request_ts"] or r["response_ts"] for r in cli("exchanges", path, jobs)]
    assert starts == sorted(starts)
    times = [r["ts"] for r in cli("errors", path, jobs) if r["ts"]]
    assert times == sorted(times)


def _rows(events) -> list:
    return [(type(ev).__name__, ev.row()) for ev in events]


@pytest.mark.parametrize("path", [DEMO, ROOT / "captures" / "confluent-mock-transactions.pcap"], ids=lambda p: p.name)
def test_jobs_give_the_same_order_when_the_held_rows_overflow(path, monkeypatch):
    """With room for 3 rows, early releases put some rows out of order; --jobs must
    release the same ones (it computes the same watermarks at the same packets)."""
    monkeypatch.setattr(row_order, "MAX_HELD_ROWS", 3)
    one = _rows(dissect_files([path]))
    two = _rows(dissect_files_parallel([path], jobs=2))
    assert one == two
    assert [r for kind, r in one if kind == "Exchange"]


def _api_versions(cid: int) -> tuple[bytes, bytes]:
    """An ApiVersions v0 request and its response, size-prefixed (the v0 layout)."""
    req = struct.pack(">hhih", 18, 0, cid, 4) + b"test"
    resp = struct.pack(">ihi", cid, 0, 1) + struct.pack(">hhh", 18, 0, 3)
    return struct.pack(">i", len(req)) + req, struct.pack(">i", len(resp)) + resp


def _stuck_and_busy(path: Path) -> None:
    """Connection A sends a request at t=0 that is never answered and stays open;
    connection B then makes 200 exchanges, one a second."""
    stuck_req, _ = _api_versions(1)
    a = conversation(("10.0.0.1", 40001), ("10.0.0.9", 9092), [("c", stuck_req)], close=None, dt=0.001)
    msgs = []
    for cid in range(1, 201):
        req, resp = _api_versions(cid)
        msgs += [("c", req), ("s", resp)]
    b = conversation(("10.0.0.2", 40002), ("10.0.0.9", 9092), msgs, ts0=1_700_000_001.0, dt=0.5, acks=False)
    write_pcap(path, sorted(a + b, key=lambda seg: seg.ts))


@pytest.mark.parametrize("max_wait, released_while_reading", [(1e9, False), (60.0, True)])
def test_a_request_never_answered_holds_rows_back_only_for_max_wait(tmp_path, monkeypatch, max_wait,
                                                                    released_while_reading):
    """Rows after a pending request wait for it, but past MAX_WAIT_SECONDS of capture
    time it stops holding them back (memory stays bounded on a long capture)."""
    path = tmp_path / "stuck.pcap"
    _stuck_and_busy(path)
    monkeypatch.setattr(row_order, "MAX_WAIT_SECONDS", max_wait)
    monkeypatch.setattr("kwinspect.run.loop.WATERMARK_EVERY", 16)
    early: list = []

    class Spy(RowOrder):
        def pop_ready(self, watermark):
            out = super().pop_ready(watermark)
            early.extend(out)
            return out

    monkeypatch.setattr("kwinspect.run.loop.RowOrder", Spy)
    exchanges = [e for e in dissect_files([path]) if isinstance(e, Exchange)]
    assert len(exchanges) == 201
    early_exchanges = [e for e in early if isinstance(e, Exchange)]
    if released_while_reading:
        assert 150 <= len(early_exchanges) < 200  # the last few wait for the end
        assert exchanges[-1].status == "paired" and exchanges[len(early_exchanges)].status == "response_missing"
    else:
        assert early_exchanges == []
        assert exchanges[0].status == "response_missing"  # its request came first
