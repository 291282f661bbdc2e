"""Scenarios that make real interop problems for `kwinspect diagnose` to find.

Each is a function `run(rig, workdir) -> Manifest` like those in scenarios.py (and
built from its public helpers): a private librdkafka mock cluster, real
confluent-kafka / kafka-python clients, tcpdump around the traffic. The mock makes
the faults: `push_request_errors` (errors for the next requests of an api),
`set_rtt` (added round-trip time), `set_apiversion` (narrower version ranges),
`set_partition_leader` (leader moves); a consumer killed with SIGKILL forces a
rebalance. `DIAG_SCENARIOS` maps each name to (function, finding kinds the capture
must yield); tests/e2e/test_diagnose_live.py runs them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from kwinspect.protocol.schema.api_keys import ApiKey
from rig.manifest import ClientInfo, Manifest
from rig.rig import Rig
from rig.scenarios import (
    _ck_close_producer,
    _ck_version,
    _expect_mock_apiversions,
    _kp_version,
    ck_consume,
    ck_produce,
    recording,
    standard_items,
)

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
METADATA = int(ApiKey.METADATA)
OFFSET_COMMIT = int(ApiKey.OFFSET_COMMIT)
END_TXN = int(ApiKey.END_TXN)
NOT_LEADER_OR_FOLLOWER = 6
OFFSET_METADATA_TOO_LARGE = 12
DUPLICATE_SEQUENCE_NUMBER, OUT_OF_ORDER_SEQUENCE_NUMBER = 46, 45
CONCURRENT_TRANSACTIONS, PRODUCER_FENCED = 51, 90
FETCH_SESSION_ID_NOT_FOUND = 70
TRANSPORT = -195  # the mock drops the connection instead of answering


def _client(m: Manifest, role: str, client_id: str, conf: dict[str, Any]) -> None:
    ver, lib = _ck_version()
    m.clients.append(ClientInfo(role, "confluent-kafka", ver, client_id,
                                {k: v for k, v in conf.items() if k != "bootstrap.servers"}, lib))


# ---------------------------------------------------------------------------
# Version negotiation
# ---------------------------------------------------------------------------


def diag_version_not_advertised(rig: Rig, workdir: str) -> Manifest:
    """Produce narrowed to v0-v2 on the broker; one client negotiates, one is pinned to Kafka 2.3."""

    with rig.private_mock(1) as mc:
        topic = "pinned"
        mc.create_topic(topic, 1, 1)
        mc.set_apiversion(PRODUCE, 0, 2)
        with recording(rig, workdir, "diag-version-not-advertised",
                       "the mock advertises Produce v0-v2 only (rd_kafka_mock_set_apiversion). A "
                       "negotiating producer writes 3 records with Produce v2; then a producer pinned to "
                       "Kafka 2.3 (kafka-python with api_version=(2, 3)) sends Produce v7, which the broker never advertised.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            ck_produce(m, mc.bootstrap_servers, "negotiating-producer", standard_items(topic, 3),
                       extra={"linger.ms": 0})
            from kafka import KafkaProducer

            conf = {"client_id": "pinned-producer", "api_version": (2, 3), "acks": 1, "retries": 0,
                    "request_timeout_ms": 1500, "max_block_ms": 3000}
            m.clients.append(ClientInfo("producer", "kafka-python", _kp_version(), "pinned-producer",
                                        {k: (list(v) if isinstance(v, tuple) else v) for k, v in conf.items()}))
            kp = KafkaProducer(bootstrap_servers=mc.bootstrap_servers, **conf)
            try:
                futures = [kp.send(topic, key=b"k", value=f"pinned-{i}".encode()) for i in range(2)]
                kp.flush(timeout=4)
                for fut in futures:
                    with contextlib.suppress(Exception):
                        fut.get(timeout=0.1)
            finally:
                kp.close(timeout=2)
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: version_not_advertised (Produce v7 vs advertised v0-v2).")
    return m


def diag_unsupported_version(rig: Rig, workdir: str) -> Manifest:
    """The broker answers two Produce requests with UNSUPPORTED_VERSION (injected)."""
    with rig.private_mock(1) as mc:
        topic = "unsupported"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-unsupported-version",
                       "the next two Produce requests are answered with UNSUPPORTED_VERSION (35) "
                       "(rd_kafka_mock_push_request_errors); the producer's delivery fails.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            mc.push_request_errors(PRODUCE, [35, 35])
            with contextlib.suppress(RuntimeError):
                ck_produce(m, mc.bootstrap_servers, "unsupported-producer", standard_items(topic, 2),
                           extra={"linger.ms": 0, "retries": 0, "message.timeout.ms": 2000},
                           flush_timeout=4)
            mc.clear_request_errors(PRODUCE)
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: unsupported_version on Produce.")
    return m


# ---------------------------------------------------------------------------
# Producers
# ---------------------------------------------------------------------------


def diag_producer_retries(rig: Rig, workdir: str) -> Manifest:
    """Idempotent producer: retriable errors, then the broker dropping the connection mid-request."""
    with rig.private_mock(1) as mc:
        topic = "retries"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-producer-retries",
                       "an idempotent confluent-kafka producer writes 6 records one by one; the first two "
                       "Produce requests are answered NOT_LEADER_OR_FOLLOWER (injected), then the mock "
                       "drops the connection on a Produce request (RD_KAFKA_RESP_ERR__TRANSPORT): the "
                       "producer reconnects and resends the same batch (same producer id, epoch and "
                       "sequence).", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            from confluent_kafka import Producer

            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "retry-producer",
                    "enable.idempotence": True, "linger.ms": 0, "retry.backoff.ms": 20,
                    "reconnect.backoff.ms": 20, "log_level": 0}
            _client(m, "producer", "retry-producer", conf)
            p = Producer(conf)
            try:
                p.produce(topic, key=b"k", value=b"warm-up")
                if p.flush(10):
                    raise RuntimeError("warm-up record not delivered")
                mc.push_request_errors(PRODUCE, [NOT_LEADER_OR_FOLLOWER, NOT_LEADER_OR_FOLLOWER])
                p.produce(topic, key=b"k", value=b"after-errors")
                if p.flush(10):
                    raise RuntimeError("record not delivered after NOT_LEADER_OR_FOLLOWER")
                mc.push_request_errors(PRODUCE, [TRANSPORT])
                p.produce(topic, key=b"k", value=b"after-disconnect")
                if p.flush(10):
                    raise RuntimeError("record not delivered after the dropped connection")
            finally:
                _ck_close_producer(p)
            _expect_mock_apiversions(m)
            m.allow_status("Produce", "response_missing")
            m.notes.append("Expected diagnosis: produce_retry, request_lost, leadership_errors.")
    return m


_TXN_VICTIM = r"""
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "client.id": sys.argv[2], "transactional.id": sys.argv[2],
              "linger.ms": 0, "log_level": 0})
