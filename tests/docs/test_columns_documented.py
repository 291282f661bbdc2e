"""Every column kwinspect emits is defined in docs/columns.md, and --help points there.

The column lists come from the code (model.py, the latency table, the summary JSON,
diagnose findings, decode's JSON), so a column added there without a line in
docs/columns.md fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "columns.md"
CAPTURES = ROOT / "captures"


def _sections() -> dict[str, set[str]]:
    """Heading -> the names defined in the first cell of its tables' rows."""
    out: dict[str, set[str]] = {}
    current = ""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            out[current] = set()
        elif line.startswith("| ") and current:
            first = line.split("|")[1]
            out[current].update(re.findall(r"`([^`]+)`", first))
    return out


def _section(prefix: str) -> set[str]:
    (names,) = [names for head, names in _sections().items() if head.startswith(prefix)]
    return names


@pytest.mark.parametrize("table", ["exchanges", "records", "errors"])
def test_every_table_column_is_defined(table):
    from kwinspect import model

    columns = {"exchanges": model.EXCHANGE_COLUMNS, "records": model.RECORD_COLUMNS,
               "errors": model.ERROR_COLUMNS}[table]
    missing = [c for c in columns if c not in _section(table)]
    assert not missing, f"docs/columns.md, ## {table}: no row for {missing}"


def test_every_latency_column_is_defined():
    from kwinspect.analyze.latency import LATENCY_COLUMNS

    assert not [c for c in LATENCY_COLUMNS if c not in _section("latency")]


def test_every_stats_column_and_series_is_defined(capsys):
    """The columns, and every series name the command writes (from its output on a capture
    with every family, not from the code's list)."""
    from kwinspect.analyze.stats import STATS_COLUMNS
    from kwinspect.cli import main

    documented = _section("stats")
    assert not [c for c in STATS_COLUMNS if c not in documented]
    series: set[str] = set()
    for pcap in ("confluent-mock-produce-consume.pcap", "confluent-mock-broker-down.pcap"):
        assert main(["stats", "-q", "-F", "jsonl", str(CAPTURES / pcap)]) == 0
        series |= {json.loads(line)["series"] for line in capsys.readouterr().out.splitlines()}
    assert {"requests", "latency_bucket", "consumer_lag", "connections_refused"} <= series
    assert not sorted(series - documented)


def _paths(value, prefix: str = "") -> set[str]:
    """JSON paths like apis[].p50_ms; the keys of `statuses` are values, not fields."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else k
            if path == "statuses":
                out.add(path)
                continue
            sub = _paths(v, path)
            out |= sub or {path}
    elif isinstance(value, list):
        out |= {p for v in value for p in _paths(v, prefix + "[]")} or {prefix}
    else:
        out.add(prefix)
    return out


def test_every_summary_json_field_is_defined(capsys):
    from kwinspect.cli import main

    fields: set[str] = set()
    for pcap in ("confluent-mock-errors.pcap", "tansu-tls-proxy.pcap", "confluent-mock-produce-consume.pcap"):
        assert main(["summary", "-q", "-F", "json", str(CAPTURES / pcap)]) == 0
        fields |= _paths(json.loads(capsys.readouterr().out))
    documented = _section("summary")
    # a list of scalars (sources, apis[].versions) is documented by its own name; an empty
    # list (no Kafka errors) stands for the fields of its elements
    missing = sorted(f for f in fields if f not in documented and f.removesuffix("[]") not in documented
                     and not any(d.startswith(f + "[]") for d in documented))
    assert not missing, f"docs/columns.md, ## summary: no row for {missing}"


def test_every_diagnose_field_is_defined(capsys):
    from kwinspect.cli import main

    assert main(["diagnose", "-q", "-F", "jsonl", str(CAPTURES / "confluent-mock-broker-down.pcap")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows
    fields = {k for r in rows for k in r if k != "evidence"}
    fields |= {f"evidence[].{k}" for r in rows for e in r["evidence"] for k in e}
    documented = _section("diagnose")
    assert not [f for f in fields if f not in documented and f not in {"first_ts", "last_ts"}]
    assert "`first_ts`, `last_ts`" in PAGE.read_text()


def test_every_decode_field_is_defined(capsys):
    from kwinspect.cli import main

    assert main(["decode", str(CAPTURES / "confluent-mock-errors.pcap"), "-q"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    messages = [m for r in rows for m in (r["request"], r["response"]) if m]
    exchange_fields = {k for r in rows for k in r} - {"request", "response"}
    assert not exchange_fields - _section("exchanges")
    text = PAGE.read_text()
    assert "`request` and `response`" in text
    msg_fields = {k for m in messages for k in m}
    assert not msg_fields - _section("exchanges")


@pytest.mark.parametrize("command", [None, "exchanges", "records", "errors", "latency", "summary", "diagnose",
                                     "decode", "stats"])
def test_help_links_the_columns_page(command, capsys):
    from kwinspect.cli import main

    with pytest.raises(SystemExit):
        main(([command] if command else []) + ["--help"])
    assert "docs/columns.md" in " ".join(capsys.readouterr().out.split())


def test_every_deliveries_column_is_defined():
    from kwinspect.analyze.delivery_columns import DELIVERY_COLUMNS

    assert not [c for c in DELIVERY_COLUMNS if c not in _section("deliveries")]
