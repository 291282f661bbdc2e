"""`kwinspect stats` on the shipped captures, against independent oracles:

* `kwinspect summary -F json` of the same capture (its own counters, not the stats code):
  per-interval counts summed over the run equal its totals per api, broker, client and
  topic, and with one interval spanning the capture the percentiles are its percentiles;
* the rig's manifests (the clients' own delivery reports): records produced per partition;
* the writers: jsonl, csv and parquet hold the same rows, with the documented columns.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from kwinspect.analyze.stats import LATENCY_BUCKETS_MS, STATS_COLUMNS, parse_interval
from kwinspect.cli import main

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
PCAPS = sorted(p.name for p in CAPTURES.glob("*.pcap"))
# captures whose connections all start inside the capture (a SYN for each)
WHOLE_CONNECTIONS = ["confluent-mock-produce-consume.pcap", "confluent-mock-codecs.pcap",
                     "kafka-python-mock-group.pcap", "tansu-produce-consume.pcap",
                     "confluent-mock-broker-down.pcap"]


def _ports(pcap: str) -> list[str]:
    manifest = CAPTURES / pcap.replace(".pcap", ".manifest.json")
    ports = json.loads(manifest.read_text())["kafka_ports"] if manifest.exists() else []
    return ["--kafka-ports", ",".join(map(str, ports))] if ports else []


def _keys(pcap: str) -> list[str]:
    keys = CAPTURES / pcap.replace(".pcap", ".keys")
    return ["--tls-keylog", str(keys)] if keys.exists() else []


def _summary(pcap: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["summary", "-q", "-F", "json", str(CAPTURES / pcap), *_ports(pcap), *_keys(pcap)]) == 0
    return json.loads(capsys.readouterr().out)


def _stats(pcap: str, tmp_path: Path, *args: str) -> pd.DataFrame:
    out = tmp_path / "stats.jsonl"
    assert main(["stats", "-q", str(CAPTURES / pcap), *_ports(pcap), *_keys(pcap), "-o", str(out), *args]) == 0
    if not out.stat().st_size:
        return pd.DataFrame(columns=list(STATS_COLUMNS))
    return pd.read_json(out, lines=True, dtype=False)


def _sum(df: pd.DataFrame, series: str, by: str) -> dict:
    sel = df[df.series == series]
    return {k: int(v) for k, v in sel.groupby(by, dropna=False)["amount"].sum().items()}


@pytest.mark.parametrize("pcap", PCAPS)
def test_interval_sums_equal_the_summary(pcap, tmp_path, capsys):
    summary = _summary(pcap, capsys)
    df = _stats(pcap, tmp_path, "--interval", "100ms")
    assert int(df[df.series == "requests"].amount.sum()) == summary["exchanges"]
    apis = {a["api"]: a for a in summary["apis"]}
    for series, field in (("requests", "count"), ("errors", "errors"), ("unanswered", "unanswered"),
                          ("latency_count", "latency_count"), ("long_polls", "long_polls")):
        want = {api: a[field] for api, a in apis.items() if a[field]}
        assert _sum(df, series, "api_name") == want, series
    brokers = {b["address"]: b["requests"] for b in summary["brokers"] if b["requests"]}
    assert _sum(df, "requests", "broker") == brokers
    clients: Counter = Counter()
    for c in summary["clients"]:  # the summary splits a client_id by host
        clients[c["client_id"]] += c["requests"]
    got = {(None if isinstance(k, float) else k): v for k, v in _sum(df, "requests", "client_id").items()}
    assert got == dict(clients)
    topics = {t["topic"]: t for t in summary["topics"]}
    for series, field in (("produced_records", "produce_records"), ("fetched_records", "fetch_records")):
        assert _sum(df, series, "topic") == {t: a[field] for t, a in topics.items()
                                             if (df[(df.series == series) & (df.topic == t)].size)}, series
        assert sum(_sum(df, series, "topic").values()) == sum(a[field] for a in topics.values())
    volume = Counter(_sum(df, "produced_bytes", "topic")) + Counter(_sum(df, "fetched_bytes", "topic"))
    assert dict(volume) == {t: a["bytes"] for t, a in topics.items() if a["bytes"]}
    # every interval an exchange counts in lies inside the exchanges' span (a connection's SYN
    # comes before its first request, so the connection series are left out here)
    exchanges = df[~df.series.str.startswith("connections_")]
    if len(exchanges):
        first, last = pd.Timestamp(summary["capture"]["first"]), pd.Timestamp(summary["capture"]["last"])
        starts = pd.to_datetime(exchanges.interval_start)
        assert starts.min() <= first and starts.max() <= last
        assert starts.min() > first - pd.Timedelta("100ms")


@pytest.mark.parametrize("pcap", ["confluent-mock-produce-consume.pcap", "confluent-mock-errors.pcap",
                                  "tansu-consumer-group.pcap"])
def test_one_interval_has_the_summarys_percentiles(pcap, tmp_path, capsys):
    summary = _summary(pcap, capsys)
    df = _stats(pcap, tmp_path, "--interval", "1000000h", "--by", "api", "--series", "latency")
    assert df.interval_start.nunique() == 1
    for a in summary["apis"]:
        rows = df[df.api_name == a["api"]].set_index("series").amount
        if not a["latency_count"]:
            assert "latency_count" not in rows
            continue
        assert rows["latency_count"] == a["latency_count"]
        for p in ("p50", "p95", "p99", "max"):
            assert rows[f"latency_{p}_ms"] == pytest.approx(a[f"{p}_ms"], abs=1e-9), (a["api"], p)
        buckets = df[(df.api_name == a["api"]) & (df.series == "latency_bucket")]
        assert list(buckets.le_ms) == list(LATENCY_BUCKETS_MS)
        assert list(buckets.amount) == sorted(buckets.amount)  # cumulative
        assert buckets.amount.iloc[-1] <= a["latency_count"]


@pytest.mark.parametrize("pcap", ["confluent-mock-produce-consume.pcap", "confluent-mock-codecs.pcap",
                                  "confluent-mock-acks.pcap", "confluent-mock-broker-down.pcap",
                                  "kafka-python-mock-group.pcap", "tansu-produce-consume.pcap",
                                  "confluent-mock-idempotent.pcap"])
def test_produced_records_per_partition_are_what_the_clients_produced(pcap, tmp_path):
    manifest = json.loads((CAPTURES / pcap.replace(".pcap", ".manifest.json")).read_text())
    want = Counter((r["topic"], r["partition"]) for r in manifest["produced"] if not r.get("delivery_error"))
    df = _stats(pcap, tmp_path, "--series", "volume", "--by", "topic,partition")
    sel = df[df.series == "produced_records"]
    got = {(t, int(p)): int(n) for (t, p), n in sel.groupby(["topic", "partition"]).amount.sum().items()}
    assert got == dict(want)


def test_consumer_and_fetch_lag_follow_the_clients(tmp_path):
    """The consumer of produce-consume fetches every partition from offset 0 after all 30 records
    were produced, then commits what it read: its first fetch lag per partition is what the
    producer wrote there (the manifest), and its group's lag after the commit is 0."""
    pcap = "confluent-mock-produce-consume.pcap"
    manifest = json.loads((CAPTURES / pcap.replace(".pcap", ".manifest.json")).read_text())
    produced = Counter(r["partition"] for r in manifest["produced"])
    df = _stats(pcap, tmp_path, "--series", "lag", "--interval", "10ms")
    fetch = df[df.series == "fetch_lag"]
    assert {int(p): int(n) for p, n in fetch.groupby("partition").amount.max().items()} == dict(produced)
    assert set(fetch.client_id) == {"demo-consumer"}
    group = df[df.series == "consumer_lag"]
    assert set(group.group_id) == {"demo-group"} and set(group.partition) == set(produced)
    assert (group.amount == 0).all()


