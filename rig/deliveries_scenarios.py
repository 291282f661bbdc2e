"""Scenarios for `kwinspect deliveries`: where did each record go?

Like scenarios.py (and built from its helpers): real brokers, real confluent-kafka
clients, tcpdump around the traffic, and the clients' own truths in the manifest:
each producer's delivery-report offsets, each consumer's receipts (client id and
group), and what the scenario did to cause a problem. tests/e2e/test_deliveries_live.py
checks `kwinspect deliveries` against those logs.

- deliveries-clean: producer + consumer group on the mock cluster, everything read
  once and committed.
- deliveries-retry-duplicate: a non-idempotent producer whose first ProduceResponse a
  proxy loses (rig.dropproxy in front of tansu, which advertises the proxy); the
  producer times out and retries, and the broker writes the batch twice. The capture
  holds the proxy <-> broker leg (the broker's port), where both acknowledgments are.
- deliveries-crash-before-commit: a group member in a child process receives the
  records and is killed (SIGKILL) before it commits; the next member of the group
  starts from the last commit (none) and fetches them again.
- deliveries-unread-partition: a producer writes to both partitions of a topic; the
  only consumer assign()s partition 0.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from rig.manifest import ClientInfo, Manifest, RecordTruth
from rig.rig import Rig
from rig.scenarios import (
    _ck_version,
    _expect_mock_apiversions,
    ck_consume,
    ck_produce,
    recording,
    standard_items,
)


def deliveries_clean(rig: Rig, workdir: str) -> Manifest:
    """Producer and consumer group on the mock: every record fetched once and committed."""
    mc = rig.mock()
    topic = rig.name("deliveries-clean")
    group = rig.name("deliveries-clean-group")
    mc.create_topic(topic, 3, 1)
    with recording(rig, workdir, "deliveries-clean",
                   "a confluent-kafka producer writes 24 records to a 3-partition topic on the mock "
                   "cluster; a consumer in a fresh group fetches all 24, commits synchronously and "
                   "leaves: every record is acknowledged, fetched once by the group, and committed.",
                   mc) as m:
        m.add_topic(topic, 3, "rd_kafka_mock_topic_create (before the capture)")
        ck_produce(m, mc.bootstrap_servers, "clean-producer", standard_items(topic, 24))
        ck_consume(m, mc.bootstrap_servers, "clean-consumer", expected=24, topics=[topic], group_id=group,
                   linger=0.3)
        _expect_mock_apiversions(m)
        m.expect_apis("Produce", "Fetch", "OffsetCommit", "JoinGroup")
        m.notes.append("Expected: every produced record is one deliveries row, fetched once by the "
                       "group and covered by its commit; no deliveries finding.")
    return m


class _BrokerLeg:
    """describe() for tansu behind the dropping proxy: the broker's port is captured (with
    ``both_legs`` the proxy's too: every request is then seen twice)."""

    def __init__(self, tb: Any, proxy: Any, both_legs: bool = False) -> None:
        self.tb, self.proxy, self.both_legs = tb, proxy, both_legs

    def describe(self) -> dict:
        d = self.tb.describe()
        if self.both_legs:
            d["ports"] = [self.proxy.port, self.tb.port]
        d["proxy_port"] = self.proxy.port
        d["bootstrap_servers"] = f"127.0.0.1:{self.proxy.port} (via the proxy; tansu advertises it)"
        return d


