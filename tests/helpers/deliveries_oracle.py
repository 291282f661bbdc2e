"""Check `kwinspect deliveries` rows against what the clients logged (a rig manifest).

The clients' own logs are the oracle: every record a producer saw acknowledged (its
delivery report's offset) must be one row at that offset with the key and value the
producer sent (the value's SHA-256 computed here from the manifest's bytes), and
every record a consumer logged must be a fetch of that row by that consumer.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rig.manifest import Manifest, decode_bytes


def deliveries_rows(capsys, pcap: Path | str, ports: list[int], *extra: str) -> list[dict[str, Any]]:
    from kwinspect.cli import main

    argv = ["deliveries", "-q", "-F", "jsonl", str(pcap), *extra]
    if ports:
        argv += ["--kafka-ports", ",".join(map(str, ports))]
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def sha16(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()[:16]


def acknowledged(manifest: Manifest) -> list:
    """Produced records whose delivery report gave an offset (acks=0 reports none of their own)."""
    return [r for r in manifest.produced
            if r.offset is not None and r.delivery_error is None and r.acks != "0"]


def check_against_manifest(rows: list[dict[str, Any]], manifest: Manifest) -> None:
    where = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    by_offset = {(r["topic"], r["partition"], r["offset"]): r for r in rows}
    for rec in acknowledged(manifest):
        at = (rec.topic, rec.partition, rec.offset)
        assert where[at] == 1, f"{manifest.scenario}: produced record at {at} is in {where[at]} rows"
        row = by_offset[at]
        assert (row["key"], row["key_encoding"]) == (rec.key, rec.key_encoding), (at, row["key"], rec.key)
        assert row["value_digest"] == sha16(decode_bytes(rec.value, rec.value_encoding)), at
        assert row["producer_client_id"] == rec.client_id, at
    for rec in manifest.consumed:
        at = (rec.topic, rec.partition, rec.offset)
        if not any(p.topic == rec.topic and p.partition == rec.partition for p in manifest.produced):
            continue  # records produced before the capture started cannot have a row
        row = by_offset.get(at)
        assert row is not None, f"{manifest.scenario}: consumed record at {at} has no deliveries row"
        assert rec.client_id in row["fetch_clients"], (at, rec.client_id, row["fetch_clients"])
        if rec.group_id:
            fetched_by = {c: g for c, g in zip(row["fetch_clients"], row["fetch_groups"], strict=True)}
            assert fetched_by[rec.client_id] == rec.group_id, (at, fetched_by)
        assert row["times_fetched"] >= 1


def check_no_unlogged_rows(rows: list[dict[str, Any]], manifest: Manifest, allowed: set = frozenset()) -> None:
    """Every row is a record some producer logged (any acks), or one of ``allowed``."""
    logged = {(r.topic, r.partition, r.offset) for r in manifest.produced if r.offset is not None}
    # an acks=0 producer learns no offsets: the consumer's receipts say where its records went
    # (and a broker that answers acks=0 anyway, like the mock, acknowledges them)
    fire_and_forget = {(r.topic, r.partition) for r in manifest.produced if r.acks == "0"}
    logged |= {(r.topic, r.partition, r.offset) for r in manifest.consumed if (r.topic, r.partition) in fire_and_forget}
    extra = {(r["topic"], r["partition"], r["offset"]) for r in rows} - logged - set(allowed)
    assert not extra, f"{manifest.scenario}: rows no producer logged: {sorted(extra)[:10]}"
