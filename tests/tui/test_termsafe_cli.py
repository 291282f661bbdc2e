"""Hostile strings from the wire are escaped on screen; the CLI wiring of `kwinspect tui`."""

from __future__ import annotations

import queue

from kwinspect import cli
from kwinspect.model import ErrorRow, Exchange
from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.indexer import END

from .conftest import wait_for

EVIL_CLIENT = "evil\x1b[2J\x1b]52;c;aGk=\x07"
EVIL_TOPIC = "orders\u202e\r\n"


def _exchange(i: int) -> Exchange:
    return Exchange(stream="10.0.0.1:5000->10.0.0.2:9092", client="10.0.0.1:5000", broker="10.0.0.2:9092",
                    api_key=3, api_name="Metadata", api_version=12, correlation_id=i, client_id=EVIL_CLIENT,
                    request_ts=1_700_000_000.0 + i, response_ts=1_700_000_000.1 + i, latency_ms=100.0,
                    request_size=50, response_size=60, status="paired", error_codes=[3],
                    error_names=["UNKNOWN_TOPIC\x1b[31m"], topics=[EVIL_TOPIC], index=i + 1)


async def test_control_characters_are_escaped_everywhere():
    q: queue.Queue = queue.Queue()
    app = KwinspectApp(live=q)
    async with app.run_test(size=(220, 30)) as pilot:
        for i in range(3):
            q.put(_exchange(i))
        q.put(ErrorRow(kind="kafka_error", code=3, name="UNKNOWN_TOPIC", api_name="Metadata", correlation_id=0,
                       topic=EVIL_TOPIC, message="bad\x1b[0m", stream="10.0.0.1:5000->10.0.0.2:9092", ts=1.0))
        q.put(END)
        main = app.screen
        await wait_for(pilot, lambda: main.list.count == 3, "rows")
        line = "".join(seg.text for seg in main.list.render_line(0))
        assert "\x1b" not in line and "\r" not in line and "\u202e" not in line
        assert "\\x1b" in line and "\\u202e" in line
        # everything the terminal receives for the screen
        await pilot.press("e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ErrorsScreen", "errors")
        table = app.screen.query_one("DataTable")
        cells = " ".join(str(table.get_cell_at((0, c))) for c in range(8))
        assert "\x1b" not in cells and "\\x1b" in cells and "\\u202e" in cells


def test_tui_subcommand_parses():
    args = cli.build_parser().parse_args(["tui", "x.pcap", "--kafka-ports", "9092-9094", "-f", "error"])
    assert args.pcap == ["x.pcap"] and args.filter == "error" and not args.live
    args = cli.build_parser().parse_args(["tui", "--live", "-i", "eth0"])
    assert args.live and args.interface == "eth0"


def test_tui_subcommand_errors(tmp_path, capsys):
    assert cli.main(["tui", str(tmp_path / "missing.pcap")]) == 1
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a capture at all")
    assert cli.main(["tui", str(bad)]) == 1
    capsys.readouterr()
    assert cli.main(["tui", "--live", "-i", "kw-no-such-if0"]) == 1
    assert "no such interface" in capsys.readouterr().err
    assert cli.main(["tui", "--live", "-i", "lo", str(bad)]) == 2
    assert cli.main(["tui", "--filter", "latency_ms >", str(bad)]) in (1, 2)
