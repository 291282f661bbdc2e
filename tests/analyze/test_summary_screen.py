"""`kwinspect summary` as printed at 80 columns, checked against other outputs.

Oracles: `kwinspect exchanges -F jsonl` (the per-exchange writer, not the summary
builder) for what the APIs table must count; the 80-column rule itself for layout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
PUBLIC = Path(__file__).resolve().parents[3] / "shared" / "captures-public"


def kw(*argv: str, columns: int = 80) -> str:
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *argv], check=True, capture_output=True,
                          text=True, env=dict(os.environ, COLUMNS=str(columns))).stdout


def all_captures() -> list[Path]:
    return sorted(CAPTURES.glob("*.pcap")) + sorted(PUBLIC.glob("*.pcap*"))


@pytest.mark.parametrize("capture", all_captures(), ids=lambda p: p.name)
def test_summary_fits_80_columns(capture):
    text = kw("summary", str(capture))
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)


def test_api_table_counts_errors_and_unanswered_apart():
    capture = str(CAPTURES / "confluent-mock-errors.pcap")
    rows = [json.loads(line) for line in kw("exchanges", capture, "-F", "jsonl").splitlines()]
    errors = Counter(r["api_name"] for r in rows if r["error_codes"])
    unanswered = Counter(r["api_name"] for r in rows if r["status"] == "response_missing")
    assert unanswered  # the capture has requests never answered, so the test can fail
    lines = kw("summary", capture).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("APIs"))
    header = lines[start + 1].split()
    assert header[:5] == ["api", "count", "errors", "unanswered", "p50"]
    for line in lines[start + 3:]:
        if not line.strip() or not line[0].isalpha() or line.startswith("Kafka errors"):
            break
        cells = line.split()
        api = cells[0]
        assert int(cells[2]) == errors.get(api, 0), line
        assert int(cells[3]) == unanswered.get(api, 0), line
    summary = json.loads(kw("summary", capture, "-F", "json"))
    assert {a["api"]: a["unanswered"] for a in summary["apis"]} == {
        a["api"]: unanswered.get(a["api"], 0) for a in summary["apis"]}


def test_a_long_path_is_cut_from_the_left(tmp_path):
    deep = tmp_path / ("a-very-long-folder-name-" * 6) / "the-capture-file.pcap"
    deep.parent.mkdir(parents=True)
    shutil.copy(CAPTURES / "confluent-mock-errors.pcap", deep)
    first = kw("summary", str(deep)).splitlines()[0]
    assert first.startswith("Capture …") and first.endswith("the-capture-file.pcap") and len(first) <= 80


def test_anomaly_examples_say_what_the_bytes_were():
    text = kw("summary", str(CAPTURES / "confluent-mock-errors.pcap"), columns=160)
    assert "1 byte after the Metadata v13 response body" in text
    assert "1 bytes" not in text