p.init_transactions(10)
p.begin_transaction()
p.produce(sys.argv[3], key=b"k", value=b"never committed")
if p.flush(10):
    sys.exit(1)
print("produced", flush=True)
time.sleep(60)
"""


def diag_transactions(rig: Rig, workdir: str) -> Manifest:
    """One transaction aborted; one begun by a producer that is killed before EndTxn."""
    from confluent_kafka import Producer

    with rig.private_mock(1) as mc:
        topic = "txn-diag"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-transactions",
                       "a transactional producer (diag-txn-aborted) aborts its transaction; a second one "
                       "(diag-txn-open, in a child process) begins a transaction, produces a record and is "
                       "killed with SIGKILL before it can commit or abort.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            tid = "diag-txn-aborted"
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": tid, "transactional.id": tid,
                    "linger.ms": 0, "log_level": 0}
            _client(m, "producer", tid, conf)
            p = Producer(conf)
            try:
                p.init_transactions(10)
                p.begin_transaction()
                p.produce(topic, key=b"k", value=b"aborted")
                if p.flush(10):
                    raise RuntimeError(f"{tid}: record not delivered")
                p.abort_transaction(10)
            finally:
                _ck_close_producer(p)
            m.clients.append(ClientInfo("producer", "confluent-kafka", _ck_version()[0], "diag-txn-open",
                                        {"transactional.id": "diag-txn-open", "killed": "SIGKILL"},
                                        _ck_version()[1]))
            child = subprocess.Popen([sys.executable, "-c", _TXN_VICTIM, mc.bootstrap_servers, "diag-txn-open",
                                      topic], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                line = child.stdout.readline() if child.stdout else ""
                if "produced" not in line:
                    raise RuntimeError("transactional child did not produce")
                time.sleep(0.2)
            finally:
                child.kill()
                child.wait(10)
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: transaction_aborted (diag-txn-aborted), "
                           "transaction_open (diag-txn-open).")
    return m


def diag_producer_errors(rig: Rig, workdir: str) -> Manifest:
    """Sequence and transaction errors from the broker (injected), as a real client meets them."""
    from confluent_kafka import KafkaException, Producer

    with rig.private_mock(1) as mc:
        topic = "seq-errors"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-producer-errors",
                       "an idempotent producer's Produce requests are answered DUPLICATE_SEQUENCE_NUMBER "
                       "and then OUT_OF_ORDER_SEQUENCE_NUMBER (injected); a transactional producer's "
                       "EndTxn is answered CONCURRENT_TRANSACTIONS once (retried, then committed), and "
                       "the EndTxn of its next transaction PRODUCER_FENCED (fatal).", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "seq-producer",
                    "enable.idempotence": True, "linger.ms": 0, "message.timeout.ms": 3000,
                    "retry.backoff.ms": 20, "log_level": 0}
            _client(m, "producer", "seq-producer", conf)
            p = Producer(conf)
            try:
                p.produce(topic, value=b"warm-up")
                p.flush(5)
                for err in (DUPLICATE_SEQUENCE_NUMBER, OUT_OF_ORDER_SEQUENCE_NUMBER):
                    mc.push_request_errors(PRODUCE, [err])
                    with contextlib.suppress(KafkaException):  # librdkafka: OUT_OF_ORDER is fatal
                        p.produce(topic, value=f"after-{err}".encode())
                        p.flush(4)
            finally:
                _ck_close_producer(p)
            tid = "diag-fenced"
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": tid, "transactional.id": tid,
                    "linger.ms": 0, "log_level": 0}
            _client(m, "producer", tid, conf)
            p = Producer(conf)
            try:
                p.init_transactions(10)
                for err in (CONCURRENT_TRANSACTIONS, PRODUCER_FENCED):
                    p.begin_transaction()
                    p.produce(topic, value=f"txn-{err}".encode())
                    p.flush(5)
                    mc.push_request_errors(END_TXN, [err])
                    with contextlib.suppress(KafkaException):
                        p.commit_transaction(5)
            finally:
                _ck_close_producer(p)
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: duplicate_sequence, out_of_order_sequence, end_txn_failed, "
                           "producer_fenced.")
    return m


# ---------------------------------------------------------------------------
# Consumer groups
# ---------------------------------------------------------------------------

_VICTIM = r"""
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "client.id": "victim-consumer",
              "session.timeout.ms": 1500, "heartbeat.interval.ms": 100, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "log_level": 0})
