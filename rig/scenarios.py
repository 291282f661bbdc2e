"""Named scenarios: real clients against real brokers, captured, with ground truth.

Each scenario is a function `run(rig, workdir) -> Manifest` that
- picks a broker from the rig (shared, or private when it changes broker state),
- starts tcpdump on the broker ports before any client connects,
- runs confluent-kafka and/or kafka-python clients and records what they did
  (delivery reports, consumed records, admin results) in a `Manifest`,
- closes every client (so the last FIN is in the file), stops tcpdump, and
- writes `workdir/NAME.pcap` and `workdir/NAME.manifest.json`.

`SCENARIOS` maps names to functions; make_captures.py and tests/e2e use it.
Run times are 1-3 s each; `tansu-consumer-group` takes about 5 s (tansu holds
the JoinGroup; DESIGN.md reports ~20 s with other clients).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from kwinspect.protocol.schema.api_keys import ApiKey
from rig.manifest import ClientInfo, Manifest, RecordTruth
from rig.rig import Rig

ScenarioFn = Callable[[Rig, str], Manifest]

# Kafka API keys used when poking the mock cluster.
PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
METADATA = int(ApiKey.METADATA)
API_VERSIONS = int(ApiKey.API_VERSIONS)
INIT_PRODUCER_ID = int(ApiKey.INIT_PRODUCER_ID)

CODECS_CK = ("none", "gzip", "snappy", "lz4", "zstd")
CODECS_KP = (None, "gzip", "lz4", "zstd")  # kafka-python has no snappy without python-snappy


# ---------------------------------------------------------------------------
# Recording: tcpdump around the scenario body, manifest written at the end.
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def recording(rig: Rig, workdir: str, name: str, description: str, broker: Any) -> Iterator[Manifest]:
    os.makedirs(workdir, exist_ok=True)
    pcap = os.path.join(workdir, f"{name}.pcap")
    desc = broker.describe()
    m = Manifest(scenario=name, description=description, pcap=f"{name}.pcap", broker=desc,
                 kafka_ports=list(desc["ports"]))
    m.started_at = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    td = rig.tcpdump(pcap, m.kafka_ports)
    t0 = time.monotonic()
    td.start()
    try:
        yield m
    finally:
        gc.collect()  # destroy any client handle still alive, so its FIN is captured
        # Drain longer than a long-poll fetch waits (500 ms), so a response the broker
        # sends after the client closed lands in this capture, not in the next one.
        stats = td.stop(drain=0.7)
    m.duration_s = round(time.monotonic() - t0, 2)
    m.capture = {
        "tool": "tcpdump",
        "command": " ".join(os.path.basename(a) if a == pcap else a
                            for a in td.command()[len(td.prefix):]),
        "interface": "lo",
        "filter": td.filter,
        "stats": stats,
        "mtu": (rig.netns_info or {}).get("mtu", "host loopback (65536)"),
        "netns": rig.netns_info,
    }
    m.environment = rig.environment()
    m.write(os.path.join(workdir, f"{name}.manifest.json"))


def _ck_version() -> tuple[str, str]:
    import confluent_kafka

    ver = confluent_kafka.version()
    return (ver if isinstance(ver, str) else ver[0]), confluent_kafka.libversion()[0]


def _kp_version() -> str:
    import kafka

    return kafka.__version__


def _acks_name(acks: Any) -> str:
    return {0: "0", 1: "1", -1: "all", "all": "all", "0": "0", "1": "1", "-1": "all"}[acks]


def _value(i: int, size: int = 0, tag: str = "value") -> bytes:
    base = f"{tag}-{i:04d} the quick brown fox jumps over the lazy dog; "
    if size <= len(base):
        return base.encode()
    reps = size // len(base) + 1
    return (base * reps)[:size].encode()


def _ts_name(ts_type: int | None) -> str | None:
    # confluent-kafka: TIMESTAMP_NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2;
    # kafka-python: 0 create time, 1 log append time.
    return {1: "create_time", 2: "log_append_time"}.get(ts_type or 0)


def standard_items(topic: str, n: int, *, partitions: int | None = None, size: int = 0,
                   tag: str = "value") -> list[dict[str, Any]]:
    """A mix of record shapes: text and binary keys/values, null key, empty value, headers.

    Every record gets an explicit CreateTime (now, plus i ms), so the ground
    truth knows the timestamp on the wire.
    """
    items: list[dict[str, Any]] = []
    base_ts = int(time.time() * 1000)
    for i in range(n):
        key: bytes | None = f"key-{i % 7}".encode()
        value: bytes | None = _value(i, size, tag)
        headers: list[tuple[str, bytes | None]] = [("seq", str(i).encode())]
        if i % 5 == 1:
            key = None  # null key
        if i % 5 == 2:
            value = bytes([0xFF, 0x00, 0xFE, i % 256]) + b"\x80binary"  # not UTF-8
            headers.append(("bin", b"\xde\xad\xbe\xef"))
        if i % 5 == 3:
            value = b""  # empty, not null
            headers.append(("trace-id", None))  # header with a null value
        if i % 5 == 4:
            headers = []
        it: dict[str, Any] = {"topic": topic, "key": key, "value": value, "headers": headers,
                              "timestamp_ms": base_ts + i}
        if partitions:
            it["partition"] = i % partitions
        items.append(it)
    return items


# ---------------------------------------------------------------------------
# confluent-kafka helpers
# ---------------------------------------------------------------------------


def ck_produce(m: Manifest, bootstrap: str, client_id: str, items: list[dict[str, Any]], *,
               codec: str = "none", acks: Any = "all", extra: dict[str, Any] | None = None,
               flush_timeout: float = 15.0) -> list[RecordTruth]:
    """Produce `items` with a fresh confluent-kafka Producer; truth from delivery reports."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "client.id": client_id, "compression.type": codec,
        "acks": acks, "linger.ms": 20, "enable.idempotence": False,
    }
    conf.update(extra or {})
    ver, lib = _ck_version()
    m.clients.append(ClientInfo("producer", "confluent-kafka", ver, client_id,
                                {k: v for k, v in conf.items() if k != "bootstrap.servers"}, lib))
    p = Producer(conf)
    truths: list[RecordTruth | None] = [None] * len(items)

    def on_delivery(idx: int, err: Any, msg: Any) -> None:
        it = items[idx]
        ts = msg.timestamp()
        truths[idx] = RecordTruth.make(
            it["topic"], msg.partition(), msg.offset() if err is None else None,
            it.get("key"), it.get("value"), it.get("headers"),
            codec=codec, timestamp_ms=it.get("timestamp_ms"),
            timestamp_type="create_time" if it.get("timestamp_ms") is not None else None,
            report_timestamp_ms=ts[1] if ts and ts[0] else None, client_id=client_id,
            acks=_acks_name(acks), delivery_error=err.name() if err is not None else None,
        )

    try:
        for idx, it in enumerate(items):
            kw: dict[str, Any] = {"key": it.get("key"), "value": it.get("value"),
                                  "on_delivery": functools.partial(on_delivery, idx)}
            if it.get("headers"):
                kw["headers"] = it["headers"]
            if it.get("partition") is not None:
                kw["partition"] = it["partition"]
            if it.get("timestamp_ms") is not None:
                kw["timestamp"] = it["timestamp_ms"]
            p.produce(it["topic"], **kw)
            p.poll(0)
        left = p.flush(flush_timeout)
        if left:
            raise RuntimeError(f"{client_id}: {left} messages not delivered in {flush_timeout}s")
    finally:
        _ck_close_producer(p)
    out = [t for t in truths if t is not None]
    m.produced.extend(out)
    return out


