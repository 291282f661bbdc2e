"""`decode` writes a Produce/Fetch of many records as it decodes them: the same JSON line,
in bounded memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kwinspect import cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fuzz_regressions import element_floods  # noqa: E402
from helpers.peak import run_with_peak  # noqa: E402

CAPTURES = sorted((ROOT / "captures").glob("*.pcap"))


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_streamed_lines_equal_the_whole_ones(path, capsys, monkeypatch):
    assert cli.main(["decode", "-q", str(path)]) == 0
    whole = capsys.readouterr().out
    monkeypatch.setattr(cli, "STREAM_RECORDS_OVER", -1)  # every Produce/Fetch streamed
    assert cli.main(["decode", "-q", str(path)]) == 0
    assert capsys.readouterr().out == whole


def test_a_produce_of_600k_records_is_decoded_in_bounded_memory(tmp_path):
    path = element_floods.many_records(tmp_path / "many.pcap", 2, 300_000)
    proc, peak_mib = run_with_peak([sys.executable, "-m", "kwinspect", "decode", "-q", str(path)], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    batches = line["request"]["body"]["topic_data"][0]["partition_data"][0]["records"]["batches"]
    assert [len(b["records"]) for b in batches] == [300_000, 300_000]
    assert batches[1]["records"][7]["offset_delta"] == 7
    assert peak_mib < 200, peak_mib  # 40 MiB streamed; 484 MiB when the line was built whole