c.subscribe([sys.argv[3]])
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
        break
while True:
    c.poll(0.1)
"""


def _poll(c: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c.poll(0.05)


def diag_group_churn(rig: Rig, workdir: str) -> Manifest:
    """A group rebalances over and over; one member is killed (SIGKILL) and times out."""
    from confluent_kafka import Consumer

    with rig.private_mock(1) as mc:
        topic = "churn"
        group = "diag-churn-group"
        mc.create_topic(topic, 4, 1)
        with recording(rig, workdir, "diag-group-churn",
                       "a long-lived consumer stays in a group while three short-lived consumers join "
                       "and leave in turn (LeaveGroup), making a rebalance each time; then a consumer in a "
                       "child process joins and is killed with SIGKILL: it never sends LeaveGroup, the "
                       "mock removes it after its 1.5 s session timeout, and the survivor's heartbeats "
                       "get REBALANCE_IN_PROGRESS.", mc) as m:
            m.add_topic(topic, 4, "rd_kafka_mock_topic_create (before the capture)")
            m.group_ids.append(group)
            base = {"bootstrap.servers": mc.bootstrap_servers, "group.id": group,
                    "session.timeout.ms": 1500, "heartbeat.interval.ms": 100,
                    "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0}
            survivor_conf = dict(base, **{"client.id": "survivor-consumer"})
            _client(m, "consumer", "survivor-consumer", survivor_conf)
            survivor = Consumer(survivor_conf)
            try:
                survivor.subscribe([topic])
                _wait_assigned(survivor, [], 30)
                for i in range(3):
                    conf = dict(base, **{"client.id": f"transient-consumer-{i}"})
                    _client(m, "consumer", conf["client.id"], conf)
                    c = Consumer(conf)
                    c.subscribe([topic])
                    _wait_assigned(c, [survivor], 30)
                    c.close()  # LeaveGroup
                    del c
                    _poll(survivor, 0.5)
                victim = subprocess.Popen([sys.executable, "-c", _VICTIM, mc.bootstrap_servers, group, topic],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                m.clients.append(ClientInfo("consumer", "confluent-kafka", _ck_version()[0], "victim-consumer",
                                            {"session.timeout.ms": 1500, "killed": "SIGKILL"},
                                            _ck_version()[1]))
                try:
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        survivor.poll(0.05)
                        if victim.poll() is not None:
                            raise RuntimeError("victim consumer exited early")
                        import select
                        ready, _, _ = select.select([victim.stdout], [], [], 0)
                        if ready and "assigned" in (victim.stdout.readline() or ""):
                            break
                    else:
                        raise RuntimeError("victim consumer never got an assignment")
                    _poll(survivor, 0.5)
                    victim.send_signal(signal.SIGKILL)
                finally:
                    with contextlib.suppress(Exception):
                        victim.kill()
                    victim.wait(10)
                # session timeout (1.5 s) + the rebalance
                _poll(survivor, 4.0)
            finally:
                survivor.close()
                del survivor
                gc.collect()
            _expect_mock_apiversions(m)
            for api in ("Heartbeat", "JoinGroup", "SyncGroup", "Fetch", "Metadata", "OffsetFetch",
                        "FindCoordinator", "ApiVersions", "ListOffsets", "GetTelemetrySubscriptions"):
                m.allow_status(api, "response_missing")  # the killed consumer's last requests
            m.notes.append("Expected diagnosis: member_lost (victim-consumer), rebalance_storm, "
                           "heartbeat_error REBALANCE_IN_PROGRESS, group_rebalance.")
    return m


_VICTIM_848 = r"""
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "client.id": "victim-848",
              "group.protocol": "consumer", "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "log_level": 0})
