"""The findings of the deliveries join, on Exchanges made by the real Conversation from
frames kio encoded, with record batches from kafka-python's DefaultRecordBatchBuilder
(encoders we did not write). Each rule is tested with a case that must fire and one
that must not; the offsets a finding names are the ones the test put on the wire.
"""

from __future__ import annotations

import datetime as dt
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as f_req
from kio.schema.fetch.v12 import response as f_resp
from kio.schema.offset_commit.v8 import request as oc_req
from kio.schema.offset_commit.v8 import response as oc_resp
from kio.schema.produce.v9 import request as p_req
from kio.schema.produce.v9 import response as p_resp
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from kwinspect.analyze.deliveries import DeliveryTracker
from kwinspect.analyze.diagnose import Diagnoser
from tests.analyze.test_diagnose import NO_THROTTLE, Wire

TS = 1_700_000_000_000


def records(values: list[str], *, base_offset: int = 0, pid: int = -1, seq: int = -1, ts: int = TS) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=pid,
                                  producer_epoch=0 if pid >= 0 else -1, base_sequence=seq, batch_size=1 << 20)
    for i, v in enumerate(values):
        b.append(i, timestamp=ts + i, key=f"k-{v}".encode(), value=v.encode(), headers=[])
    raw = bytearray(b.build())
    raw[0:8] = struct.pack(">q", base_offset)  # the broker's offset (not covered by the CRC)
    return bytes(raw)


def produce(w: Wire, t: float, batch: bytes, *, base: int | None, error: int = 0, partition: int = 0,
            client: str = "producer", port: int = 40000) -> None:
    req = p_req.ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(dt.timedelta(seconds=1)),
        topic_data=(p_req.TopicProduceData(name="orders", partition_data=(
            p_req.PartitionProduceData(index=i32(partition), records=batch),)),))
    resp = None if base is None and not error else p_resp.ProduceResponse(
        responses=(p_resp.TopicProduceResponse(name="orders", partition_responses=(
            p_resp.PartitionProduceResponse(index=i32(partition), error_code=ErrorCode(error),
                                            base_offset=i64(-1 if error else base), log_append_time=None,
                                            log_start_offset=i64(0), record_errors=(), error_message=None),)),),
        throttle_time=NO_THROTTLE)
    w.x(req, resp, t, client=client, port=port)