def _ck_close_producer(p: Any) -> None:
    close = getattr(p, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()
    del p
    gc.collect()


def _ck_record(msg: Any, client_id: str, group_id: str | None) -> RecordTruth:
    ts = msg.timestamp()
    return RecordTruth.make(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                            msg.headers(), timestamp_ms=ts[1] if ts and ts[0] else None,
                            timestamp_type=_ts_name(ts[0]) if ts else None,
                            client_id=client_id, group_id=group_id)


def ck_consume(m: Manifest, bootstrap: str, client_id: str, *, expected: int,
               topics: list[str] | None = None, assign: list[tuple[str, int]] | None = None,
               group_id: str | None = None, extra: dict[str, Any] | None = None,
               timeout: float = 20.0, linger: float = 0.0, commit: bool = True) -> list[RecordTruth]:
    """Consume `expected` records, by group subscription (topics) or assign() from the start.

    With a group: commit synchronously, keep polling `linger` seconds (heartbeats),
    then close (LeaveGroup).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "client.id": client_id,
        "group.id": group_id or f"{client_id}-assign-only",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "enable.partition.eof": False,
    }
    if topics:
        conf.update({"heartbeat.interval.ms": 100, "session.timeout.ms": 6000})
    conf.update(extra or {})
    ver, lib = _ck_version()
    m.clients.append(ClientInfo("consumer", "confluent-kafka", ver, client_id,
                                {k: v for k, v in conf.items() if k != "bootstrap.servers"}, lib))
    if topics and group_id and group_id not in m.group_ids:
        m.group_ids.append(group_id)
    c = Consumer(conf)
    got: list[RecordTruth] = []
    try:
        if topics:
            c.subscribe(topics)
        else:
            c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in (assign or [])])
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            msg = c.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                continue  # transient errors (e.g. partition EOF) are not records
            got.append(_ck_record(msg, client_id, group_id if topics else None))
        if len(got) < expected:
            raise RuntimeError(f"{client_id}: consumed {len(got)} of {expected} records")
        if topics and commit:
            c.commit(asynchronous=False)
        end = time.monotonic() + linger
        while time.monotonic() < end:
            msg = c.poll(0.05)
            if msg is not None and not msg.error():
                got.append(_ck_record(msg, client_id, group_id if topics else None))
    finally:
        c.close()
        del c
        gc.collect()
    m.consumed.extend(got)
    return got


# ---------------------------------------------------------------------------
# kafka-python helpers
# ---------------------------------------------------------------------------


def kp_produce(m: Manifest, bootstrap: str, client_id: str, items: list[dict[str, Any]], *,
               codec: str | None = None, acks: Any = "all", extra: dict[str, Any] | None = None
               ) -> list[RecordTruth]:
    from kafka import KafkaProducer

    conf: dict[str, Any] = {"client_id": client_id, "compression_type": codec, "acks": acks,
                            "linger_ms": 20}
    conf.update(extra or {})
    m.clients.append(ClientInfo("producer", "kafka-python", _kp_version(), client_id,
                                {k: (list(v) if isinstance(v, tuple) else v) for k, v in conf.items()}))
    p = KafkaProducer(bootstrap_servers=bootstrap, **conf)
    out: list[RecordTruth] = []
    try:
        futures = []
        for it in items:
            # kafka-python refuses null header values: send (and record) b"" instead.
            it["headers"] = [(k, b"" if v is None else v) for k, v in (it.get("headers") or [])]
            headers = it["headers"]
            futures.append(p.send(it["topic"], key=it.get("key"), value=it.get("value"),
                                  headers=headers or None, partition=it.get("partition"),
                                  timestamp_ms=it.get("timestamp_ms")))
        p.flush(timeout=15)
        for it, fut in zip(items, futures, strict=True):
            md = fut.get(timeout=15)
            # With acks=0 kafka-python makes offsets up without hearing from the broker.
            offset = None if _acks_name(acks) == "0" else md.offset
            out.append(RecordTruth.make(
                it["topic"], md.partition, offset, it.get("key"), it.get("value"),
                it.get("headers"), codec=codec or "none", timestamp_ms=it.get("timestamp_ms"),
                timestamp_type="create_time" if it.get("timestamp_ms") is not None else None,
                report_timestamp_ms=md.timestamp if md.timestamp not in (None, -1) else None,
                client_id=client_id, acks=_acks_name(acks)))
    finally:
        p.close(timeout=5)
    m.produced.extend(out)
    return out


def _kp_record(rec: Any, client_id: str, group_id: str | None) -> RecordTruth:
    return RecordTruth.make(rec.topic, rec.partition, rec.offset, rec.key, rec.value,
                            rec.headers, timestamp_ms=rec.timestamp,
                            timestamp_type=_ts_name((rec.timestamp_type or 0) + 1),
                            client_id=client_id, group_id=group_id)


def kp_consume(m: Manifest, bootstrap: str, client_id: str, *, expected: int,
               topics: list[str] | None = None, assign: list[tuple[str, int]] | None = None,
               group_id: str | None = None, extra: dict[str, Any] | None = None,
               timeout: float = 30.0, linger: float = 0.0) -> list[RecordTruth]:
    from kafka import KafkaConsumer, TopicPartition

    conf: dict[str, Any] = {"client_id": client_id, "auto_offset_reset": "earliest",
                            "enable_auto_commit": False}
    if topics:
        conf.update({"group_id": group_id, "heartbeat_interval_ms": 200,
                     "session_timeout_ms": 10000})
    conf.update(extra or {})
    m.clients.append(ClientInfo("consumer", "kafka-python", _kp_version(), client_id,
                                {k: (list(v) if isinstance(v, tuple) else v) for k, v in conf.items()}))
    if topics and group_id and group_id not in m.group_ids:
        m.group_ids.append(group_id)
    c = KafkaConsumer(bootstrap_servers=bootstrap, **conf)
    got: list[RecordTruth] = []
    try:
        if topics:
            c.subscribe(topics)
        else:
            tps = [TopicPartition(t, p) for t, p in (assign or [])]
            c.assign(tps)
            c.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=100).values():
                got.extend(_kp_record(r, client_id, group_id if topics else None) for r in recs)
        if len(got) < expected:
            raise RuntimeError(f"{client_id}: consumed {len(got)} of {expected} records")
        if topics:
            c.commit()
        end = time.monotonic() + linger
        while time.monotonic() < end:
            for recs in c.poll(timeout_ms=50).values():
                got.extend(_kp_record(r, client_id, group_id if topics else None) for r in recs)
    finally:
        c.close()
    m.consumed.extend(got)
    return got


# ---------------------------------------------------------------------------
# Scenarios against the librdkafka mock cluster (confluent-kafka)
# ---------------------------------------------------------------------------

# Every confluent-kafka connection to the mock starts with ApiVersions v3, which
# the mock (ApiVersions <= v2) answers with UNSUPPORTED_VERSION in the v0 layout;
# the client then retries with v0.  That is a real error path in every capture.
_MOCK_APIVERSIONS_NOTE = (
    "ApiVersions v3 is answered with UNSUPPORTED_VERSION (35) by the mock, which only "
    "supports ApiVersions v0-v2; librdkafka then retries with ApiVersions v0."
)


def _expect_mock_apiversions(m: Manifest) -> None:
    """Quirks of every confluent-kafka -> librdkafka mock capture."""
    m.expect_error("ApiVersions", "UNSUPPORTED_VERSION", 35,
                   why="librdkafka sends ApiVersions v3 first; the mock supports v0-v2")
    m.notes.append(_MOCK_APIVERSIONS_NOTE)
    # The mock's error body is `error_code, 0x01, one 6-byte entry, throttle`: neither
    # the v0 layout real brokers use (int32 count) nor v3 (compact count 2, tags).
    m.allow_anomaly("unsupported_version", "ApiVersions",
                    "the mock's UNSUPPORTED_VERSION body fits neither the v0 nor the v3 layout")
    # Metadata v13 responses from the mock end with one extra 0x00 byte after the
    # body's tagged fields (checked by hand against the v13 grammar).
    m.allow_anomaly("trailing_bytes", "Metadata",
                    "the mock writes one byte more than the Metadata v13 grammar")
    m.notes.append("The mock's ApiVersions error body fits neither the v0 nor the v3 layout, "
                   "and its Metadata v13 responses carry one trailing byte: kwinspect is "
                   "expected to report both (allowed_anomalies).")


def confluent_mock_produce_consume(rig: Rig, workdir: str) -> Manifest:
    """Demo capture: producer + consumer group against the 3-broker mock cluster."""
    mc = rig.mock()
    topic = rig.name("orders")
    group = rig.name("demo-group")
    mc.create_topic(topic, 3, 1)
    with recording(rig, workdir, "confluent-mock-produce-consume",
                   "confluent-kafka producer writes 30 records (text and binary keys/values, "
                   "null key, empty value, headers incl. a null header value) to a 3-partition "
                   "topic on the 3-broker librdkafka mock cluster; a consumer in a fresh group "
                   "subscribes, fetches all 30, commits synchronously, heartbeats, and leaves.",
                   mc) as m:
        m.add_topic(topic, 3, "rd_kafka_mock_topic_create (before the capture)")
        ck_produce(m, mc.bootstrap_servers, "demo-producer", standard_items(topic, 30),
                   codec="none", acks="all")
        ck_consume(m, mc.bootstrap_servers, "demo-consumer", expected=30, topics=[topic],
                   group_id=group, linger=0.5)
        _expect_mock_apiversions(m)
        m.expect_apis("ApiVersions", "Metadata", "Produce", "FindCoordinator", "JoinGroup",
                      "SyncGroup", "Heartbeat", "OffsetFetch", "Fetch", "OffsetCommit",
                      "LeaveGroup")
    return m


def confluent_mock_codecs(rig: Rig, workdir: str) -> Manifest:
    """One producer per codec (none/gzip/snappy/lz4/zstd), then fetch everything back."""
    mc = rig.mock()
    topic = rig.name("codecs")
    mc.create_topic(topic, len(CODECS_CK), 1)
    with recording(rig, workdir, "confluent-mock-codecs",
                   "five confluent-kafka producers, one per compression.type "
                   "(none, gzip, snappy, lz4, zstd), each write 8 compressible records to their "
                   "own partition (partition i = codec i) of one topic on the mock cluster; an "
                   "assign()-based consumer (no group) fetches all 40 records back.", mc) as m:
        m.add_topic(topic, len(CODECS_CK), "rd_kafka_mock_topic_create (before the capture)")
        for part, codec in enumerate(CODECS_CK):
            items = standard_items(topic, 8, size=300, tag=codec)
            for it in items:
                it["partition"] = part
            ck_produce(m, mc.bootstrap_servers, f"producer-{codec}", items, codec=codec,
                       acks="all", extra={"linger.ms": 50, "batch.num.messages": 100})
        ck_consume(m, mc.bootstrap_servers, "codecs-consumer", expected=8 * len(CODECS_CK),
                   assign=[(topic, p) for p in range(len(CODECS_CK))])
        _expect_mock_apiversions(m)
        m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets")
    return m


def confluent_mock_acks(rig: Rig, workdir: str) -> Manifest:
    """acks=0, acks=1 and acks=all producers; the mock answers even acks=0 requests."""
    mc = rig.mock()
    topic = rig.name("acks")
    mc.create_topic(topic, 3, 1)
    with recording(rig, workdir, "confluent-mock-acks",
                   "three confluent-kafka producers with acks=0, acks=1 and acks=all each write "
                   "6 records to their own partition (0, 1, 2) of a topic on the mock cluster; "
                   "an assign()-based consumer reads all 18 back (this is where the acks=0 "
                   "records' offsets come from: an acks=0 delivery report has no offset). The "
                   "librdkafka mock answers acks=0 produce requests anyway.", mc) as m:
        m.add_topic(topic, 3, "rd_kafka_mock_topic_create (before the capture)")
        for part, acks in enumerate((0, 1, "all")):
            items = standard_items(topic, 6, tag=f"acks{_acks_name(acks)}")
            for it in items:
                it["partition"] = part
            ck_produce(m, mc.bootstrap_servers, f"producer-acks{_acks_name(acks)}", items,
                       acks=acks)
        ck_consume(m, mc.bootstrap_servers, "acks-consumer", expected=18,
                   assign=[(topic, p) for p in range(3)])
        _expect_mock_apiversions(m)
        m.allow_status("Produce", "no_response_expected")
        m.allow_status("Produce", "request_missing")
        m.notes.append("Produce requests with acks=0 may be shown as no_response_expected; "
                       "the mock still sends a response, which a decoder may pair or report.")
        m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch")
    return m


def confluent_mock_idempotent(rig: Rig, workdir: str) -> Manifest:
    """Idempotent producer: InitProducerId, producer id/epoch and sequences in batches."""
    mc = rig.mock()
    topic = rig.name("idempotent")
    mc.create_topic(topic, 2, 1)
    with recording(rig, workdir, "confluent-mock-idempotent",
                   "an idempotent confluent-kafka producer (enable.idempotence=true, lz4) gets a "
                   "producer id with InitProducerId and writes 20 records to 2 partitions; "
                   "batches carry producer id, epoch and per-partition sequence numbers "
                   "starting at 0; an assign()-based consumer reads them back.", mc) as m:
        m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
        ck_produce(m, mc.bootstrap_servers, "idempotent-producer",
                   standard_items(topic, 20, partitions=2), codec="lz4", acks="all",
                   extra={"enable.idempotence": True})
        ck_consume(m, mc.bootstrap_servers, "idempotent-consumer", expected=20,
                   assign=[(topic, 0), (topic, 1)])
        _expect_mock_apiversions(m)
        m.expect_apis("ApiVersions", "Metadata", "InitProducerId", "Produce", "Fetch")
    return m


def confluent_mock_transactions(rig: Rig, workdir: str) -> Manifest:
    """A transactional producer commits one transaction and aborts another."""
    from confluent_kafka import Producer

    mc = rig.mock()
    topic = rig.name("txn")
    txn_id = rig.name("kw-txn")
    txn_group = rig.name("kw-txn-group")
    mc.create_topic(topic, 2, 1)
    with recording(rig, workdir, "confluent-mock-transactions",
                   "a transactional confluent-kafka producer (transactional.id set) runs "
                   "init_transactions, then a transaction of 6 records that it commits and one "
                   "of 4 records that it aborts, then a second committed transaction of 2 "
                   "records whose transaction also commits offsets 3 of both partitions for "
                   "a consumer group (send_offsets_to_transaction: AddOffsetsToTxn, "
                   "TxnOffsetCommit); the mock writes COMMIT/ABORT control records after each. A "
                   "read_committed consumer (assign(), no group) reads the partitions back; "
                   "the mock does not filter aborted records (no aborted_transactions list), "
                   "so the consumer returns all 12 data records.", mc) as m:
        m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
        m.transactional_ids.append(txn_id)
        client_id = "txn-producer"
        conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": client_id,
                "transactional.id": txn_id, "linger.ms": 10, "compression.type": "none"}
        ver, lib = _ck_version()
        m.clients.append(ClientInfo("producer", "confluent-kafka", ver, client_id,
                                    {k: v for k, v in conf.items() if k != "bootstrap.servers"},
                                    lib))
        p = Producer(conf)
        try:
            p.init_transactions(15)
            for outcome, n, tag in (("committed", 6, "txn1"), ("aborted", 4, "txn2"),
                                    ("committed", 2, "txn3")):
                items = standard_items(topic, n, partitions=2, tag=tag)
                truths: list[RecordTruth | None] = [None] * n

                def on_delivery(idx: int, err: Any, msg: Any, items=items, truths=truths,
                                outcome=outcome) -> None:
                    it = items[idx]
                    ts = msg.timestamp()
                    truths[idx] = RecordTruth.make(
                        topic, msg.partition(), msg.offset() if err is None else None,
                        it["key"], it["value"], it["headers"], codec="none",
                        timestamp_ms=it["timestamp_ms"], timestamp_type="create_time",
                        report_timestamp_ms=ts[1] if ts and ts[0] else None, client_id=client_id,
                        acks="all", transactional_id=txn_id, txn_outcome=outcome,
                        delivery_error=err.name() if err is not None else None)

                p.begin_transaction()
                for idx, it in enumerate(items):
                    p.produce(topic, key=it["key"], value=it["value"],
                              headers=it["headers"] or None, partition=it["partition"],
                              timestamp=it["timestamp_ms"],
                              on_delivery=functools.partial(on_delivery, idx))
                p.flush(15)
                if tag == "txn3":
                    # consume-transform-produce style: commit a group's offsets in the
                    # transaction (AddOffsetsToTxn + TxnOffsetCommit).
                    from confluent_kafka import Consumer, TopicPartition

                    gconf = {"bootstrap.servers": mc.bootstrap_servers,
                             "client.id": "txn-offsets-group", "group.id": txn_group,
                             "enable.auto.commit": False}
                    m.clients.append(ClientInfo(
                        "consumer (group metadata only, never subscribes)", "confluent-kafka",
                        ver, "txn-offsets-group",
                        {k: v for k, v in gconf.items() if k != "bootstrap.servers"}, lib))
                    gc_ = Consumer(gconf)
                    try:
                        p.send_offsets_to_transaction(
                            [TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 3)],
                            gc_.consumer_group_metadata(), 15)
                    finally:
                        gc_.close()
                    m.group_ids.append(txn_group)
                if outcome == "committed":
                    p.commit_transaction(15)
                else:
                    p.abort_transaction(15)
                p.poll(0)
                m.produced.extend(t for t in truths if t is not None)
        finally:
            _ck_close_producer(p)
        ck_consume(m, mc.bootstrap_servers, "txn-consumer", expected=12,
                   assign=[(topic, 0), (topic, 1)],
                   extra={"isolation.level": "read_committed"}, linger=0.3)
        _expect_mock_apiversions(m)
        m.expect_apis("ApiVersions", "Metadata", "FindCoordinator", "InitProducerId",
                      "AddPartitionsToTxn", "Produce", "AddOffsetsToTxn", "TxnOffsetCommit",
                      "EndTxn", "Fetch")
        m.allow_anomaly("crc_mismatch", "Fetch",
                        "the mock writes its COMMIT/ABORT control batches with CRC 0 "
                        "(data batches are checked: crc_ok must be true for every record)")
        m.notes.append("The mock stores its control batches with a zero CRC; kwinspect is "
                       "expected to report crc_mismatch for those batches only.")
        m.notes.append("Control records (COMMIT/ABORT markers) take offsets 3 and 6 of each "
                       "partition; the librdkafka mock ignores read_committed, so aborted "
                       "records are fetched and returned to the consumer.")
    return m


def confluent_mock_errors(rig: Rig, workdir: str) -> Manifest:
    """Real error paths: unknown topic, retriable produce errors, a slow broker."""
    from confluent_kafka.admin import AdminClient

    from rig.mock_cluster import (
        NOT_ENOUGH_REPLICAS,
        NOT_LEADER_OR_FOLLOWER,
        UNKNOWN_TOPIC_OR_PARTITION,
    )

    with rig.private_mock(3) as mc:
        topic = "errors-ok"
        missing = "no-such-topic"
        mc.create_topic(topic, 3, 1)
        # Every partition led by broker 1 so the delays/errors below are deterministic.
        for part in range(3):
            mc.set_partition_leader(topic, part, 1)
        mc.set_topic_error(missing, UNKNOWN_TOPIC_OR_PARTITION)
        with recording(rig, workdir, "confluent-mock-errors",
                       "error paths on a private 3-broker mock cluster: (1) an AdminClient asks "
                       "for metadata of a topic the broker reports as UNKNOWN_TOPIC_OR_PARTITION; "
                       "(2) the next two Produce requests are answered with "
                       "NOT_LEADER_OR_FOLLOWER and NOT_ENOUGH_REPLICAS, the producer retries and "
                       "all 5 records land; (3) every response from broker 1 (leader of all "
                       "partitions) is delayed 60 ms by the mock; plus the ApiVersions v3 "
                       "UNSUPPORTED_VERSION fallback every librdkafka connection does here.",
                       mc) as m:
            m.add_topic(topic, 3, "rd_kafka_mock_topic_create (before the capture)")
            mc.set_rtt(1, 60)
            m.min_latency_ms_by_port[str(mc.ports[0])] = 60.0
            # (1) unknown topic via a Metadata request for that topic only
            ver, lib = _ck_version()
            admin_conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "errors-admin"}
            m.clients.append(ClientInfo("admin", "confluent-kafka", ver, "errors-admin",
                                        {"client.id": "errors-admin"}, lib))
            admin = AdminClient(admin_conf)
            md = admin.list_topics(topic=missing, timeout=10)
            tmd = md.topics.get(missing)
            err_name = tmd.error.name() if tmd is not None and tmd.error is not None else None
            m.admin.append({"call": f"list_topics(topic={missing!r})", "client_id": "errors-admin",
                            "result": err_name})
            if err_name != "UNKNOWN_TOPIC_OR_PART":
                raise RuntimeError(f"expected UNKNOWN_TOPIC_OR_PART for {missing}, got {err_name}")
            del admin
            gc.collect()
            m.expect_error("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", 3,
                           why=f"metadata for {missing!r}, made to fail with "
                               "rd_kafka_mock_topic_set_error")
            # (2) produce errors, retried by the client
            mc.push_request_errors(PRODUCE, [NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS])
            items = standard_items(topic, 5)
            for it in items:
                it["partition"] = 0
            ck_produce(m, mc.bootstrap_servers, "errors-producer", items, acks="all",
                       extra={"retries": 5, "retry.backoff.ms": 50, "linger.ms": 0,
                              "max.in.flight.requests.per.connection": 1})
            m.expect_error("Produce", "NOT_LEADER_OR_FOLLOWER", 6,
                           why="rd_kafka_mock_push_request_errors on Produce")
            m.expect_error("Produce", "NOT_ENOUGH_REPLICAS", 19,
                           why="rd_kafka_mock_push_request_errors on Produce")
            _expect_mock_apiversions(m)
            m.expect_apis("ApiVersions", "Metadata", "Produce")
            m.notes.append(f"Broker 1 (port {mc.ports[0]}) delays every response by 60 ms "
                           "(rd_kafka_mock_broker_set_rtt).")
    return m


def confluent_mock_legacy_msgset(rig: Rig, workdir: str) -> Manifest:
    """Produce capped at v2 and Fetch at v3: librdkafka falls back to magic 1 message sets."""
    with rig.private_mock(3) as mc:
        topic = "legacy"
        mc.create_topic(topic, 2, 1)
        mc.set_apiversion(PRODUCE, 0, 2)
        mc.set_apiversion(FETCH, 0, 3)
        with recording(rig, workdir, "confluent-mock-legacy-msgset",
                       "a private mock cluster advertises Produce v0-v2 and Fetch v0-v3 only "
                       "(rd_kafka_mock_set_apiversion), so confluent-kafka writes legacy "
                       "MessageSets (magic 1, no headers): the uncompressed ones to partition 0 "
                       "are stored; the gzip-wrapped ones to partition 1 are rejected by the "
                       "mock with a partition error UNSUPPORTED_VERSION (35) and the delivery "
                       "reports fail. An assign()-based consumer fetches partition 0 back with "
                       "Fetch v3 (magic 1 records on the fetch side too).", mc) as m:
            m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
            for part, codec in enumerate(("none", "gzip")):
                items = standard_items(topic, 6, tag=f"legacy-{codec}")
                for it in items:
                    it["partition"] = part
                    it["headers"] = []  # magic 1 has no headers
                ck_produce(m, mc.bootstrap_servers, f"legacy-producer-{codec}", items,
                           codec=codec, acks="all", extra={"linger.ms": 30, "retries": 0})
            failed = [r for r in m.produced if r.delivery_error]
            if len(failed) != 6 or any(r.partition != 1 for r in failed):
                raise RuntimeError(f"expected the 6 gzip records to fail, got {len(failed)}")
            ck_consume(m, mc.bootstrap_servers, "legacy-consumer", expected=6,
                       assign=[(topic, 0), (topic, 1)], linger=0.3)
            m.expect_error("Produce", "UNSUPPORTED_VERSION", 35,
                           why="the mock rejects compressed magic 1 message sets")
            _expect_mock_apiversions(m)
            m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch")
            m.notes.append("Produce v2 / Fetch v3 carry magic 1 message sets; the gzip wrapper "
                           "in the rejected produce request holds 6 inner magic 1 messages "
                           "with relative offsets 0-5.")
    return m


def confluent_mock_broker_down(rig: Rig, workdir: str) -> Manifest:
    """The partition leader goes away and comes back while a producer writes."""
    from confluent_kafka import Producer

    with rig.private_mock(3) as mc:
        topic = "flap"
        mc.create_topic(topic, 1, 1)
        mc.set_partition_leader(topic, 0, 2)
        with recording(rig, workdir, "confluent-mock-broker-down",
                       "a confluent-kafka producer writes 16 records, one every 50 ms, to a "
                       "partition led by broker 2 of a private mock cluster; after the 6th "
                       "record broker 2 is set down (rd_kafka_mock_broker_set_down: the broker "
                       "closes its connections and refuses new ones, so reconnect SYNs get "
                       "RSTs) and after the 11th it is set up again; the producer reconnects "
                       "and every record is delivered, in order.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            client_id = "flap-producer"
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": client_id,
                    "linger.ms": 0, "acks": "all", "reconnect.backoff.ms": 50,
                    "reconnect.backoff.max.ms": 200, "enable.idempotence": False,
                    "log_level": 2}  # the refused reconnects are the point; keep stderr quiet
            ver, lib = _ck_version()
            m.clients.append(ClientInfo("producer", "confluent-kafka", ver, client_id,
                                        {k: v for k, v in conf.items()
                                         if k != "bootstrap.servers"}, lib))
            items = standard_items(topic, 16)
            truths: list[RecordTruth | None] = [None] * len(items)

            def on_delivery(idx: int, err: Any, msg: Any) -> None:
                it = items[idx]
                ts = msg.timestamp()
                truths[idx] = RecordTruth.make(
                    topic, msg.partition(), msg.offset() if err is None else None, it["key"],
                    it["value"], it["headers"], codec="none", timestamp_ms=it["timestamp_ms"],
                    timestamp_type="create_time",
                    report_timestamp_ms=ts[1] if ts and ts[0] else None, client_id=client_id,
                    acks="all", delivery_error=err.name() if err is not None else None)

            p = Producer(conf)
            try:
                for idx, it in enumerate(items):
                    if idx == 6:
                        mc.set_down(2)
                    if idx == 11:
                        mc.set_up(2)
                    p.produce(topic, key=it["key"], value=it["value"],
                              headers=it["headers"] or None, partition=0,
                              timestamp=it["timestamp_ms"],
                              on_delivery=functools.partial(on_delivery, idx))
                    p.poll(0)
                    time.sleep(0.05)
                if p.flush(15):
                    raise RuntimeError("records not delivered after the broker came back")
            finally:
                _ck_close_producer(p)
            m.produced.extend(t for t in truths if t is not None)
            if any(t.delivery_error for t in m.produced):
                raise RuntimeError("a record failed across the broker outage")
            _expect_mock_apiversions(m)
            for api in ("Produce", "Metadata", "ApiVersions", "GetTelemetrySubscriptions"):
                m.allow_status(api, "response_missing")
            m.notes.append("Requests in flight when broker 2 closed its connections may have "
                           "no response (response_missing); they are retried on the new "
                           "connection. Refused reconnects appear as SYN/RST pairs.")
            m.expect_apis("ApiVersions", "Metadata", "Produce")
    return m


def kafka_python_mock_group(rig: Rig, workdir: str) -> Manifest:
    """kafka-python producer (gzip) + consumer group against the mock (api_version=(2, 3))."""
    mc = rig.mock()
    topic = rig.name("kp-events")
    group = rig.name("kp-group")
    mc.create_topic(topic, 2, 1)
    with recording(rig, workdir, "kafka-python-mock-group",
                   "kafka-python (api_version pinned to (2, 3) because the mock only speaks "
                   "ApiVersions <= v2) produces 16 gzip-compressed records to a 2-partition "
                   "topic on the mock cluster, then a kafka-python consumer in a fresh group "
                   "joins, fetches all 16, commits and leaves.", mc) as m:
        m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
        kp_produce(m, mc.bootstrap_servers, "kp-producer", standard_items(topic, 16, partitions=2),
                   codec="gzip", acks="all", extra={"api_version": (2, 3)})
        kp_consume(m, mc.bootstrap_servers, "kp-consumer", expected=16, topics=[topic],
                   group_id=group, extra={"api_version": (2, 3)}, linger=0.5)
        m.expect_apis("Metadata", "Produce", "FindCoordinator", "JoinGroup", "SyncGroup",
                      "OffsetFetch", "Fetch", "OffsetCommit", "LeaveGroup")
    return m


# ---------------------------------------------------------------------------
# Scenarios against tansu
# ---------------------------------------------------------------------------


def tansu_admin(rig: Rig, workdir: str) -> Manifest:
    """kafka-python admin against tansu: CreateTopics (and TOPIC_ALREADY_EXISTS), DeleteTopics."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

    tb = rig.tansu()
    t1, t2 = rig.name("admin-a"), rig.name("admin-b")
    with recording(rig, workdir, "tansu-admin",
                   "kafka-python's KafkaAdminClient against tansu: ApiVersions, CreateTopics of "
                   "two topics (3 and 1 partitions), CreateTopics of an existing topic "
                   "(TOPIC_ALREADY_EXISTS), list and describe topics (Metadata), then "
                   "DeleteTopics of one topic.", tb) as m:
        client_id = "kp-admin"
        m.clients.append(ClientInfo("admin", "kafka-python", _kp_version(), client_id, {}))
        admin = KafkaAdminClient(bootstrap_servers=tb.bootstrap_servers, client_id=client_id)
        try:
            def call(name: str, fn: Callable[[], Any]) -> Any:
                try:
                    res = fn()
                    m.admin.append({"call": name, "client_id": client_id, "result": "ok"})
                    return res
                except KafkaError as exc:
                    m.admin.append({"call": name, "client_id": client_id,
                                    "result": type(exc).__name__, "error": str(exc)})
                    return exc

            call(f"create_topics([{t1}(3), {t2}(1)])", lambda: admin.create_topics(
                [NewTopic(t1, 3, 1), NewTopic(t2, 1, 1)], timeout_ms=10000))
            m.add_topic(t1, 3, "CreateTopics (in the capture)")
            m.add_topic(t2, 1, "CreateTopics (in the capture)")
            res = call(f"create_topics([{t1}]) again", lambda: admin.create_topics(
                [NewTopic(t1, 3, 1)], timeout_ms=10000))
            if not isinstance(res, KafkaError):
                raise RuntimeError("creating an existing topic did not fail on tansu")
            m.expect_error("CreateTopics", "TOPIC_ALREADY_EXISTS", 36,
                           why=f"{t1} was created a moment before")
            call("list_topics()", admin.list_topics)
            call(f"describe_topics([{t1}, {t2}])", lambda: admin.describe_topics([t1, t2]))
            call(f"delete_topics([{t2}])", lambda: admin.delete_topics([t2], timeout_ms=10000))
        finally:
            admin.close()
        m.expect_apis("ApiVersions", "Metadata", "CreateTopics")
    return m


def tansu_produce_consume(rig: Rig, workdir: str) -> Manifest:
    """kafka-python producers with each codec it supports, plus a confluent snappy producer."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    tb = rig.tansu()
    topic = rig.name("tansu-codecs")
    parts = len(CODECS_KP) + 1
    # Created before the capture; tansu-admin shows CreateTopics on the wire.
    admin = KafkaAdminClient(bootstrap_servers=tb.bootstrap_servers, client_id="setup-admin")
    try:
        admin.create_topics([NewTopic(topic, parts, 1)], timeout_ms=10000)
    finally:
        admin.close()
    with recording(rig, workdir, "tansu-produce-consume",
                   "against tansu: four kafka-python producers (compression none, gzip, lz4, "
                   "zstd) and one confluent-kafka producer (snappy) each write 6 records to "
                   "their own partition of one topic; a confluent-kafka consumer and a "
                   "kafka-python consumer (both assign(), no group) fetch them back (the kafka-python one "
                   "skips the snappy partition: it has no snappy codec installed).", tb) as m:
        m.add_topic(topic, parts, "CreateTopics (before the capture)")
        for part, codec in enumerate(CODECS_KP):
            items = standard_items(topic, 6, size=200, tag=f"kp-{codec or 'none'}")
            for it in items:
                it["partition"] = part
            kp_produce(m, tb.bootstrap_servers, f"kp-producer-{codec or 'none'}", items,
                       codec=codec, acks="all")
        items = standard_items(topic, 6, size=200, tag="ck-snappy")
        for it in items:
            it["partition"] = parts - 1
        ck_produce(m, tb.bootstrap_servers, "ck-producer-snappy", items, codec="snappy")
        ck_consume(m, tb.bootstrap_servers, "ck-consumer", expected=6 * parts,
                   assign=[(topic, p) for p in range(parts)])
        # kafka-python cannot decompress snappy without python-snappy: skip that partition.
        kp_consume(m, tb.bootstrap_servers, "kp-consumer", expected=6 * (parts - 1),
                   assign=[(topic, p) for p in range(parts - 1)])
        m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets")
    return m


def tansu_errors(rig: Rig, workdir: str) -> Manifest:
    """Admin requests about a topic that does not exist: real UNKNOWN_TOPIC_OR_PARTITION."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    tb = rig.tansu()
    missing = rig.name("tansu-missing-topic")
    with recording(rig, workdir, "tansu-errors",
                   "kafka-python's KafkaAdminClient against tansu: describe_topics of a topic "
                   "that does not exist (Metadata answers UNKNOWN_TOPIC_OR_PARTITION), "
                   "delete_topics of the same topic (DeleteTopics answers "
                   "UNKNOWN_TOPIC_OR_PARTITION), and list_groups (ListGroups, empty); then a "
                   "confluent-kafka AdminClient configured for SASL/PLAIN gets "
                   "UNSUPPORTED_SASL_MECHANISM in its SaslHandshake responses (this tansu "
                   "has no authentication) and gives up after about a second.", tb) as m:
        client_id = "kp-errors-admin"
        m.clients.append(ClientInfo("admin", "kafka-python", _kp_version(), client_id, {}))
        admin = KafkaAdminClient(bootstrap_servers=tb.bootstrap_servers, client_id=client_id)
        try:
            res = admin.describe_topics([missing])
            codes = [t.get("error_code") for t in res]
            m.admin.append({"call": f"describe_topics([{missing}])", "client_id": client_id,
                            "result": f"error_code={codes}"})
            if codes != [3]:
                raise RuntimeError(f"tansu describe_topics of a missing topic gave {codes}")
            m.expect_error("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", 3,
                           why=f"metadata for {missing!r}, which does not exist")
            try:
                admin.delete_topics([missing], timeout_ms=10000)
                outcome = "ok"
            except KafkaError as exc:
                outcome = type(exc).__name__
            m.admin.append({"call": f"delete_topics([{missing}])", "client_id": client_id,
                            "result": outcome})
            if outcome != "UnknownTopicOrPartitionError":
                raise RuntimeError(f"tansu delete_topics of a missing topic gave {outcome}")
            m.expect_error("DeleteTopics", "UNKNOWN_TOPIC_OR_PARTITION", 3,
                           why=f"{missing!r} does not exist")
            groups = admin.list_groups()
            m.admin.append({"call": "list_groups()", "client_id": client_id,
                            "result": repr(groups)[:200]})
        finally:
            admin.close()
        from confluent_kafka.admin import AdminClient

        ver, lib = _ck_version()
        conf = {"bootstrap.servers": tb.bootstrap_servers, "client.id": "sasl-plain",
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "not-a-real-secret",
                "reconnect.backoff.ms": 200, "reconnect.backoff.max.ms": 400, "log_level": 0}
        m.clients.append(ClientInfo("admin", "confluent-kafka", ver, "sasl-plain",
                                    {k: v for k, v in conf.items() if k != "bootstrap.servers"},
                                    lib))
        ck_admin = AdminClient(conf)
        try:
            ck_admin.list_topics(timeout=1.0)
            outcome = "ok (unexpected)"
        except Exception as exc:  # noqa: BLE001 - failing is the point
            outcome = f"{type(exc).__name__}: {exc}"
        m.admin.append({"call": "list_topics(timeout=1) with SASL/PLAIN",
                        "client_id": "sasl-plain", "result": outcome})
        del ck_admin
        gc.collect()
        m.expect_error("SaslHandshake", "UNSUPPORTED_SASL_MECHANISM", 33,
                       why="the shared tansu runs without --authentication")
        m.expect_apis("ApiVersions", "Metadata", "DeleteTopics", "ListGroups", "SaslHandshake")
    return m


def tansu_consumer_group(rig: Rig, workdir: str) -> Manifest:
    """A confluent-kafka consumer group on tansu (about 5 s here; JoinGroup waits on tansu)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    tb = rig.tansu()
    topic = rig.name("tansu-group-topic")
    group = rig.name("tansu-group")
    admin = KafkaAdminClient(bootstrap_servers=tb.bootstrap_servers, client_id="setup-admin")
    try:
        admin.create_topics([NewTopic(topic, 2, 1)], timeout_ms=10000)
    finally:
        admin.close()
    with recording(rig, workdir, "tansu-consumer-group",
                   "against tansu: a confluent-kafka producer (zstd, idempotent) writes 10 "
                   "records to a 2-partition topic; a confluent-kafka consumer joins a fresh "
                   "group (tansu makes the join wait a few seconds), syncs, fetches all 10, "
                   "commits and leaves.", tb) as m:
        m.add_topic(topic, 2, "CreateTopics (before the capture)")
        ck_produce(m, tb.bootstrap_servers, "tg-producer", standard_items(topic, 10, partitions=2),
                   codec="zstd", acks="all", extra={"enable.idempotence": True})
        ck_consume(m, tb.bootstrap_servers, "tg-consumer", expected=10, topics=[topic],
                   group_id=group, timeout=60, linger=0.5)
        m.expect_apis("ApiVersions", "Metadata", "InitProducerId", "Produce", "FindCoordinator",
                      "JoinGroup", "SyncGroup", "OffsetFetch", "Fetch", "OffsetCommit",
                      "LeaveGroup")
    return m


def tansu_ipv6(rig: Rig, workdir: str) -> Manifest:
    """confluent-kafka admin, producer and consumer against tansu on [::1]."""
    from confluent_kafka.admin import AdminClient, NewTopic

    with rig.private_tansu(host="::1") as tb:
        topic = "v6-topic"
        with recording(rig, workdir, "tansu-ipv6-produce-consume",
                       "IPv6 loopback: tansu listens on [::1]; a confluent-kafka AdminClient "
                       "creates a 2-partition topic (CreateTopics), a producer writes 12 "
                       "gzip-compressed records, and an assign()-based consumer fetches them "
                       "back, all over ::1.", tb) as m:
            ver, lib = _ck_version()
            m.clients.append(ClientInfo("admin", "confluent-kafka", ver, "v6-admin",
                                        {"client.id": "v6-admin"}, lib))
            admin = AdminClient({"bootstrap.servers": tb.bootstrap_servers,
                                 "client.id": "v6-admin"})
            for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
                fut.result(15)
            m.admin.append({"call": f"create_topics([{topic}(2)])", "client_id": "v6-admin",
                            "result": "ok"})
            m.add_topic(topic, 2, "CreateTopics (in the capture)")
            del admin
            gc.collect()
            ck_produce(m, tb.bootstrap_servers, "v6-producer",
                       standard_items(topic, 12, partitions=2), codec="gzip", acks="all")
            ck_consume(m, tb.bootstrap_servers, "v6-consumer", expected=12,
                       assign=[(topic, 0), (topic, 1)])
            m.expect_apis("ApiVersions", "Metadata", "CreateTopics", "Produce", "Fetch")
            m.notes.append("kafka-python 3.0 cannot bootstrap from [::1] (it fails to resolve "
                           "the bracketed host), so this scenario uses confluent-kafka only.")
    return m


def tansu_sasl_rejected(rig: Rig, workdir: str) -> Manifest:
    """SASL against tansu --authentication: an unsupported mechanism, then an unknown user."""
    from confluent_kafka.admin import AdminClient

    from rig.tansu import TansuBroker

    tb = TansuBroker(log_path=os.path.join(rig.log_dir, "tansu-sasl.log"),
                     extra_args=["--authentication"])
    tb.start()
    try:
        with recording(rig, workdir, "tansu-sasl-rejected",
                       "tansu with --authentication (SCRAM only, no users): a confluent-kafka "
                       "AdminClient with SASL/PLAIN sends SaslHandshake(PLAIN) and tansu closes "
                       "the connection without answering (each attempt: ApiVersions, then an "
                       "unanswered SaslHandshake, then the broker's FIN); a second "
                       "one with SCRAM-SHA-512 completes SaslHandshake and two SaslAuthenticate "
                       "round trips, and the server's final SCRAM message says "
                       "e=unknown-user (inside auth_bytes, Kafka error code 0). Each client "
                       "retries its connection for about a second, then gives up.", tb) as m:
            ver, lib = _ck_version()
            for mech, client_id in (("PLAIN", "sasl-plain"), ("SCRAM-SHA-512", "sasl-scram")):
                conf = {"bootstrap.servers": tb.bootstrap_servers, "client.id": client_id,
                        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mech,
                        "sasl.username": "alice", "sasl.password": "not-a-real-secret",
                        "reconnect.backoff.ms": 200, "reconnect.backoff.max.ms": 400,
                        "log_level": 0}
                m.clients.append(ClientInfo("admin", "confluent-kafka", ver, client_id,
                                            {k: v for k, v in conf.items()
                                             if k not in ("bootstrap.servers",)}, lib))
                admin = AdminClient(conf)
                try:
                    admin.list_topics(timeout=1.0)
                    outcome = "ok (unexpected)"
                except Exception as exc:  # noqa: BLE001 - failing is the point
                    outcome = f"{type(exc).__name__}: {exc}"
                m.admin.append({"call": "list_topics(timeout=1)", "client_id": client_id,
                                "result": outcome})
                del admin
                gc.collect()
            m.allow_status("SaslHandshake", "response_missing")
            m.expect_apis("ApiVersions", "SaslHandshake", "SaslAuthenticate")
            m.notes.append("The SCRAM failure is in-band (server-final-message e=unknown-user "
                           "with error_code 0), so it is not a Kafka error code. The password "
                           "configured in the clients never appears on the wire (PLAIN stops at "
                           "the handshake; SCRAM sends only a proof).")
    finally:
        tb.stop()
    return m


class _ProxiedBroker:
    """describe() for a broker reached through a TLS proxy: both ports are captured."""

    def __init__(self, tb: Any, proxy: Any) -> None:
        self.tb, self.proxy = tb, proxy

    def describe(self) -> dict:
        d = self.tb.describe()
        d["ports"] = [self.proxy.port, self.tb.port]
        d["tls_proxy_port"] = self.proxy.port
        d["bootstrap_servers"] = f"127.0.0.1:{self.proxy.port} (TLS, via the proxy)"
        return d


def tansu_tls_proxy(rig: Rig, workdir: str) -> Manifest:
    """confluent-kafka over real TLS to a proxy in front of tansu."""
    import tempfile

    from rig.tansu import TansuBroker, free_port
    from rig.tlsproxy import TlsProxy, make_self_signed

    certdir = tempfile.mkdtemp(prefix="kwinspect-tls-")
    cert, key = make_self_signed(certdir)
    broker_port = free_port()
    with TlsProxy(("127.0.0.1", broker_port), cert, key) as proxy:
        tb = TansuBroker(broker_port, advertised_port=proxy.port,
                         log_path=os.path.join(rig.log_dir, "tansu-tls.log"))
        tb.start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            topic = "tls-topic"
            ssl_conf = {"security.protocol": "SSL", "ssl.ca.location": cert,
                        "ssl.endpoint.identification.algorithm": "none"}
            bootstrap = f"127.0.0.1:{proxy.port}"
            # Metadata advertises the proxy, so even setup goes through TLS.
            admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "setup-admin",
                                 **ssl_conf})
            for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                fut.result(15)
            del admin
            gc.collect()
            with recording(rig, workdir, "tansu-tls-proxy",
                           "TLS: tansu advertises the port of a TLS-terminating proxy "
                           "(rig.tlsproxy, Python ssl, self-signed certificate); "
                           "a confluent-kafka producer (security.protocol=SSL) writes 8 records "
                           "and an SSL consumer (assign()) reads them back through the proxy. "
                           "The capture holds both legs: TLS between client and proxy port, "
                           "plaintext Kafka between proxy and tansu.",
                           _ProxiedBroker(tb, proxy)) as m:
                m.add_topic(topic, 1, "CreateTopics (before the capture)")
                m.tls_ports = [proxy.port]
                items = standard_items(topic, 8)
                for it in items:
                    it["partition"] = 0
                ck_produce(m, bootstrap, "tls-producer", items, extra=ssl_conf)
                ck_consume(m, bootstrap, "tls-consumer", expected=8, assign=[(topic, 0)],
                           extra=ssl_conf)
                m.expected_anomalies.append(
                    {"kind": "tls_stream", "why": f"client <-> proxy port {proxy.port} is TLS"})
                m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch")
                m.notes.append("Records are decoded from the plaintext proxy -> tansu leg; the "
                               "client -> proxy leg must be reported as TLS, not decoded.")
        finally:
            tb.stop()
    shutil.rmtree(certdir, ignore_errors=True)
    return m


# ---------------------------------------------------------------------------
# The 1500-MTU namespace variant
# ---------------------------------------------------------------------------


def _mtu_body(rig: Rig, workdir: str) -> Manifest:
    """Runs inside the namespace (a child process): large records on a 1500-byte MTU."""
    mc = rig.mock()
    topic = "mtu-topic"
    group = "mtu-group"
    mc.create_topic(topic, 2, 1)
    with recording(rig, workdir, "netns-mtu1500-produce-consume",
                   "inside a fresh network namespace whose loopback has MTU 1500 and TSO/GSO/GRO "
                   "off, a confluent-kafka producer writes 24 records of about 6 KB and 2 of "
                   "about 40 KB (uncompressed) to the 3-broker mock cluster and a consumer "
                   "group fetches them back: requests and fetch responses span many "
                   "1448-byte TCP segments.", mc) as m:
        m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
        items = standard_items(topic, 24, partitions=2, size=6000, tag="mtu")
        items += standard_items(topic, 2, partitions=2, size=40000, tag="mtu-big")
        ck_produce(m, mc.bootstrap_servers, "mtu-producer", items, codec="none", acks="all",
                   extra={"linger.ms": 30})
        ck_consume(m, mc.bootstrap_servers, "mtu-consumer", expected=len(items), topics=[topic],
                   group_id=group, linger=0.3)
        _expect_mock_apiversions(m)
        m.expect_apis("ApiVersions", "Metadata", "Produce", "JoinGroup", "SyncGroup", "Fetch",
                      "OffsetCommit", "LeaveGroup")
    return m


def netns_mtu1500(rig: Rig, workdir: str) -> Manifest:
    """Large records on a 1500-MTU loopback in a fresh network namespace (child process)."""
    from rig.netns import NetNamespace

    name = "netns-mtu1500-produce-consume"
    os.makedirs(workdir, exist_ok=True)
    with NetNamespace() as ns:
        info = ns.describe()
        cmd = [*ns.prefix, sys.executable, "-m", "rig.scenarios", "--inner",
               "_mtu_body", "--workdir", os.path.abspath(workdir), "--netns-info",
               json.dumps(info)]
        # rig/ is not installed (it is not in the wheel): run from the repository root.
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if res.returncode != 0:
            raise RuntimeError(f"namespace scenario failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return Manifest.read(os.path.join(workdir, f"{name}.manifest.json"))


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

SCENARIOS: dict[str, ScenarioFn] = {
    "confluent-mock-produce-consume": confluent_mock_produce_consume,
    "confluent-mock-codecs": confluent_mock_codecs,
    "confluent-mock-acks": confluent_mock_acks,
    "confluent-mock-idempotent": confluent_mock_idempotent,
    "confluent-mock-transactions": confluent_mock_transactions,
    "confluent-mock-errors": confluent_mock_errors,
    "confluent-mock-legacy-msgset": confluent_mock_legacy_msgset,
    "confluent-mock-broker-down": confluent_mock_broker_down,
    "kafka-python-mock-group": kafka_python_mock_group,
    "tansu-admin": tansu_admin,
    "tansu-produce-consume": tansu_produce_consume,
    "tansu-errors": tansu_errors,
    "tansu-consumer-group": tansu_consumer_group,
    "tansu-ipv6-produce-consume": tansu_ipv6,
    "tansu-tls-proxy": tansu_tls_proxy,
    "tansu-sasl-rejected": tansu_sasl_rejected,
    "netns-mtu1500-produce-consume": netns_mtu1500,
}

# Scenarios that need something beyond tcpdump (checked by callers).
NEEDS_NETNS = {"netns-mtu1500-produce-consume"}
SLOW = {"tansu-consumer-group"}  # tansu holds JoinGroup for seconds

_INNER: dict[str, ScenarioFn] = {"_mtu_body": _mtu_body}


def unavailable_reason(name: str) -> str | None:
    """Why scenario `name` cannot run on this machine (beyond root + tcpdump), or None."""
    if name in NEEDS_NETNS:
        from rig.netns import unavailable_reason as netns_reason

        return netns_reason()
    if name == "tansu-tls-proxy":
        from rig.tlsproxy import openssl_path

        if openssl_path() is None:
            return "openssl is not installed (needed for the proxy's certificate)"
    if name == "tansu-ipv6-produce-consume":
        import socket

        try:
            with socket.socket(socket.AF_INET6) as sock:
                sock.bind(("::1", 0))
        except OSError as exc:
            return f"no IPv6 loopback: {exc}"
    return None


def run_scenario(name: str, rig: Rig, workdir: str) -> Manifest:
    return SCENARIOS[name](rig, workdir)


def _main(argv: list[str] | None = None) -> int:
    """Child-process entry used by the namespace variant."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inner", required=True, choices=sorted(_INNER))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--netns-info", default=None)
    args = ap.parse_args(argv)
    info = json.loads(args.netns_info) if args.netns_info else None
    with Rig(netns_info=info) as rig:
        _INNER[args.inner](rig, args.workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