def deliveries_retry_duplicate(rig: Rig, workdir: str, both_legs: bool = False) -> Manifest:
    """A lost ProduceResponse: the non-idempotent producer retries and the broker writes twice."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from rig.dropproxy import ProduceResponseDropper
    from rig.tansu import TansuBroker, free_port

    broker_port = free_port()
    topic = "retry-dup"
    with ProduceResponseDropper(("127.0.0.1", broker_port)) as proxy:
        tb = TansuBroker(broker_port, advertised_port=proxy.port,
                         log_path=os.path.join(rig.log_dir, "tansu-dropproxy.log"))
        tb.start()
        try:
            bootstrap = f"127.0.0.1:{proxy.port}"
            admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "setup-admin"})
            for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                fut.result(15)
            del admin
            gc.collect()
            name = "deliveries-retry-duplicate" + ("-both-legs" if both_legs else "")
            legs = ("Both legs are captured (client <-> proxy and proxy <-> broker): every request "
                    "and response is in the file twice, except the lost response." if both_legs else
                    "The capture holds the proxy <-> broker leg, where the broker acknowledges both writes.")
            with recording(rig, workdir, name,
                           "tansu advertises the port of a proxy (rig.dropproxy) that forwards Kafka "
                           "frames and loses the response to the first Produce request; a confluent-kafka "
                           "producer with enable.idempotence=false and retries on times out "
                           "(socket.timeout.ms=2000) and sends the batch again, and the broker writes "
                           "it twice. Then 4 more records, and an assign() consumer reads the whole "
                           "partition through the proxy. " + legs, _BrokerLeg(tb, proxy, both_legs)) as m:
                m.add_topic(topic, 1, "CreateTopics (before the capture)")
                items = standard_items(topic, 6)
                for it in items:
                    it["partition"] = 0
                proxy.arm()
                conf = {"enable.idempotence": False, "retries": 5, "request.timeout.ms": 2000,
                        "socket.timeout.ms": 2000, "message.timeout.ms": 20000, "retry.backoff.ms": 100,
                        "linger.ms": 50, "log_level": 3}
                ck_produce(m, bootstrap, "retry-producer", items[:2], extra=conf, flush_timeout=40)
                if not proxy.dropped:
                    raise RuntimeError("the proxy lost no ProduceResponse")
                m.admin.append({"op": "ProduceResponse lost by the proxy", "dropped": list(proxy.dropped)})
                ck_produce(m, bootstrap, "retry-producer", items[2:], extra=conf)
                end = max(r.offset for r in m.produced if r.offset is not None) + 1
                ck_consume(m, bootstrap, "retry-consumer", expected=end, assign=[(topic, 0)])
                m.expect_apis("Produce", "Fetch")
                m.allow_status("Produce", "response_missing")  # if the retry went on a new connection
                m.notes.append("Expected: a retry_duplicate finding whose duplicate offsets are the "
                               "producer's delivery-report offsets of the first batch, and whose "
                               "original offsets are where the consumer received the same records first.")
        finally:
            tb.stop()
    return m


_CRASHING_CONSUMER = r"""
import base64, json, os, signal, sys
from confluent_kafka import Consumer
bootstrap, group, topic, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "crash-consumer",
              "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 2000,
              "heartbeat.interval.ms": 100, "log_level": 0})
c.subscribe([topic])
got = 0
while got < expected:
    msg = c.poll(0.1)
    if msg is None or msg.error():
        continue
    b64 = lambda v: None if v is None else base64.b64encode(v).decode()
    ts = msg.timestamp()
    print(json.dumps({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                      "key": b64(msg.key()), "value": b64(msg.value()),
                      "headers": [[k, b64(v)] for k, v in (msg.headers() or [])],
                      "timestamp_ms": ts[1] if ts and ts[0] else None, "timestamp_type": ts[0] if ts else None}),
          flush=True)
    got += 1
