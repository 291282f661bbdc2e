"""Closed connections are dropped from memory without changing any output or count."""

from pathlib import Path

import pytest

from kwinspect.dissect import DissectConfig
from kwinspect.run.files import FileRun, dissect_files

CAPTURES = sorted((Path(__file__).resolve().parents[1] / "captures").glob("*.pcap"))


@pytest.mark.parametrize("capture", CAPTURES[:6], ids=lambda p: p.name)
def test_keeping_one_closed_connection_changes_nothing_but_memory(capture):
    results = []
    for keep in (1_000_000, 1):
        run = FileRun()
        rows = [e.row() for e in dissect_files([capture], DissectConfig(keep_closed_connections=keep), run=run)]
        results.append((rows, run.dissector.packet_counts(), len(run.dissector.connections)))
    (rows_all, counts_all, conns_all), (rows_one, counts_one, conns_one) = results
    assert rows_one == rows_all
    assert counts_one == counts_all and run.dissector.packet_accounting_error() is None
    assert conns_one <= 1 < conns_all