@pytest.mark.parametrize("pcap", WHOLE_CONNECTIONS)
def test_connections_per_broker(pcap, tmp_path, capsys):
    summary = _summary(pcap, capsys)
    df = _stats(pcap, tmp_path, "--series", "connections")
    opened = _sum(df, "connections_opened", "broker")
    assert opened == {b["address"]: b["connections"] for b in summary["brokers"] if b["connections"]}
    assert sum(_sum(df, "connections_closed", "broker").values()) <= sum(opened.values())


def test_refused_connections_of_the_broker_down_capture(tmp_path):
    """Broker 2 is set down for five records: the producer's reconnect SYNs get RSTs (the
    scenario's own description); no other broker refuses anything."""
    pcap = "confluent-mock-broker-down.pcap"
    df = _stats(pcap, tmp_path, "--series", "connections")
    refused = _sum(df, "connections_refused", "broker")
    assert len(refused) == 1 and next(iter(refused.values())) >= 1
    exchanges = tmp_path / "ex.jsonl"
    assert main(["exchanges", "-q", str(CAPTURES / pcap), *_ports(pcap), "-o", str(exchanges)]) == 0
    ex = pd.read_json(exchanges, lines=True)
    assert next(iter(refused)) in set(ex.broker)


def test_by_none_and_by_api_add_up_to_the_same(tmp_path):
    pcap = "confluent-mock-errors.pcap"
    full = _stats(pcap, tmp_path, "--series", "requests,volume")
    totals = _stats(pcap, tmp_path, "--series", "requests,volume", "--by", "none")
    for series in ("requests", "errors", "produced_records", "produced_bytes"):
        assert full[full.series == series].amount.sum() == totals[totals.series == series].amount.sum()
    dims = ["api_name", "api_version", "broker", "client_id", "topic", "partition", "group_id"]
    assert totals[dims].isna().all().all()
    by_api = _stats(pcap, tmp_path, "--series", "requests", "--by", "api")
    assert by_api[["broker", "client_id", "api_version"]].isna().all().all()
    assert by_api.groupby(["interval_start", "series", "api_name"]).size().max() == 1
    by_column = _stats(pcap, tmp_path, "--series", "requests", "--by", "api_name")
    assert by_column.equals(by_api)


