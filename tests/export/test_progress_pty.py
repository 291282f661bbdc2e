"""The progress bar on a real terminal (a pty): drawn while reading, gone from the screen
afterwards, and never left behind when the program reading stdout closes the pipe.

The bytes written to the pty are replayed by tests/helpers/screen.py to get the final screen.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.screen import screen

pty = pytest.importorskip("pty")
ROOT = Path(__file__).resolve().parents[2]
PCAP = "captures/tansu-produce-consume.pcap"


def _on_a_terminal(command: str) -> bytes:
    """Run a shell command with stdin, stdout and stderr on a pty; everything it drew there."""
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120", TERM="xterm",
               KWINSPECT=f"{sys.executable} -m kwinspect.cli")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(["bash", "-c", command], stdin=follower, stdout=follower, stderr=follower,
                            env=env, cwd=ROOT)
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the pty
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        proc.wait(timeout=60)
    return out


def _bar_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "reading" in line and "MB" in line]


@pytest.mark.parametrize("command", ["exchanges", "records", "decode", "exchanges -F csv", "exchanges -j 2"])
def test_no_progress_line_left_when_the_pipe_closes(command):
    inputs = " ".join([PCAP] * 200)  # ~7 MB: still reading when head has had its lines
    out = _on_a_terminal(f"$KWINSPECT {command} {inputs} | head -2")
    lines = screen(out)
    assert len([line for line in lines if line.strip()]) >= 2, lines  # head printed its lines
    assert not _bar_lines(lines), lines
    assert b"Traceback" not in out and b"Exception ignored" not in out


def test_the_bar_is_drawn_while_writing_to_a_file_and_erased_at_the_end(tmp_path):
    out = _on_a_terminal(f"$KWINSPECT exchanges {' '.join([PCAP] * 20)} -o {tmp_path / 'x.jsonl'}")
    assert b"reading" in out  # it was drawn ...
    assert not _bar_lines(screen(out)), screen(out)  # ... and is gone
    assert (tmp_path / "x.jsonl").stat().st_size > 0
