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


# -- what each deliveries scenario (rig/deliveries_scenarios.py) must show -------------------


def retry_originals(manifest: Manifest) -> dict[int, int]:
    """Offset the producer logged -> the offset where a consumer received the same record
    (key and value) first, at an offset no producer logged: the write whose answer was lost."""
    logged = {(r.partition, r.offset) for r in manifest.produced}
    first: dict[tuple, int] = {}
    for r in manifest.consumed:
        if (r.partition, r.offset) not in logged:
            first.setdefault((r.partition, r.key, r.key_encoding, r.value, r.value_encoding), r.offset)
    return {r.offset: first[k] for r in manifest.produced
            if (k := (r.partition, r.key, r.key_encoding, r.value, r.value_encoding)) in first}


def allowed_unlogged(manifest: Manifest) -> set:
    """Rows no producer logged that a scenario makes on purpose (the lost-answer writes)."""
    if not manifest.scenario.startswith("deliveries-retry-duplicate"):
        return set()
    return {(manifest.topics[0]["name"], 0, o) for o in retry_originals(manifest).values()}


def check_scenario(manifest: Manifest, rows: list[dict[str, Any]], problems: list[dict[str, Any]]) -> None:
    """The rows and findings (`deliveries --problems -F jsonl`) a deliveries scenario must give."""
    check_against_manifest(rows, manifest)
    check_no_unlogged_rows(rows, manifest, allowed_unlogged(manifest))
    name = manifest.scenario
    if name == "deliveries-clean":
        assert len(rows) == len(manifest.produced) == len(manifest.consumed)
        group = manifest.group_ids[0]
        for row in rows:
            assert (row["times_fetched"], row["fetch_groups"], row["commit_group"]) == (1, [group], group)
        assert problems == []
    elif name.startswith("deliveries-retry-duplicate"):  # one leg of the proxy captured, or both
        assert manifest.admin[0]["dropped"], "the proxy lost no response"
        originals = retry_originals(manifest)
        assert originals, "the consumer received no record twice: the broker did not write the retry twice"
        (f,) = [f for f in problems if f["kind"] == "retry_duplicate"]
        assert f["severity"] == "warning" and f["key"]["client_id"] == "retry-producer"
        assert {d["offset"]: d["original_offset"] for d in f["key"]["duplicates"]} == originals
        # the evidence: the Produce whose answer the proxy lost, and the retry
        assert len(f["evidence"]) == 2 and {e["api_name"] for e in f["evidence"]} == {"Produce"}
        # one acknowledgment and one fetch per record, on one leg or two
        assert {(r["produce_attempts"], r["error"], r["times_fetched"]) for r in rows} == {(1, None, 1)}
    elif name == "deliveries-crash-before-commit":
        by_client: dict[str, set] = {}
        for r in manifest.consumed:
            by_client.setdefault(r.client_id, set()).add(r.offset)
        twice = sorted(by_client["crash-consumer"] & by_client["survivor-consumer"])
        assert len(twice) == 10
        group = manifest.group_ids[0]
        (f,) = [f for f in problems if f["kind"] == "fetched_twice"]
        assert (f["key"]["group_id"], f["key"]["offsets"]) == (group, twice)
        assert f["key"]["client_ids"] == ["crash-consumer", "survivor-consumer"]
        assert "No OffsetCommit in the capture covered them before the repeat" in f["detail"]
        for row in rows:
            assert row["fetch_clients"] == ["crash-consumer", "survivor-consumer"]
            assert row["commit_group"] == group and row["commit_ts"] > row["first_fetch_ts"]
    elif name == "deliveries-unread-partition":
        unread = sorted(r.offset for r in manifest.produced if r.partition == 1)
        assert [r["offset"] for r in rows if r["times_fetched"] == 0] == unread
        assert [(f["kind"], f["key"]["partition"], f["key"]["offsets"]) for f in problems] == [
            ("record_not_fetched", 1, unread)]
    elif name == "deliveries-consumer-seek":
        received = {r.offset for r in manifest.consumed}
        skipped = sorted(r.offset for r in manifest.produced if r.offset not in received)
        assert skipped, "the consumer received every record: it skipped nothing"
        assert [r["offset"] for r in rows if r["times_fetched"] == 0] == skipped
        kinds = {f["kind"]: f for f in problems}
        assert set(kinds) == {"offsets_skipped", "delivery_gap"}, sorted(kinds)
        skip = kinds["offsets_skipped"]["key"]
        assert (skip["offsets"], skip["from_offset"], skip["to_offset"], skip["client_id"]) == (
            skipped, skipped[0], skipped[-1] + 1, "seek-consumer")
        assert kinds["delivery_gap"]["key"]["offsets"] == skipped
    else:
        raise AssertionError(f"not a deliveries scenario: {name}")
