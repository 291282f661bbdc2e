"""The TUI's export of a view is the `exchanges` table as the command writes it.

One definition of a table (export/tables.py, export/writers.py): the oracle is
`kwinspect exchanges -F jsonl|csv` run on the same capture, as a user would, and
the export of the unfiltered view must have the same bytes. A timestamp far
from today (year 385) is where the TUI's own copy of the conventions once drifted.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kwinspect.tui.exporting import write_view
from kwinspect.tui.indexer import Indexer
from kwinspect.tui.store import ExchangeStore

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((ROOT / "captures").glob("*.pcap"))


def _indexed(path: Path) -> ExchangeStore:
    store = ExchangeStore()
    ix = Indexer(store)
    ix.index_files([path])
    assert ix.error is None
    return store


def _cli(path: Path, fmt: str) -> bytes:
    return subprocess.run([sys.executable, "-m", "kwinspect", "exchanges", "-F", fmt, str(path)],
                          check=True, capture_output=True).stdout


@pytest.mark.parametrize("path", [CAPTURES[0], ROOT / "captures" / "tansu-errors.pcap"], ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_of_the_whole_view_is_the_commands_output(path, fmt, tmp_path):
    store = _indexed(path)
    out = tmp_path / f"view.{fmt}"
    n = write_view(store, range(len(store)), out)
    assert n == len(store) > 0
    assert out.read_bytes() == _cli(path, fmt)
    assert not os.path.exists(str(out) + ".part")
    store.close()


def test_a_timestamp_in_year_385_is_written_as_the_command_writes_it(tmp_path):
    """Epoch seconds far before 1970: ISO-8601 with a four-digit year, as in `exchanges`
    (the TUI's own copy of the conventions once wrote `385-07-25`)."""
    store = _indexed(ROOT / "captures" / "tansu-errors.pcap")
    store.cols["ts"][0] = -50_000_000_000.0  # the store keeps request times as float seconds
    out = tmp_path / "view.jsonl"
    write_view(store, [0], out)
    assert '"request_ts": "0385-07-25T' in out.read_text()
    store.close()