c.subscribe([sys.argv[3]])
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
        break
while True:
    c.poll(0.1)
"""


def _kip848_timeouts(mc: Any, session_ms: int, heartbeat_ms: int) -> None:
    """KIP-848 session timeout and heartbeat interval of the mock's consumer groups.

    MockCluster has no wrapper for these (librdkafka >= 2.10 has the functions), so they are
    called here with ctypes on the same library and the cluster's handle.
    """
    import ctypes

    from rig.mock_cluster import librdkafka_path

    lib = ctypes.CDLL(librdkafka_path())
    for name, value in (("rd_kafka_mock_set_group_consumer_session_timeout_ms", session_ms),
                        ("rd_kafka_mock_set_group_consumer_heartbeat_interval_ms", heartbeat_ms)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
        fn(mc._handle(), value)


def diag_kip848_member_lost(rig: Rig, workdir: str) -> Manifest:
    """KIP-848 (ConsumerGroupHeartbeat) group: one member is killed and stops heartbeating."""
    import select

    from confluent_kafka import Consumer

    with rig.private_mock(1) as mc:
        topic = "kip848"
        group = "diag-848-group"
        mc.create_topic(topic, 4, 1)
        _kip848_timeouts(mc, 1500, 200)
        with recording(rig, workdir, "diag-kip848-member-lost",
                       "two confluent-kafka consumers with group.protocol=consumer (KIP-848: "
                       "ConsumerGroupHeartbeat instead of JoinGroup/SyncGroup) share a 4-partition topic; "
                       "the one in a child process is killed with SIGKILL, stops heartbeating, and after "
                       "the session timeout (set to 1.5 s on the mock) the survivor is assigned all "
                       "partitions.", mc) as m:
            m.add_topic(topic, 4, "rd_kafka_mock_topic_create (before the capture)")
            m.group_ids.append(group)
            conf = {"bootstrap.servers": mc.bootstrap_servers, "group.id": group, "client.id": "survivor-848",
                    "group.protocol": "consumer", "auto.offset.reset": "earliest", "enable.auto.commit": False,
                    "log_level": 0}
            _client(m, "consumer", "survivor-848", conf)
            survivor = Consumer(conf)
            victim = None
            try:
                survivor.subscribe([topic])
                _wait_assigned(survivor, [], 30)
                victim = subprocess.Popen([sys.executable, "-c", _VICTIM_848, mc.bootstrap_servers, group, topic],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                m.clients.append(ClientInfo("consumer", "confluent-kafka", _ck_version()[0], "victim-848",
                                            {"group.protocol": "consumer", "killed": "SIGKILL"},
                                            _ck_version()[1]))
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    survivor.poll(0.05)
                    if victim.poll() is not None:
                        raise RuntimeError("victim consumer exited early")
                    ready, _, _ = select.select([victim.stdout], [], [], 0)
                    if ready and "assigned" in (victim.stdout.readline() or ""):
                        break
                else:
                    raise RuntimeError("victim consumer never got an assignment")
                _poll(survivor, 1.0)
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                deadline = time.monotonic() + 15  # the group's session timeout, then the new assignment
                while time.monotonic() < deadline and len(survivor.assignment()) < 4:
                    survivor.poll(0.05)
                if len(survivor.assignment()) < 4:
                    raise RuntimeError("the survivor never took over the killed member's partitions")
                _poll(survivor, 0.5)
            finally:
                if victim is not None and victim.poll() is None:
                    victim.kill()
                    victim.wait(10)
                survivor.close()
                del survivor
                gc.collect()
            _expect_mock_apiversions(m)
            for api in ("ConsumerGroupHeartbeat", "Fetch", "Metadata", "OffsetFetch", "FindCoordinator",
                        "ApiVersions", "ListOffsets", "GetTelemetrySubscriptions"):
                m.allow_status(api, "response_missing")
            m.notes.append("Expected diagnosis: member_lost (victim-848) from ConsumerGroupHeartbeat.")
    return m


def diag_kip848_clean(rig: Rig, workdir: str) -> Manifest:
    """KIP-848 group without faults: two consumers join, consume, and leave (epoch -1)."""
    from confluent_kafka import Consumer

    with rig.private_mock(1) as mc:
        topic = "kip848-clean"
        group = "diag-848-clean"
        mc.create_topic(topic, 4, 1)
        _kip848_timeouts(mc, 1500, 200)
        with recording(rig, workdir, "diag-kip848-clean",
                       "8 records produced; two confluent-kafka consumers with group.protocol=consumer "
                       "join one after the other, consume, commit and close (leaving with member epoch -1). "
                       "No fault: diagnose must raise no warning.", mc) as m:
            m.add_topic(topic, 4, "rd_kafka_mock_topic_create (before the capture)")
            m.group_ids.append(group)
            items = standard_items(topic, 8, partitions=4)
            ck_produce(m, mc.bootstrap_servers, "kip848-producer", items)
            consumers = []
            try:
                for name in ("kip848-a", "kip848-b"):
                    conf = {"bootstrap.servers": mc.bootstrap_servers, "group.id": group, "client.id": name,
                            "group.protocol": "consumer", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "log_level": 0}
                    _client(m, "consumer", name, conf)
                    c = Consumer(conf)
                    c.subscribe([topic])
                    consumers.append(c)
                    _wait_assigned(c, consumers[:-1], 30)
                for c in consumers:
                    _poll(c, 0.5)
                    with contextlib.suppress(Exception):
                        c.commit(asynchronous=False)
            finally:
                for c in consumers:
                    c.close()
                consumers.clear()
                gc.collect()
            _expect_mock_apiversions(m)
            m.allow_status("Fetch", "response_missing")
    return m


def _wait_assigned(c: Any, others: list[Any], timeout: float) -> None:
    # 30 s at the call sites: a rebalance on the mock normally takes well under a second,
    # but a CI run with both cores busy once needed more than 15 s.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c.poll(0.05)
        for o in others:
            o.poll(0)
        if c.assignment():
            return
    raise RuntimeError("consumer never got an assignment")


def diag_offsets(rig: Rig, workdir: str) -> Manifest:
    """A consumer commits beyond the end, then backwards; a commit fails; a fetch out of range."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    with rig.private_mock(1) as mc:
        topic = "offsets"
        group = "diag-offsets-group"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-offsets",
                       "4 records are produced; a group consumer reads them, then commits offset 1000 "
                       "(beyond the high watermark 4), then offset 1 (backwards), then a commit answered "
                       "OFFSET_METADATA_TOO_LARGE (injected); an assign()-based consumer asks for offset "
                       "1000 and gets OFFSET_OUT_OF_RANGE.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            ck_produce(m, mc.bootstrap_servers, "offsets-producer", standard_items(topic, 4))
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "offsets-consumer",
                    "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                    "heartbeat.interval.ms": 100, "session.timeout.ms": 6000, "log_level": 0}
            _client(m, "consumer", "offsets-consumer", conf)
            m.group_ids.append(group)
            c = Consumer(conf)
            try:
                c.subscribe([topic])
                got, deadline = 0, time.monotonic() + 15
                while got < 4 and time.monotonic() < deadline:
                    msg = c.poll(0.05)
                    if msg is not None and not msg.error():
                        got += 1
                if got < 4:
                    raise RuntimeError(f"offsets-consumer got {got} of 4 records")
                c.commit(offsets=[TopicPartition(topic, 0, 1000)], asynchronous=False)
                c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
                mc.push_request_errors(OFFSET_COMMIT, [OFFSET_METADATA_TOO_LARGE])
                with contextlib.suppress(KafkaException):
                    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
            finally:
                c.close()
                del c
                gc.collect()
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "far-consumer",
                    "group.id": "diag-far-assign-only", "auto.offset.reset": "earliest",
                    "enable.auto.commit": False, "log_level": 0}
            _client(m, "consumer", "far-consumer", conf)
            c = Consumer(conf)
            try:
                c.assign([TopicPartition(topic, 0, 1000)])
                _poll(c, 1.0)
            finally:
                c.close()
                del c
                gc.collect()
            _expect_mock_apiversions(m)
            m.allow_status("Fetch", "response_missing")
            m.notes.append("Expected diagnosis: commit_beyond_high_watermark, offset_commit_rewind, "
                           "offset_commit_failed, offset_out_of_range.")
    return m