def fetch(w: Wire, t: float, fetch_offset: int, batch: bytes | None, *, client: str, port: int,
          partition: int = 0, high_watermark: int = 100) -> None:
    req = f_req.FetchRequest(
        cluster_id=None, replica_id=i32(-1), max_wait=i32Timedelta.parse(dt.timedelta(milliseconds=500)),
        min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1),
        topics=(f_req.FetchTopic(topic="orders", partitions=(f_req.FetchPartition(
            partition=i32(partition), current_leader_epoch=i32(-1), fetch_offset=i64(fetch_offset),
            last_fetched_epoch=i32(-1), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=(), rack_id="")
    resp = f_resp.FetchResponse(
        throttle_time=NO_THROTTLE, error_code=ErrorCode(0), session_id=i32(0),
        responses=(f_resp.FetchableTopicResponse(topic="orders", partitions=(
            f_resp.PartitionData(partition_index=i32(partition), error_code=ErrorCode(0),
                                 high_watermark=i64(high_watermark), last_stable_offset=i64(high_watermark),
                                 log_start_offset=i64(0),
                                 diverging_epoch=f_resp.EpochEndOffset(epoch=i32(-1), end_offset=i64(-1)),
                                 current_leader=f_resp.LeaderIdAndEpoch(leader_id=i32(-1), leader_epoch=i32(-1)),
                                 snapshot_id=f_resp.SnapshotId(end_offset=i64(-1), epoch=i32(-1)),
                                 aborted_transactions=(), preferred_read_replica=i32(-1), records=batch),)),))
    w.x(req, resp, t, client=client, port=port)


def commit(w: Wire, t: float, offset: int, *, group: str, client: str, port: int, error: int = 0) -> None:
    w.x(oc_req.OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=i32(1), member_id="m", group_instance_id=None,
            topics=(oc_req.OffsetCommitRequestTopic(name="orders", partitions=(
                oc_req.OffsetCommitRequestPartition(partition_index=i32(0), committed_offset=i64(offset),
                                                    committed_leader_epoch=i32(-1), committed_metadata=""),)),)),
        oc_resp.OffsetCommitResponse(throttle_time=NO_THROTTLE, topics=(oc_resp.OffsetCommitResponseTopic(
            name="orders", partitions=(oc_resp.OffsetCommitResponsePartition(
                partition_index=i32(0), error_code=ErrorCode(error)),)),)), t, client=client, port=port)


def wire() -> Wire:
    w = Wire()
    w.d = Diagnoser(deliveries=True)
    return w


def found(w: Wire, kind: str) -> list:
    return [f for f in w.d.findings() if f.kind == kind]


def rows(w: Wire) -> list[dict]:
    assert isinstance(w.d.deliveries, DeliveryTracker)
    return list(w.d.deliveries.rows())


VALUES = ["a", "b", "c", "d", "e", "f"]


def test_a_non_idempotent_retry_written_twice_names_both_offsets():
    w = wire()
    batch = records(VALUES[:3])
    produce(w, 1.0, batch, base=0)
    produce(w, 2.0, batch, base=3)  # the same records (same timestamps) again: a retry after a lost response
    (f,) = found(w, "retry_duplicate")
    assert f.severity == "warning"
    assert f.key["duplicates"] == [{"offset": 3, "original_offset": 0}, {"offset": 4, "original_offset": 1},
                                   {"offset": 5, "original_offset": 2}]
    assert "offsets 3-5 repeat 0-2" in f.title
    assert [e.correlation_id for e in f.evidence] == [1, 2]
    assert [r["offset"] for r in rows(w)] == [0, 1, 2, 3, 4, 5]


def test_the_same_values_produced_again_later_are_not_a_retry():
    w = wire()
    produce(w, 1.0, records(VALUES[:3]), base=0)
    produce(w, 2.0, records(VALUES[:3], ts=TS + 5000), base=3)  # new produce() calls: new timestamps
    assert not found(w, "retry_duplicate")


def test_an_idempotent_retry_after_an_error_is_linked_by_sequence():
    w = wire()
    batch = records(VALUES[:2], pid=1000, seq=0)
    produce(w, 1.0, batch, base=None, error=6)  # NOT_LEADER_OR_FOLLOWER
    produce(w, 2.0, batch, base=None)  # no response: the connection dropped
    produce(w, 3.0, batch, base=7)
    (f,) = found(w, "produce_retried")
    assert f.key["errors"] == ["NOT_LEADER_OR_FOLLOWER", "no response"]
    assert f.key["records"] == [{"offset": 7, "sequence": 0, "attempts": 3}, {"offset": 8, "sequence": 1, "attempts": 3}]
    assert [e.correlation_id for e in f.evidence] == [1, 3]
    assert [(r["produce_attempts"], r["error"]) for r in rows(w)] == [(3, "NOT_LEADER_OR_FOLLOWER, no response")] * 2
    assert not found(w, "retry_duplicate")


def test_a_group_that_fetches_records_twice_is_named_with_both_fetches_and_commits_are_joined():
    w = wire()
    produce(w, 1.0, records(VALUES), base=0)
    commit(w, 1.5, 0, group="g1", client="c1", port=50001)  # names c1's group
    fetch(w, 2.0, 0, records(VALUES, base_offset=0), client="c1", port=50001)
    commit(w, 2.5, 2, group="g1", client="c1", port=50001)  # covers 0 and 1
    # c1 crashes; c2 of the same group starts from the commit and reads 2.. again, and 0..1 too
    commit(w, 3.0, 2, group="g1", client="c2", port=50002)
    fetch(w, 3.5, 0, records(VALUES, base_offset=0), client="c2", port=50002)
    (f,) = found(w, "fetched_twice")
    assert f.key["group_id"] == "g1" and f.key["offsets"] == [0, 1, 2, 3, 4, 5]
    assert f.key["client_ids"] == ["c1", "c2"]
    assert {(e.stream.split("->")[0], e.correlation_id) for e in f.evidence} == {
        ("127.0.0.1:50001", 2), ("127.0.0.1:50002", 2)}
    assert "2 records had been committed before the repeat" in f.detail
    by_offset = {r["offset"]: r for r in rows(w)}
    assert by_offset[0]["fetch_clients"] == ["c1", "c2"] and by_offset[0]["times_fetched"] == 2
    assert by_offset[0]["fetch_groups"] == ["g1", "g1"]
    assert [(by_offset[o]["commit_offset"], by_offset[o]["commit_ts"]) for o in (0, 1)] == [(2, 2.501)] * 2
    assert by_offset[2]["commit_offset"] is None
    assert by_offset[0]["fetch_after_ms"] == [round((2.001 - 1.001) * 1000, 3), round((3.501 - 1.001) * 1000, 3)]


def test_two_groups_reading_the_same_records_is_not_a_double_fetch():
    w = wire()
    produce(w, 1.0, records(VALUES), base=0)
    commit(w, 1.5, 0, group="g1", client="c1", port=50001)
    commit(w, 1.5, 0, group="g2", client="c2", port=50002)
    fetch(w, 2.0, 0, records(VALUES), client="c1", port=50001)
    fetch(w, 2.0, 0, records(VALUES), client="c2", port=50002)
    assert not found(w, "fetched_twice")
    assert [r["fetch_groups"] for r in rows(w)] == [["g1", "g2"]] * 6


def test_a_consumer_that_jumps_over_records_skipped_them_and_left_a_gap():
    w = wire()
    produce(w, 1.0, records(VALUES), base=10)
    fetch(w, 2.0, 10, records(VALUES[:2], base_offset=10), client="c1", port=50001)
    fetch(w, 3.0, 14, records(VALUES[4:], base_offset=14), client="c1", port=50001)  # 12, 13 never read
    (skip,) = found(w, "offsets_skipped")
    assert (skip.key["from_offset"], skip.key["to_offset"], skip.key["offsets"]) == (12, 14, [12, 13])
    (gap,) = found(w, "delivery_gap")
    assert gap.key["offsets"] == [12, 13] and gap.key["fetched_up_to"] == 15
    assert not found(w, "record_not_fetched")


def test_records_nobody_fetched_are_info_only_when_the_capture_has_consumers():
    w = wire()
    produce(w, 1.0, records(VALUES[:2]), base=0, partition=1)
    assert not found(w, "record_not_fetched")  # no consumer in the capture: nothing to say
    produce(w, 1.5, records(VALUES[2:4]), base=0)
    fetch(w, 2.0, 0, records(VALUES[2:4]), client="c1", port=50001)
    (f,) = found(w, "record_not_fetched")
    assert (f.severity, f.key["partition"], f.key["offsets"]) == ("info", 1, [0, 1])
    assert not found(w, "delivery_gap")


def test_tracking_stops_at_the_cap_and_a_finding_says_so():
    w = wire()
    w.d.deliveries.max_records = 4
    produce(w, 1.0, records(VALUES), base=0)
    assert [r["offset"] for r in rows(w)] == [0, 1, 2, 3]
    (f,) = found(w, "deliveries_truncated")
    assert f.key == {"max_records": 4, "not_tracked": 2} and "truncated after 4 records" in f.title


# -- any order of produces, fetches and commits: no exception, and the table stays consistent --------

ops = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.integers(0, 3), st.sampled_from([None, 0, 2, 5, 9]), st.sampled_from([0, 0, 6]),
              st.sampled_from([-1, 1000]), st.integers(0, 1)),
    st.tuples(st.just("fetch"), st.integers(0, 12), st.integers(0, 4), st.sampled_from(["c1", "c2"]),
              st.integers(0, 1)),
    st.tuples(st.just("commit"), st.integers(0, 14), st.sampled_from(["g1", "g2"]), st.sampled_from(["c1", "c2"]),
              st.sampled_from([0, 0, 25])),
), max_size=14)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_sequence_keeps_the_table_consistent(seq):
    w = wire()
    t = 1.0
    for op in seq:
        t += 1.0
        if op[0] == "produce":
            _, n, base, error, pid, partition = op
            produce(w, t, records(VALUES[:n + 1], pid=pid, seq=0 if pid >= 0 else -1), base=base, error=error,
                    partition=partition)
        elif op[0] == "fetch":
            _, start, n, client, partition = op
            fetch(w, t, start, records(VALUES[:n + 1], base_offset=start), client=client,
                  port=50001 if client == "c1" else 50002, partition=partition)
        else:
            _, offset, group, client, error = op
            commit(w, t, offset, group=group, client=client, port=50001 if client == "c1" else 50002, error=error)
    out = rows(w)
    assert len({(r["topic"], r["partition"], r["offset"]) for r in out}) == len(out)
    for r in out:
        assert r["times_fetched"] >= len(r["fetch_clients"]) == len(r["fetch_after_ms"])
        assert r["commit_offset"] is None or r["commit_offset"] > r["offset"]
        assert r["produce_to_ack_ms"] >= 0
    for f in w.d.findings():
        assert f.title and f.severity in ("info", "warning", "error")
        f.as_dict()


