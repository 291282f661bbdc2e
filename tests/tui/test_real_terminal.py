"""`kwinspect tui` in a real terminal: tmux runs it, send-keys types, capture-pane reads.

This is the user's path end to end (the console script, the indexing process,
Textual's Linux driver), which the headless Pilot tests do not cover. The
expected header values come from `kwinspect exchanges -F jsonl`, the CLI's
separate code path, not from the TUI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

CAPTURE = Path(__file__).resolve().parents[2] / "captures" / "confluent-mock-produce-consume.pcap"
KWINSPECT = [sys.executable, "-m", "kwinspect.cli"]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (`make sysdeps`)")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _wait_for_screen(session: str, cond, what: str, tries: int = 300) -> str:
    screen = ""
    for _ in range(tries):  # bounded polling, no wall-clock assertion
        screen = _tmux("capture-pane", "-t", session, "-p")
        if cond(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"{what} never appeared; the screen was:\n{screen}")


def test_open_move_down_three_rows_and_read_the_detail_pane():
    out = subprocess.run([*KWINSPECT, "exchanges", str(CAPTURE), "-F", "jsonl"],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    fourth = rows[3]
    session = f"kwinspect-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TERM": "xterm-256color"}
    cmd = " ".join([*KWINSPECT, "tui", str(CAPTURE)])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd],
                   check=True, env=env)
    try:
        first = _wait_for_screen(session, lambda s: f"{len(rows)} exchanges" in s and "correlation_id:" in s,
                                 "the indexed capture")
        # opened at the first exchange: row 1 is the first list row under the header
        lines = first.splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip().startswith("No."))
        assert lines[header + 1].split()[0] == "1"
        _tmux("send-keys", "-t", session, "Home")
        for _ in range(3):
            _tmux("send-keys", "-t", session, "Down")
        want = [f"correlation_id: {fourth['correlation_id']}", f"request_api_key: {fourth['api_key']}",
                f"request_api_version: {fourth['api_version']}", f'client_id: "{fourth["client_id"]}"']
        screen = _wait_for_screen(session, lambda s: all(w in s for w in want), "the 4th exchange's header")
        assert all(len(line) <= 80 for line in screen.splitlines())
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


SCHEMAS_CAPTURE = CAPTURE.with_name("confluent-mock-schemas.pcap")


def test_a_value_field_filter_typed_in_the_filter_bar():
    """`tui --schemas DIR`, `/`, a filter on a decoded value field, Enter: the list keeps
    the Produce and the Fetch exchange of the one record the producer serialized with
    order_id 7 (the manifest's schema_values, produced and consumed)."""
    manifest = json.loads(SCHEMAS_CAPTURE.with_suffix(".manifest.json").read_text())
    hits = {(t["topic"], t["offset"]) for t in manifest["schema_values"]
            if "problem" not in t and t["value"].get("order_id") == 7}
    assert {(r["topic"], r["offset"]) for r in manifest["produced"]} & hits
    assert {(r["topic"], r["offset"]) for r in manifest["consumed"]} & hits
    (topic, _offset), = hits
    session = f"kwinspect-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TERM": "xterm-256color"}
    schemas = SCHEMAS_CAPTURE.with_suffix(".schemas")
    cmd = " ".join([*KWINSPECT, "tui", str(SCHEMAS_CAPTURE), "--schemas", str(schemas)])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40", cmd],
                   check=True, env=env)
    try:
        _wait_for_screen(session, lambda s: "exchanges" in s and "correlation_id:" in s, "the indexed capture")
        # `/` moves the focus to the filter bar once the app has handled it: a key sent in the
        # same breath still goes to the list. So: `/`, a pause (pacing, not an assertion), a
        # probe character, until the bar shows text; then clear it (ctrl+u) and type the filter.
        def bar(s: str) -> str:
            return s.splitlines()[1].strip()

        for _ in range(5):
            _tmux("send-keys", "-t", session, "/")
            time.sleep(0.5)
            _tmux("send-keys", "-t", session, "-l", "v")
            try:
                _wait_for_screen(session, lambda s: bar(s) and not bar(s).startswith("filter (/)"),
                                 "the probe character in the filter bar", tries=30)
                break
            except AssertionError:
                continue
        _tmux("send-keys", "-t", session, "C-u")
        _wait_for_screen(session, lambda s: bar(s).startswith("filter (/)"), "the cleared filter bar")
        _tmux("send-keys", "-t", session, "-l", "value.order_id == 7")
        _wait_for_screen(session, lambda s: bar(s).startswith("value.order_id == 7"), "the typed filter")
        _tmux("send-keys", "-t", session, "Enter")
        screen = _wait_for_screen(session, lambda s: "view 2: value.order_id == 7" in s, "the filtered view")
        lines = screen.splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip().startswith("No."))
        rows = [line.split() for line in lines[header + 1: header + 4]]
        assert [r for r in rows if r and r[0].isdigit()] == rows[:2]
        assert rows[0][5] == "Produce" and rows[0][-1] == topic
        assert rows[1][5] == "Fetch" and topic in rows[1][-1].split(",")
        assert not (rows[2] and rows[2][0].isdigit())
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
