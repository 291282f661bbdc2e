"""The Spark-free parts of the pipeline: capture order, pcap cut points, the idle schedule."""

from __future__ import annotations

import heapq
import os
import random
import struct

import pytest

from kwinspect.spark.connection import IDLE_CHECK_EVERY, idle_checks
from kwinspect.spark.fragments import align_pcap, pcap_header, read_range

pytestmark = pytest.mark.spark

CAPTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "captures")
BIG = os.path.join(CAPTURES, "netns-mtu1500-produce-consume.pcap")


def _running_max_order(files):
    keyed = []
    for rank, seq in enumerate(files):
        m = float("-inf")
        for i, ts in enumerate(seq):
            m = max(m, ts)
            keyed.append(((m, rank, i), (rank, i)))
    return [v for _k, v in sorted(keyed)]


@pytest.mark.parametrize("seed", range(200))
def test_heapq_merge_is_a_stable_merge_on_running_max(seed):
    """What dissect_files does to several files equals the pipeline's sort key, even unsorted."""
    rnd = random.Random(seed)
    files = [[rnd.choice([rnd.randint(0, 20), rnd.randint(0, 5)]) for _ in range(rnd.randint(0, 12))]
             for _ in range(rnd.randint(1, 4))]
    tagged = [[(ts, rank, i) for i, ts in enumerate(seq)] for rank, seq in enumerate(files)]
    merged = [(rank, i) for _ts, rank, i in heapq.merge(*tagged, key=lambda t: t[0])]
    assert merged == _running_max_order(files)


def _record_starts(path):
    with open(path, "rb") as f:
        data = f.read()
    e = "<" if struct.unpack_from("<I", data)[0] in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    starts, pos = [], 24
    while pos + 16 <= len(data):
        starts.append(pos)
        pos += 16 + struct.unpack_from(e + "I", data, pos + 8)[0]
    return starts, len(data)


def test_cut_points_land_on_record_boundaries():
    starts, size = _record_starts(BIG)
    with open(BIG, "rb") as f:
        h = pcap_header(f)
        for pos in range(25, size, 173):
            got = align_pcap(f, h, pos)
            want = next((s for s in starts if s >= pos), size)
            assert got == want, pos


