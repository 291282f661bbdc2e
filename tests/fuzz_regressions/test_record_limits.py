"""Record batches a limit stopped are accounted for where the user looks (issue: a 1 GiB
gzip bomb in a Produce used to vanish: no records, no errors row, nothing on stderr).

The capture comes from record_bombs.py: one Produce with a bomb batch (partition 0) and
an ordinary batch of 3 records (partition 1), both encoded by kafka-python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_regressions import record_bombs

ROOT = Path(__file__).resolve().parents[2]
LINE = "kwinspect: 1 record batch problem (1 limit_exceeded)"


def _kw(*args: str) -> tuple[list[dict], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "kwinspect", *args, "-q"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], proc.stderr


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> str:
    return str(record_bombs.write(tmp_path_factory.mktemp("bombs") / "bomb.pcap"))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_records_prints_the_good_batch_and_counts_the_stopped_one_on_stderr(capture, jobs):
    rows, err = _kw("records", "-F", "jsonl", "-j", jobs, capture)
    assert [(r["partition"], r["value"]) for r in rows] == [(1, v.decode()) for v in record_bombs.GOOD_VALUES]
    assert err.strip().splitlines() == [
        f"{LINE}: their records are missing or incomplete in this output; `kwinspect errors --records` lists them"]


def test_errors_with_records_lists_the_stopped_batch_with_its_exchange(capture):
    rows, _ = _kw("errors", "--records", "-F", "jsonl", capture)
    (bomb,) = [r for r in rows if r["kind"] == "limit_exceeded"]
    assert bomb["api_name"] == "Produce" and bomb["correlation_id"] == 1
    assert "decompression bomb" in bomb["message"]
    assert bomb["path"].startswith("topic_data[0].partition_data[0].records")
    (ex,), _ = _kw("exchanges", "-F", "jsonl", capture)
    assert (bomb["frame"], bomb["tcp_stream"]) == (ex["frame"], ex["tcp_stream"])


def test_without_records_errors_and_summary_say_nothing_was_decoded(capture):
    rows, _ = _kw("errors", "-F", "jsonl", capture)
    assert not [r for r in rows if r["kind"] == "limit_exceeded"]  # not decompressed: not known
    summary = subprocess.run([sys.executable, "-m", "kwinspect", "summary", capture], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout
    assert "4 records (counted from batch headers, not decoded)" in summary