# ---------------------------------------------------------------------------
# Fetch sessions, metadata, leaders
# ---------------------------------------------------------------------------


def diag_fetch_sessions(rig: Rig, workdir: str) -> Manifest:
    """Fetch answered FETCH_SESSION_ID_NOT_FOUND several times in a row (injected)."""
    with rig.private_mock(1) as mc:
        topic = "sessions"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-fetch-sessions",
                       "4 records are produced, then the next 4 Fetch requests are answered "
                       "FETCH_SESSION_ID_NOT_FOUND (rd_kafka_mock_push_request_errors) before an "
                       "assign()-based consumer gets its records.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            ck_produce(m, mc.bootstrap_servers, "sessions-producer", standard_items(topic, 4))
            mc.push_request_errors(FETCH, [FETCH_SESSION_ID_NOT_FOUND] * 4)
            ck_consume(m, mc.bootstrap_servers, "sessions-consumer", expected=4, assign=[(topic, 0)],
                       extra={"fetch.error.backoff.ms": 10, "log_level": 0}, timeout=15)
            mc.clear_request_errors(FETCH)
            _expect_mock_apiversions(m)
            m.allow_status("Fetch", "response_missing")
            m.notes.append("Expected diagnosis: fetch_session_reset, fetch_session_churn.")
    return m