@pytest.mark.parametrize("split", [4096, 10_000, 65_536])
def test_ranges_read_every_packet_once(split):
    size = os.path.getsize(BIG)
    n = -(-size // split)
    whole = [b for b in read_range(BIG, 0, 0, 1, split)]
    parts = [b for r in range(n) for b in read_range(BIG, 0, r, n, split)]

    def segs(batches):
        out = []
        for b in batches:
            for row in b.to_pylist():
                if row["kind"] == "seg":
                    out.append((row["ts"], row["conn"], row["seq"], row["payload"]))
        return out

    assert n > 2
    assert segs(parts) == segs(whole)
    ranges = [row for b in parts for row in b.to_pylist() if row["kind"] == "range"]
    assert len(ranges) == n


def _checks_spec(ts):
    """Dissector.feed_segment, literally: check at the first segment >= previous check + 60 s."""
    out, nxt = [], 0.0
    for i, t in enumerate(ts):
        if t >= nxt:
            nxt = t + IDLE_CHECK_EVERY
            out.append(i)
    return out


@pytest.mark.parametrize("seed", range(50))
def test_idle_schedule_matches_the_dissector(seed):
    import numpy as np

    rnd = random.Random(seed)
    t, ts = 1.7e9, []
    for _ in range(rnd.randint(1, 400)):
        t += rnd.choice([0.001, 0.5, 7.0, 59.9, 60.0, 61.0, 700.0, -30.0])  # some go backwards
        ts.append(t)
    got = [pos[3] for pos, _ts in idle_checks(np.array(ts), lambda i: (ts[i], 0, 0, i))]
    assert got == _checks_spec(ts)


# ---------------------------------------------------------------------------
# Stage 1 + stage 2 without Spark, on a capture where the idle schedule matters
# ---------------------------------------------------------------------------

def _api_versions_request(cid: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, cid, 1) + b"x"
    return struct.pack(">i", len(body)) + body


def _api_versions_response(cid: int) -> bytes:
    body = struct.pack(">ihi", cid, 0, 0)
    return struct.pack(">i", len(body)) + body


def _idle_capture(path) -> None:
    """A's request is answered 1300 s later; B talks just before that answer arrives.

    Single-process, B's segment at t0+1300 triggers an idle check that closes A
    (response_missing), and A's late answer starts a new connection
    (request_missing).  A per-connection dissector that only checked at its own
    segments would pair them instead.
    """
    from tests.helpers.pcapgen import conversation, write_pcap

    a = conversation(("10.0.0.1", 40000), ("10.0.0.9", 9092),
                     [("c", _api_versions_request(1)), ("s", _api_versions_response(1))])
    b = conversation(("10.0.0.2", 40001), ("10.0.0.9", 9092),
                     [("c", _api_versions_request(1)), ("s", _api_versions_response(1)),
                      ("c", _api_versions_request(2)), ("s", _api_versions_response(2))], ts0=1_700_000_000.0005)
    late_a = next(i for i, s in enumerate(a) if s.payload and s.src.port == 9092)
    late_b = [i for i, s in enumerate(b) if s.payload and s.src.port == 40001][1]
    a = [s._replace(ts=s.ts + (1300.5 if i >= late_a else 0.0)) for i, s in enumerate(a)]
    b = [s._replace(ts=s.ts + (1300.0 if i >= late_b else 0.0)) for i, s in enumerate(b)]
    segs = sorted(a + b, key=lambda s: s.ts)
    write_pcap(path, [s._replace(index=i + 1) for i, s in enumerate(segs)])


def _mini_pipeline(path, use_schedule: bool):
    import numpy as np
    import pyarrow as pa

    from kwinspect.dissect import DissectConfig
    from kwinspect.spark.connection import dissect_partition, pos_of

    tbl = pa.Table.from_batches(list(read_range(str(path), 0, 0, 1, 1 << 30)))
    segs = [r for r in tbl.to_pylist() if r["kind"] == "seg"]
    for r in segs:
        r["kts"] = r["lpm"]
    order = sorted(segs, key=lambda r: (r["kts"], r["file"], r["rng"], r["idx"]))
    checks = idle_checks(np.array([r["ts"] for r in order]),
                         lambda i: pos_of(order[i]["kts"], 0, 0, order[i]["idx"])) if use_schedule else None
    by_conn = sorted(segs, key=lambda r: (r["conn"], r["kts"], r["file"], r["rng"], r["idx"]))
    batch = pa.Table.from_pylist(by_conn).to_batches()
    out = pa.Table.from_batches(list(dissect_partition(
        batch, config=DissectConfig(), values="auto", want_records=False, checks=checks,
        names={}, brokers={}, meta=False)))
    return _as_rows(out.to_pylist())


def _as_rows(dicts):
    from kwinspect.export.tables import TABLES as TABLE_COLUMNS

    rows = []
    for d in dicts:
        if d["table"] in ("exchanges", "errors"):
            rows.append((d["table"],) + tuple(repr(d[c]) for c in TABLE_COLUMNS[d["table"]]))
    return sorted(rows)


def test_idle_schedule_is_replayed_per_connection(tmp_path):
    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_files
    from kwinspect.spark.connection import EventBuffer

    path = tmp_path / "idle.pcap"
    _idle_capture(path)
    buf = EventBuffer()
    for ev in dissect_files([str(path)]):
        buf.add("exchanges" if isinstance(ev, Exchange) else "errors", "", ev.row())
    expected = _as_rows(buf.batch().to_pylist())
    assert any(r[0] == "errors" and "'response_missing'" in r for r in expected)
    assert _mini_pipeline(path, use_schedule=True) == expected
    assert _mini_pipeline(path, use_schedule=False) != expected  # the scenario needs the schedule


def test_commit_sweep_covers_records_from_the_frontier():
    """The deliveries tracker's commit rule, replayed per partition: a commit of offset C covers
    the records acknowledged before it from the frontier up to C; a record acknowledged below
    the frontier (out of offset order) gets no commit; one never committed past gets none."""
    import pyarrow as pa

    from kwinspect.spark.facts import commit_sweep

    steps = [("d_ack", 5, None), ("d_commit", 6, "g1"), ("d_ack", 3, None), ("d_ack", 9, None),
             ("d_ack", 7, None), ("d_commit", 8, "g2"), ("d_commit", 8, "g3"), ("d_commit", 10, "g4"),
             ("d_ack", 12, None)]
    rows = [{"table": t, "o_topic": "t", "o_partition": 0, "o_offset": off, "o_group_id": g, "o_ts": float(i)}
            for i, (t, off, g) in enumerate(steps)]
    rows += [{"table": "d_ack", "o_topic": "u", "o_partition": 0, "o_offset": 1, "o_group_id": None, "o_ts": 0.0},
             {"table": "d_commit", "o_topic": "u", "o_partition": 0, "o_offset": 5, "o_group_id": "h", "o_ts": 1.0}]
    out = [r for b in commit_sweep([pa.RecordBatch.from_pylist(rows)]) for r in b.to_pylist()]
    got = {(r["o_topic"], r["o_offset"]): (r["commit_group"], r["commit_offset"], r["commit_ts"]) for r in out}
    assert got == {("t", 5): ("g1", 6, 1.0), ("t", 7): ("g2", 8, 5.0), ("t", 9): ("g4", 10, 7.0),
                   ("u", 1): ("h", 5, 1.0)}


def test_packet_positions_pruned_below_the_watermark_keep_every_exchange_order(monkeypatch):
    """The stats facts carry each exchange's capture position, looked up from the packets the
    connection was fed; pruning the positions below the dissector's watermark (as often as
    every 8 segments here) must not lose one a later exchange needs."""
    import pyarrow as pa

    from kwinspect.dissect import DissectConfig
    from kwinspect.spark import connection

    tbl = pa.Table.from_batches(list(read_range(BIG, 0, 0, 1, 1 << 30)))
    segs = [r for r in tbl.to_pylist() if r["kind"] == "seg"]
    for r in segs:
        r["kts"] = r["lpm"]
    by_conn = sorted(segs, key=lambda r: (r["conn"], r["kts"], r["file"], r["rng"], r["idx"]))
    biggest = max(sum(1 for r in segs if r["conn"] == c) for c in {r["conn"] for r in segs})
    assert biggest > 50  # a connection long enough to be pruned many times at 8

    def facts():
        out = pa.Table.from_batches(list(connection.dissect_partition(
            pa.Table.from_pylist(by_conn).to_batches(), config=DissectConfig(), values="auto",
            want_records=False, checks=None, names={}, brokers={}, meta=False, stats=True)))
        return sorted((r["table"], r["conn"], r["p_kts"], r["p_idx"], r["o_seq"], r["o_sub"], r["o_series"])
                      for r in out.to_pylist() if r["table"] in ("obs", "lagfact"))

    whole = facts()
    assert len(whole) > 100
    monkeypatch.setattr(connection, "PRUNE_EVERY", 8)
    assert facts() == whole
