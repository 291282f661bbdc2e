"""Usage errors of the command line: exit status 2, a message that says what is wrong, no traceback.

Run as a user runs it (a subprocess), so stderr and the exit status are what a shell sees.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
PCAP = str(ROOT / "captures" / "confluent-mock-errors.pcap")


def kwinspect(*args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *args], stderr=subprocess.PIPE, env=env,
                          timeout=120, **kw)


def _usage_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    for w in words:
        assert w in last, last
    return last


@pytest.mark.parametrize("table", ["exchanges", "records", "errors", "latency"])
def test_unknown_output_extension_is_a_usage_error(tmp_path, table):
    out = tmp_path / "out.xlsx"
    _usage_error(kwinspect(table, PCAP, "-q", "-o", str(out)), "out.xlsx", "extension", "-F")
    assert not out.exists()


def test_unknown_output_extension_with_a_format_is_written(tmp_path):
    out = tmp_path / "out.xlsx"
    proc = kwinspect("errors", PCAP, "-q", "-o", str(out), "-F", "csv")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().splitlines()[0].startswith("kind,code,name")


def test_plot_with_an_unknown_extension_is_one_line(tmp_path):
    proc = kwinspect("latency", PCAP, "-q", "--plot", str(tmp_path / "p.pdf"))
    line = _usage_error(proc, "--plot", "p.pdf", ".png")
    assert proc.stderr.decode().strip() == line


@pytest.mark.parametrize("size", ["0", "5", "-1"])
def test_max_frame_size_below_the_smallest_frame(size):
    _usage_error(kwinspect("summary", PCAP, "--max-frame-size", size), "--max-frame-size", "smallest")


def test_reversed_port_range_says_reversed():
    _usage_error(kwinspect("summary", PCAP, "--kafka-ports", "9094-9092"), "reversed", "9092-9094")


def test_parquet_to_a_pipe_works():
    proc = kwinspect("records", str(ROOT / "captures" / "confluent-mock-codecs.pcap"), "-q", "-F", "parquet")
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(io.BytesIO(proc.stdout))
    assert table.num_rows > 0 and "value" in table.column_names


def test_parquet_to_a_terminal_is_refused():
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    try:
        proc = kwinspect("records", PCAP, "-q", "-F", "parquet", stdout=follower)
    finally:
        os.close(follower)
        os.close(leader)
    _usage_error(proc, "terminal")