def diag_metadata_storm(rig: Rig, workdir: str) -> Manifest:
    """An application that creates a client per request: connection churn and a metadata storm."""
    from confluent_kafka.admin import AdminClient

    with rig.private_mock(1) as mc:
        topic = "storm"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-metadata-storm",
                       "an application creates a new AdminClient (same client.id) for each of 24 "
                       "list_topics calls: 24 connections and 24+ Metadata requests in a few seconds.",
                       mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "storm-admin", "log_level": 0}
            _client(m, "admin", "storm-admin", conf)
            for _ in range(24):
                a = AdminClient(conf)
                a.list_topics(topic=topic, timeout=5)
                del a
                gc.collect()
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: metadata_storm, connection_churn.")
    return m


def diag_leader_moves(rig: Rig, workdir: str) -> Manifest:
    """The partition leader moves between brokers while a producer writes; NOT_LEADER bursts."""
    from confluent_kafka import Producer

    with rig.private_mock(3) as mc:
        topic = "moves"
        mc.create_topic(topic, 1, 1)
        mc.set_partition_leader(topic, 0, 1)
        with recording(rig, workdir, "diag-leader-moves",
                       "a producer writes one record at a time to a partition whose leader the mock moves "
                       "1 -> 2 -> 3 -> 1 (rd_kafka_mock_partition_set_leader); six Produce requests are "
                       "also answered NOT_LEADER_OR_FOLLOWER (injected) so the producer refreshes "
                       "metadata and retries.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "moves-producer", "linger.ms": 0,
                    "retry.backoff.ms": 20, "topic.metadata.refresh.interval.ms": 100, "log_level": 0}
            _client(m, "producer", "moves-producer", conf)
            p = Producer(conf)
            try:
                for i, leader in enumerate((1, 2, 3, 1)):
                    mc.set_partition_leader(topic, 0, leader)
                    if i == 1:
                        mc.push_request_errors(PRODUCE, [NOT_LEADER_OR_FOLLOWER] * 6)
                    for _ in range(2):
                        p.produce(topic, key=b"k", value=f"leader-{leader}".encode())
                        if p.flush(10):
                            raise RuntimeError("record not delivered while the leader moved")
                    _wait_metadata(p, topic, leader, 5)
            finally:
                _ck_close_producer(p)
            _expect_mock_apiversions(m)
            m.allow_status("Produce", "response_missing")
            m.notes.append("Expected diagnosis: leader_change, leader_flapping, error_burst "
                           "NOT_LEADER_OR_FOLLOWER.")
    return m