def test_filter_narrows_the_exchanges(tmp_path, capsys):
    pcap = "confluent-mock-errors.pcap"
    df = _stats(pcap, tmp_path, "--filter", 'api == "Produce"', "--series", "requests,latency")
    assert set(df.api_name.dropna()) == {"Produce"}
    summary = _summary(pcap, capsys)
    produce = next(a for a in summary["apis"] if a["api"] == "Produce")
    assert df[df.series == "requests"].amount.sum() == produce["count"]


def test_formats_agree_and_pandas_reads_them(tmp_path):
    pcap = CAPTURES / "confluent-mock-produce-consume.pcap"
    frames = {}
    for fmt in ("jsonl", "csv", "parquet"):
        out = tmp_path / f"s.{fmt}"
        assert main(["stats", "-q", str(pcap), *_ports(pcap.name), "-o", str(out)]) == 0
        frames[fmt] = (pd.read_json(out, lines=True, dtype=False) if fmt == "jsonl" else
                       pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out))
        assert list(frames[fmt].columns) == list(STATS_COLUMNS), fmt
    pq = frames["parquet"]
    assert str(pq.interval_start.dtype) == "datetime64[us, UTC]"
    for fmt in ("jsonl", "csv"):
        df = frames[fmt]
        assert len(df) == len(pq)
        assert list(df.series) == list(pq.series)
        assert [float(x) for x in df.amount] == pytest.approx([float(x) for x in pq.amount])
        assert list(pd.to_datetime(df.interval_start, utc=True)) == list(pq.interval_start)
    wide = pq.pivot_table(index="interval_start", columns="series", values="amount", aggfunc="sum")
    assert wide["requests"].sum() == 51  # the summary's exchange count of this capture


def test_the_terminal_table_shows_the_dimensions_used(tmp_path):
    out = tmp_path / "t.txt"
    pcap = CAPTURES / "confluent-mock-produce-consume.pcap"
    assert main(["stats", "-q", str(pcap), "-F", "table", "-o", str(out), "--by", "api",
                 "--series", "requests"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].split() == ["interval_start", "series", "api_name", "amount"]
    assert any(line.split()[1:3] == ["requests", "Produce"] for line in lines[3:])


@pytest.mark.parametrize("text,seconds", [("100ms", 0.1), ("1s", 1.0), ("10s", 10.0), ("1m", 60.0),
                                          ("2.5", 2.5), ("1h", 3600.0), ("2500us", 0.0025)])
def test_parse_interval(text, seconds):
    assert parse_interval(text) == pytest.approx(seconds)


@pytest.mark.parametrize("args", [["--interval", "fast"], ["--interval", "0s"], ["--interval=-1s"],
                                  ["--by", "colour"], ["--series", "nonsense"], ["--max-labels", "0"],
                                  ["--filter", "api =="]])
def test_usage_errors_exit_2(args, capsys):
    pcap = CAPTURES / "confluent-mock-errors.pcap"
    assert main(["stats", "-q", str(pcap), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kwinspect: ") and err.count("\n") == 1


def test_label_cap_folds_new_values_into_other(tmp_path, capsys):
    pcap = "confluent-mock-produce-consume.pcap"
    df = _stats(pcap, tmp_path, "--max-labels", "1", "--series", "requests")
    assert set(df.client_id.dropna()) <= {"demo-producer", "demo-consumer", "(other)"}
    assert "(other)" in set(df.client_id) and "(other)" in set(df.broker)
    assert "more distinct values than --max-labels" in capsys.readouterr().err
    assert df[df.series == "requests"].amount.sum() == 51  # folded, not lost
    assert len(set(df.client_id.dropna()) - {"(other)"}) == 1


def test_ctrl_c_writes_what_was_read_and_exits_130(tmp_path, monkeypatch):
    """docs/cli.md: after Ctrl-C what was processed so far is written first, exit status 130."""
    import kwinspect.cli as cli
    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_files

    seen: list = []

    def cut_short(*args, **kwargs):  # the events one per list, the 30th never handed on
        for ev in dissect_files(*args, **kwargs):
            seen.append(ev)
            if len(seen) == 30:
                raise KeyboardInterrupt
            yield [ev]

    monkeypatch.setattr(cli, "dissect_file_batches", cut_short)
    pcap = CAPTURES / "confluent-mock-produce-consume.pcap"
    out = tmp_path / "cut.jsonl"
    assert main(["stats", "-q", str(pcap), "--series", "requests", "-o", str(out)]) == 130
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    read = sum(isinstance(ev, Exchange) for ev in seen[:29])
    assert 0 < read < sum(isinstance(ev, Exchange) for ev in dissect_files([pcap]))
    assert sum(r["amount"] for r in rows if r["series"] == "requests") == read
