"""Fetch long polls: the `long_poll` column, and latency/summary figures without them.

The expectation is computed from `kwinspect decode` (the decoded request and response
bodies as JSON, a separate path from the exchanges table): a paired Fetch whose
response holds no record bytes and that took at least half its `max_wait_ms`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
LONG_POLLING = ["confluent-mock-produce-consume.pcap", "kafka-python-mock-group.pcap",
                "tansu-consumer-group.pcap"]


def kw(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *argv], check=True, capture_output=True,
                          text=True).stdout


def jsonl(*argv: str) -> list[dict]:
    return [json.loads(line) for line in kw(*argv).splitlines()]


def expected_long_polls(capture: str) -> list[bool]:
    out = []
    for r in jsonl("decode", capture):
        if r["api_name"] != "Fetch" or r["status"] != "paired":
            continue
        wait = r["request"]["body"]["max_wait_ms"]
        sizes = [p["records"]["size"] for t in r["response"]["body"]["responses"] for p in t["partitions"]
                 if isinstance(p.get("records"), dict)]
        out.append(wait > 0 and r["latency_ms"] >= wait / 2 and not any(sizes))
    return out


@pytest.mark.parametrize("name", LONG_POLLING)
def test_long_poll_column_matches_the_decoded_bodies(name):
    capture = str(CAPTURES / name)
    want = expected_long_polls(capture)
    assert any(want), "the capture has no long poll, so the test could not fail"
    rows = jsonl("exchanges", capture, "-F", "jsonl")
    assert [r["long_poll"] for r in rows if r["api_name"] == "Fetch" and r["status"] == "paired"] == want
    assert all(r["long_poll"] is None for r in rows if r["api_name"] != "Fetch")


@pytest.mark.parametrize("name", LONG_POLLING)
def test_latency_and_summary_leave_long_polls_out(name):
    capture = str(CAPTURES / name)
    rows = jsonl("exchanges", capture, "-F", "jsonl")
    fetches = [r for r in rows if r["api_name"] == "Fetch" and r["status"] == "paired"]
    polls = [r for r in fetches if r["long_poll"]]
    fast = sorted(r["latency_ms"] for r in fetches if not r["long_poll"])
    fetch = next(r for r in jsonl("latency", capture, "-F", "jsonl") if r["group"] == "Fetch")
    assert fetch["long_polls"] == len(polls) and fetch["count"] == len(fast)
    if fast:
        assert fetch["max_ms"] == fast[-1]
        assert fetch["max_ms"] < min(r["latency_ms"] for r in polls)
    summary = json.loads(kw("summary", capture, "-F", "json"))
    api = next(a for a in summary["apis"] if a["api"] == "Fetch")
    assert api["long_polls"] == len(polls) and api["latency_count"] == len(fast)
    assert f"Fetch: {len(polls)} long poll" in kw("summary", capture)