def _wait_metadata(p: Any, topic: str, leader: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = p.list_topics(topic=topic, timeout=2)
        t = md.topics.get(topic)
        if t is not None and t.partitions.get(0) is not None and t.partitions[0].leader == leader:
            return
        time.sleep(0.05)


def diag_consumer_lag(rig: Rig, workdir: str) -> Manifest:
    """A group consumer slower than its producer: the lag grows fetch after fetch."""
    import threading

    from confluent_kafka import Consumer, Producer

    with rig.private_mock(1) as mc:
        topic = "lagging"
        group = "diag-lag-group"
        mc.create_topic(topic, 1, 1)
        with recording(rig, workdir, "diag-consumer-lag",
                       "a confluent-kafka producer writes about 2000 small records/s for 5 s while a "
                       "confluent-kafka consumer in a group, with 1000-byte fetches and a 1 KiB prefetch "
                       "queue, handles one record per ~5 ms (about 200 records/s): every Fetch finds it "
                       "further behind the high watermark.", mc) as m:
            m.add_topic(topic, 1, "rd_kafka_mock_topic_create (before the capture)")
            m.group_ids.append(group)
            pconf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "lag-producer", "linger.ms": 0,
                     "acks": 1, "log_level": 0}
            _client(m, "producer", "lag-producer", pconf)
            stop = threading.Event()
            errors: list[BaseException] = []

            def produce_fast() -> None:
                p = Producer(pconf)
                try:
                    while not stop.is_set():  # about 2000 records/s, in small batches
                        for i in range(20):
                            p.produce(topic, value=b"x" * 100 + str(i).encode())
                        p.poll(0)
                        time.sleep(0.01)
                    p.flush(10)
                except BaseException as exc:  # reported by the scenario
                    errors.append(exc)
                finally:
                    _ck_close_producer(p)

            cconf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "lag-consumer", "group.id": group,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0,
                     "max.partition.fetch.bytes": 1000, "fetch.max.bytes": 1000, "message.max.bytes": 1000,
                     "queued.max.messages.kbytes": 1, "queued.min.messages": 1, "fetch.queue.backoff.ms": 50,
                     "heartbeat.interval.ms": 100, "session.timeout.ms": 6000}
            _client(m, "consumer", "lag-consumer", cconf)
            consumer = Consumer(cconf)
            t = threading.Thread(target=produce_fast, daemon=True)
            try:
                consumer.subscribe([topic])
                _wait_assigned(consumer, [], 30)
                t.start()
                end = time.monotonic() + 5.0
                got = 0
                while time.monotonic() < end:  # one record per ~5 ms: about 200 records/s
                    msg = consumer.poll(0.05)
                    if msg is not None and not msg.error():
                        got += 1
                    time.sleep(0.005)
                if got == 0:
                    raise RuntimeError("the slow consumer got nothing")
            finally:
                stop.set()
                if t.is_alive():
                    t.join(15)
                consumer.close()
            if errors:
                raise RuntimeError(f"producer failed: {errors[0]!r}")
            _expect_mock_apiversions(m)
            m.allow_status("Fetch", "response_missing")
            m.notes.append("Expected diagnosis: consumer_lag_growing.")
    return m


# ---------------------------------------------------------------------------
# Latency
# ---------------------------------------------------------------------------