os.kill(os.getpid(), signal.SIGKILL)  # crash: no commit, no LeaveGroup
"""


def deliveries_crash_before_commit(rig: Rig, workdir: str) -> Manifest:
    """A group member receives the records and is killed before committing; the group reads them again."""
    mc = rig.mock()
    topic = rig.name("deliveries-crash")
    group = rig.name("deliveries-crash-group")
    mc.create_topic(topic, 1, 1)
    with recording(rig, workdir, "deliveries-crash-before-commit",
                   "a confluent-kafka producer writes 10 records to a 1-partition topic on the mock; a "
                   "consumer of a fresh group in a child process (crash-consumer, auto commit off, "
                   "session.timeout.ms=2000) receives all 10, logs them, and is killed with SIGKILL before "
                   "it commits; a second member of the same group (survivor-consumer) joins once the mock "
                   "has removed it, starts from the committed offset (none: earliest), fetches the 10 "
                   "again and commits.", mc) as m:
        m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
        m.group_ids.append(group)
        ck_produce(m, mc.bootstrap_servers, "crash-producer", standard_items(topic, 10))
        ver, lib = _ck_version()
        m.clients.append(ClientInfo("consumer", "confluent-kafka", ver, "crash-consumer",
                                    {"group.id": group, "enable.auto.commit": False, "session.timeout.ms": 2000,
                                     "killed": "SIGKILL after receiving 10 records"}, lib))
        child = subprocess.Popen([sys.executable, "-c", _CRASHING_CONSUMER, mc.bootstrap_servers, group, topic, "10"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            out, _ = child.communicate(timeout=60)
        finally:
            with contextlib.suppress(Exception):
                child.kill()
        if child.returncode != -signal.SIGKILL:
            raise RuntimeError(f"crash-consumer ended with {child.returncode}, not SIGKILL")
        for line in out.splitlines():
            r = json.loads(line)
            raw = [None if r[k] is None else base64.b64decode(r[k]) for k in ("key", "value")]
            headers = [(k, None if v is None else base64.b64decode(v)) for k, v in r["headers"]]
            m.consumed.append(RecordTruth.make(
                r["topic"], r["partition"], r["offset"], raw[0], raw[1], headers,
                timestamp_ms=r["timestamp_ms"], timestamp_type={1: "create_time", 2: "log_append_time"}.get(
                    r["timestamp_type"]), client_id="crash-consumer", group_id=group))
        if len(m.consumed) != 10:
            raise RuntimeError(f"crash-consumer logged {len(m.consumed)} of 10 records")
        ck_consume(m, mc.bootstrap_servers, "survivor-consumer", expected=10, topics=[topic], group_id=group,
                   timeout=40, extra={"session.timeout.ms": 6000})
        _expect_mock_apiversions(m)
        for api in ("Heartbeat", "JoinGroup", "SyncGroup", "Fetch", "Metadata", "OffsetFetch", "FindCoordinator",
                    "ApiVersions", "ListOffsets", "GetTelemetrySubscriptions"):
            m.allow_status(api, "response_missing")  # the killed consumer's last requests
        m.expect_apis("Produce", "Fetch", "OffsetCommit", "JoinGroup")
        # seen in the committed capture: SyncGroup v0 answered REBALANCE_IN_PROGRESS while the
        # killed member's session ran out, with the (non-nullable) assignment bytes of length -1
        m.allow_anomaly("decode_error", "SyncGroup",
                        "the mock answers a SyncGroup the rebalance interrupted (REBALANCE_IN_PROGRESS) with "
                        "assignment bytes of length -1, which SyncGroup v0-v3 do not allow")
        m.notes.append("Expected: a fetched_twice finding for the group naming the 10 offsets both "
                       "members logged.")
    return m


def deliveries_unread_partition(rig: Rig, workdir: str) -> Manifest:
    """Records written to two partitions; the only consumer reads partition 0."""
    mc = rig.mock()
    topic = rig.name("deliveries-unread")
    mc.create_topic(topic, 2, 1)
    with recording(rig, workdir, "deliveries-unread-partition",
                   "a confluent-kafka producer writes 8 records to each partition of a 2-partition topic on "
                   "the mock; the only consumer assign()s partition 0 and reads its 8: partition 1's "
                   "records are acknowledged and never fetched.", mc) as m:
        m.add_topic(topic, 2, "rd_kafka_mock_topic_create (before the capture)")
        items = standard_items(topic, 16)
        for i, it in enumerate(items):
            it["partition"] = i % 2
        ck_produce(m, mc.bootstrap_servers, "unread-producer", items)
        ck_consume(m, mc.bootstrap_servers, "partition0-consumer", expected=8, assign=[(topic, 0)])
        _expect_mock_apiversions(m)
        m.expect_apis("Produce", "Fetch")
        m.notes.append("Expected: a record_not_fetched finding naming partition 1 and the producer's "
                       "8 offsets there; no delivery_gap.")
    return m


def deliveries_consumer_seek(rig: Rig, workdir: str) -> Manifest:
    """A consumer seeks past records it never fetched: a skip, and a gap in what was read."""
    from confluent_kafka import Consumer, TopicPartition

    mc = rig.mock()
    topic = rig.name("deliveries-seek")
    mc.create_topic(topic, 1, 1)
    with recording(rig, workdir, "deliveries-consumer-seek",
                   "a confluent-kafka producer writes 3 records to a 1-partition topic on the mock; an "
                   "assign() consumer reads them and pauses the partition; the producer writes 7 more "
                   "(offsets 3-9); the consumer seeks to offset 6, resumes and reads 6-9: offsets 3-5 are "
                   "acknowledged and never fetched, and the consumer's fetch position jumps over them.",
                   mc) as m:
        m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
        items = standard_items(topic, 10)
        for it in items:
            it["partition"] = 0
        ck_produce(m, mc.bootstrap_servers, "seek-producer", items[:3])
        conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "seek-consumer",
                "group.id": "seek-consumer-assign-only", "enable.auto.commit": False, "log_level": 0}
        ver, lib = _ck_version()
        m.clients.append(ClientInfo("consumer", "confluent-kafka", ver, "seek-consumer",
                                    {k: v for k, v in conf.items() if k != "bootstrap.servers"}, lib))
        c = Consumer(conf)
        try:
            tp = TopicPartition(topic, 0, 0)
            c.assign([tp])
            got = _ck_poll(c, 3, "seek-consumer")
            c.pause([TopicPartition(topic, 0)])
            ck_produce(m, mc.bootstrap_servers, "seek-producer", items[3:])
            c.seek(TopicPartition(topic, 0, 6))
            c.resume([TopicPartition(topic, 0)])
            got += _ck_poll(c, 4, "seek-consumer")
        finally:
            c.close()
            del c
            gc.collect()
        m.consumed.extend(got)
        if [r.offset for r in got] != [0, 1, 2, 6, 7, 8, 9]:
            raise RuntimeError(f"seek-consumer read offsets {[r.offset for r in got]}")
        _expect_mock_apiversions(m)
        m.expect_apis("Produce", "Fetch")
        m.notes.append("Expected: offsets_skipped (from 3 to 6) and delivery_gap naming offsets 3-5.")
    return m


def _ck_poll(c: Any, n: int, client_id: str, timeout: float = 20.0) -> list[RecordTruth]:
    from rig.scenarios import _ck_record

    got: list[RecordTruth] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        msg = c.poll(0.1)
        if msg is not None and not msg.error():
            got.append(_ck_record(msg, client_id, None))
    if len(got) < n:
        raise RuntimeError(f"{client_id}: consumed {len(got)} of {n} records")
    return got


def deliveries_retry_duplicate_both_legs(rig: Rig, workdir: str) -> Manifest:
    """deliveries-retry-duplicate with both sides of the proxy captured (e2e only, not shipped)."""
    return deliveries_retry_duplicate(rig, workdir, both_legs=True)


SCENARIOS = {
    "deliveries-clean": deliveries_clean,
    "deliveries-retry-duplicate": deliveries_retry_duplicate,
    "deliveries-crash-before-commit": deliveries_crash_before_commit,
    "deliveries-unread-partition": deliveries_unread_partition,
    "deliveries-consumer-seek": deliveries_consumer_seek,
}
# run by tests/e2e only: the same fault seen on both legs of the proxy
E2E_SCENARIOS = {**SCENARIOS, "deliveries-retry-duplicate-both-legs": deliveries_retry_duplicate_both_legs}


def unavailable_reason(name: str) -> str | None:
    if name.startswith("deliveries-retry-duplicate"):
        from rig.tansu import tansu_path

        if tansu_path() is None:
            return "the tansu broker is not installed"
    return None


def _main(argv: list[str] | None = None) -> int:
    import argparse

    from rig.rig import Rig as _Rig

    ap = argparse.ArgumentParser(description="run the deliveries scenarios into a directory")
    ap.add_argument("--out", default="deliveries-captures")
    ap.add_argument("--only", action="append")
    args = ap.parse_args(argv)
    with _Rig() as rig:
        for name in args.only or list(SCENARIOS):
            t0 = time.monotonic()
            m = E2E_SCENARIOS[name](rig, args.out)
            print(f"{name}: {time.monotonic() - t0:.1f}s produced={len(m.produced)} consumed={len(m.consumed)} "
                  f"ports={m.kafka_ports}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
