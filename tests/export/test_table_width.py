"""The terminal table at 80 and 180 columns, as a user reads it (the CLI's own output).

Oracles: the jsonl output of the same command (a different writer) for which rows and
times to expect, and the rules themselves: no line wider than the terminal, a time of day
never cut, the date on a line of its own, a filter on `error` keeps `error_names`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.pcapgen import conversation, write_pcap
from kio.schema.metadata.v12 import request as md_req
from kio.schema.metadata.v12 import response as md_resp
from kio.static.primitive import i32
from stream.kio_frames import request_frame, response_frame

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
TIME = re.compile(r"^\d\d:\d\d:\d\d\.\d{6}$")


def run(*argv: str, columns: int) -> str:
    env = dict(os.environ, COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *argv], check=True, env=env,
                          capture_output=True, text=True).stdout


def jsonl(*argv: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "kwinspect.cli", *argv, "-F", "jsonl"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("table,capture,ts", [
    ("exchanges", "confluent-mock-produce-consume.pcap", "request_ts"),
    ("records", "confluent-mock-produce-consume.pcap", "timestamp"),
    ("errors", "confluent-mock-errors.pcap", "ts"),
    ("exchanges", "tansu-admin.pcap", "request_ts"),
])
def test_80_columns_fit_and_never_cut_a_time(table, capture, ts):
    path = str(CAPTURES / capture)
    text = run(table, path, "-F", "table", columns=80)
    lines = text.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "T…" not in text and not re.search(r"\d\d:\d\d…", text)
    rows = jsonl(table, path)
    dates = sorted({r[ts][:10] for r in rows if r[ts]})
    assert [line for line in lines if line.startswith("── ")] == [f"── {d} (UTC) ──" for d in dates]
    header = lines[0].split()
    if ts in ("request_ts", "ts") or "timestamp" in header:
        col = header.index({"request_ts": "request_time", "ts": "time"}.get(ts, ts))
        data = [line for line, _moved in table_rows(text)]  # (errors: messages moved under their rows)
        times = [line.split()[col] for line in data if line.strip()[:1].isdigit()]
        want = [r[ts][11:26] for r in rows if r[ts]]
        assert times == want


def test_exchanges_at_80_columns_keep_time_api_latency_status_and_errors():
    header = run("exchanges", str(CAPTURES / "confluent-mock-produce-consume.pcap"), "-F", "table",
                 columns=80).splitlines()[0].split()
    assert header[:4] == ["request_time", "api_name", "latency_ms", "status"]
    assert "error_names" in header


def test_a_filter_on_error_keeps_error_names():
    for expr in ("error", 'error_names ~ "UNKNOWN"'):
        lines = run("exchanges", str(CAPTURES / "confluent-mock-errors.pcap"), "-F", "table", "-f", expr,
                    columns=80).splitlines()
        assert "error_names" in lines[0].split()
        assert any("UNKNOWN_TOPIC" in line for line in lines[3:])


def test_100_columns_show_the_wireshark_frame_number_first():
    path = str(CAPTURES / "confluent-mock-produce-consume.pcap")
    lines = run("exchanges", path, "-F", "table", columns=100).splitlines()
    assert lines[0].split()[:2] == ["frame", "request_time"]
    first = next(line for line in lines[2:] if not line.startswith("── "))
    assert int(first.split()[0]) == jsonl("exchanges", path)[0]["frame"]


def test_180_columns_show_the_endpoints_too():
    header = run("exchanges", str(CAPTURES / "confluent-mock-produce-consume.pcap"), "-F", "table",
                 columns=180).splitlines()[0].split()
    assert {"frame", "client", "broker", "correlation_id", "client_id", "topics"} <= set(header)


def test_rows_spanning_midnight_get_a_date_line_where_the_day_changes(tmp_path):
    midnight = dt.datetime(2026, 11, 22, tzinfo=dt.UTC).timestamp()
    msgs = []
    for cid in (1, 2):
        msgs += [("c", _sized(request_frame(md_req.MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False), cid))),
                 ("s", _sized(response_frame(md_resp.MetadataResponse(
                     throttle_time=dt.timedelta(0), brokers=(), cluster_id=None, controller_id=i32(1),
                     topics=()), cid)))]
    path = tmp_path / "midnight.pcap"
    write_pcap(path, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, ts0=midnight - 0.0045))
    lines = run("exchanges", str(path), "-F", "table", columns=80).splitlines()
    dated = [line for line in lines if line.startswith("── ")]
    assert dated == ["── 2026-11-21 (UTC) ──", "── 2026-11-22 (UTC) ──"]
    assert lines.index(dated[0]) < lines.index(dated[1])


def _sized(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


MOVED = re.compile(r"^    [a-z_]+: ")  # the first line of a row's moved cells


def table_rows(text: str) -> list[tuple[str, str]]:
    """(row line, its moved cells joined into one line) per row of a table, header and date
    lines left out; a moved cell wrapped over lines is joined back with spaces."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines()[2:]:
        if line.startswith("── "):
            continue
        # a moved cell's next lines are indented 6 (a row without a frame number starts with 8)
        if MOVED.match(line) or (re.match(r"^      \S", line) and out and out[-1][1]):
            out[-1][1].append(line.strip())
        else:
            out.append((line, []))
    return [(line, " ".join(moved)) for line, moved in out]


def squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("capture", ["confluent-mock-errors.pcap", "tansu-sasl-rejected.pcap",
                                     "deliveries-retry-duplicate.pcap"])
def test_errors_at_80_columns_keep_every_message_whole_under_its_row(capture):
    path = str(CAPTURES / capture)
    text = run("errors", "--records", path, "-F", "table", columns=80)
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert "…" not in text
    want = jsonl("errors", "--records", path)
    rows = table_rows(text)
    assert len(rows) == len(want)
    messages = 0
    for (line, moved), r in zip(rows, want, strict=True):
        assert line.split()[2 if r["frame"] is not None else 1] == r["kind"]
        if r["message"]:
            assert f"message: {squash(r['message'])}" in squash(moved), (line, moved)
            messages += 1
        if r["topic"]:
            assert f"topic: {r['topic']}" in moved
    assert messages


@pytest.mark.parametrize("capture", ["kafka-python-mock-group.pcap", "tansu-admin.pcap",
                                     "deliveries-crash-before-commit.pcap"])
def test_stats_at_80_columns_keep_api_names_amounts_and_dimensions_whole(capture):
    path = str(CAPTURES / capture)
    text = run("stats", path, "-F", "table", columns=80)
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert "…" not in text
    header = text.splitlines()[0].split()
    assert header[:3] == ["interval_start", "series", "api_name"] and header[-1] == "amount"
    want = jsonl("stats", path)
    rows = table_rows(text)
    assert len(rows) == len(want)
    for (line, moved), r in zip(rows, want, strict=True):
        cells = line.split()
        assert cells[0] == r["interval_start"][11:26] and cells[1] == r["series"]
        if r["api_name"]:
            assert cells[2] == r["api_name"]
        assert cells[-1] == str(r["amount"])
        for dim in ("broker", "client_id", "topic", "partition", "group_id"):
            if r.get(dim) is not None:
                assert f"{dim}: {r[dim]}" in moved, (dim, line, moved)