def test_both_legs_of_a_proxy_count_each_request_once():
    """A capture of the client's and the broker's side of a proxy sees every request twice, with the
    same client id and correlation id: one acknowledgment, one fetch, and the leg that lost the
    answer is no failed attempt of its own (in either order the events come in)."""
    for lost_leg_first in (True, False):
        w = wire()
        batch = records(VALUES[:2])
        # client -> proxy (port 40000): its answer is lost; proxy -> broker (40001): acknowledged at 0
        produce(w, 1.0, batch, base=None, port=40000)
        if lost_leg_first:
            w.close(40000, 1.0003)
        produce(w, 1.0002, batch, base=0, port=40001)
        if not lost_leg_first:
            w.close(40000, 1.0003)
        # the producer's retry, 3 s later, on new connections (correlation ids start again at 1)
        produce(w, 4.0, batch, base=2, port=40002)
        produce(w, 4.0002, batch, base=2, port=40003)
        # a consumer reads everything; its Fetch is seen on both legs too
        fetch(w, 5.0, 0, records(VALUES[:2] * 2), client="c1", port=50001)
        fetch(w, 5.0002, 0, records(VALUES[:2] * 2), client="c1", port=50002)
        out = rows(w)
        assert [(r["offset"], r["produce_attempts"], r["error"], r["times_fetched"]) for r in out] == [
            (0, 1, None, 1), (1, 1, None, 1), (2, 1, None, 1), (3, 1, None, 1)]
        (f,) = found(w, "retry_duplicate")
        assert "offsets 2-3 repeat 0-1" in f.title
        assert not found(w, "fetched_twice") and not found(w, "produce_retried")


def test_an_idempotent_retry_the_broker_recognised_counts_as_an_attempt():
    w = wire()
    batch = records(VALUES[:2], pid=1000, seq=0)
    produce(w, 1.0, batch, base=5)
    produce(w, 4.0, batch, base=5, port=40001)  # the answer was lost; the broker returns the first offset
    assert [(r["offset"], r["produce_attempts"]) for r in rows(w)] == [(5, 2), (6, 2)]
    assert not found(w, "retry_duplicate")