def diag_latency(rig: Rig, workdir: str) -> Manifest:
    """Fast produce round trips, a short 400 ms spike on every broker, and one slow broker."""
    from confluent_kafka import Producer

    with rig.private_mock(3) as mc:
        topic = "latency"
        mc.create_topic(topic, 3, 1)
        for part in range(3):
            mc.set_partition_leader(topic, part, part + 1)
        with recording(rig, workdir, "diag-latency",
                       "a producer writes one record at a time to 3 partitions led by brokers 1-3. "
                       "Broker 3 adds 120 ms to every response (rd_kafka_mock_broker_set_rtt) for the "
                       "whole capture; after 10 rounds every broker adds 400 ms for 2 records, then "
                       "the extra round-trip time is removed again on brokers 1 and 2.", mc) as m:
            m.add_topic(topic, 3, "rd_kafka_mock_topic_create (before the capture)")
            conf = {"bootstrap.servers": mc.bootstrap_servers, "client.id": "latency-producer",
                    "linger.ms": 0, "log_level": 0}
            _client(m, "producer", "latency-producer", conf)
            p = Producer(conf)
            try:
                mc.set_rtt(3, 120)
                for i in range(14):
                    if i == 10:
                        mc.set_rtt(1, 400)
                        mc.set_rtt(2, 400)
                    if i == 11:
                        mc.set_rtt(1, 0)
                        mc.set_rtt(2, 0)
                    for part in range(2):  # brokers 1 and 2: fast, except the spike
                        p.produce(topic, value=f"r{i}p{part}".encode(), partition=part)
                        if p.flush(10):
                            raise RuntimeError("record not delivered")
                    if i % 2 == 0:
                        p.produce(topic, value=f"r{i}p2".encode(), partition=2)
                        if p.flush(10):
                            raise RuntimeError("record not delivered")
            finally:
                mc.set_rtt(-1, 0)
                _ck_close_producer(p)
            _expect_mock_apiversions(m)
            m.notes.append("Expected diagnosis: latency_outlier (Produce), slow_broker (broker 3).")
    return m


ScenarioFn = Callable[[Rig, str], Manifest]

# name -> (scenario, finding kinds its capture must yield)
DIAG_SCENARIOS: dict[str, tuple[ScenarioFn, frozenset[str]]] = {
    "diag-version-not-advertised": (diag_version_not_advertised, frozenset({"version_not_advertised"})),
    "diag-unsupported-version": (diag_unsupported_version, frozenset({"unsupported_version"})),
    "diag-producer-retries": (diag_producer_retries, frozenset({"produce_retry", "request_lost",
                                                               "leadership_errors"})),
    "diag-transactions": (diag_transactions, frozenset({"transaction_aborted", "transaction_open"})),
    "diag-producer-errors": (diag_producer_errors, frozenset({"duplicate_sequence", "out_of_order_sequence",
                                                             "end_txn_failed", "producer_fenced"})),
    "diag-offsets": (diag_offsets, frozenset({"commit_beyond_high_watermark", "offset_commit_rewind",
                                              "offset_commit_failed", "offset_out_of_range"})),
    "diag-group-churn": (diag_group_churn, frozenset({"member_lost", "rebalance_storm", "heartbeat_error",
                                                      "group_rebalance"})),
    "diag-kip848-member-lost": (diag_kip848_member_lost, frozenset({"member_lost"})),
    "diag-fetch-sessions": (diag_fetch_sessions, frozenset({"fetch_session_reset", "fetch_session_churn"})),
    "diag-metadata-storm": (diag_metadata_storm, frozenset({"metadata_storm", "connection_churn"})),
    "diag-leader-moves": (diag_leader_moves, frozenset({"leader_change", "error_burst"})),
    "diag-latency": (diag_latency, frozenset({"latency_outlier", "slow_broker"})),
    "diag-consumer-lag": (diag_consumer_lag, frozenset({"consumer_lag_growing"})),
}


# Fault-free scenarios of this module: their captures must raise no warning or error.
CLEAN_DIAG_SCENARIOS: dict[str, ScenarioFn] = {
    "diag-kip848-clean": diag_kip848_clean,
}


def run_diag_scenario(name: str, rig: Rig, workdir: str) -> Manifest:
    if name in CLEAN_DIAG_SCENARIOS:
        return CLEAN_DIAG_SCENARIOS[name](rig, workdir)
    return DIAG_SCENARIOS[name][0](rig, workdir)


def _main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="run diagnose scenarios into a directory")
    ap.add_argument("--out", default="diag-captures")
    ap.add_argument("--only", action="append")
    args = ap.parse_args(argv)
    with Rig() as rig:
        for name in args.only or [*DIAG_SCENARIOS, *CLEAN_DIAG_SCENARIOS]:
            t0 = time.monotonic()
            m = run_diag_scenario(name, rig, args.out)
            print(f"{name}: {os.path.join(args.out, m.pcap)} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
