"""The Dissector reuses its last 4-tuple and ConnId lookups while the next segment has the
same endpoint objects; with connections opening, closing, being pruned and 4-tuples reused,
every count and event must be what fresh lookups give."""

from __future__ import annotations

from helpers.pcapgen import FIN, conversation, mangle
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint

EPS = [Endpoint("10.0.0.1", 40000), Endpoint("10.0.0.1", 40001), Endpoint("10.0.0.2", 9092)]


class ColdDissector(Dissector):
    """Looks everything up afresh for every segment."""

    def feed_segment(self, seg, _packets: int = 0) -> None:
        self._hot_pair = self._hot_cid = None
        super().feed_segment(seg, _packets)

    def _on_data(self, conn_id, src, dst, data, ts) -> None:
        self._hot_cid = None
        super()._on_data(conn_id, src, dst, data, ts)


def _run(cls, segments, keep: int):
    d = cls(DissectConfig(kafka_ports=frozenset({9092}), keep_closed_connections=keep))
    events = []
    for seg in segments:
        d.feed_segment(seg, 1)
        events += [e.row() for e in d.drain()]
    d.finish()
    events += [e.row() for e in d.drain()]
    conns = [(str(k), i.packets, i.kind, dict(i.bytes), i.closed) for k, i in d.connections.items()]
    return events, d.packet_counts(), conns, d.packet_accounting_error()


def _request(cid: int) -> bytes:
    payload = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + cid.to_bytes(4, "big") + b"\x00\x01c"
    return len(payload).to_bytes(4, "big") + payload


@settings(max_examples=60, deadline=None)
@given(conns=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["fin", "rst", None]), st.booleans(),
                                st.integers(0, 100)), min_size=1, max_size=5),
       keep=st.sampled_from([0, 1, 100]), drop=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 100))
def test_hot_lookups_change_nothing(conns, keep, drop, seed):
    segments = []
    t = 1_700_000_000.0
    for k, (client, close, handshake, isn) in enumerate(conns):
        segs = conversation(EPS[client], EPS[2], [("c", _request(k)), ("s", (k).to_bytes(4, "big") + b"\x00\x00")],
                            isn_client=isn, handshake=handshake, close=close, ts0=t)
        segs = mangle(segs, drop=drop, duplicate=0.2, reorder=0.2, seed=seed + k)
        # the endpoint objects of every connection are the same ones (as the packet parser's cache gives)
        segs = [s._replace(src=EPS[EPS.index(s.src)], dst=EPS[EPS.index(s.dst)]) for s in segs]
        if k and close == "fin":  # a retransmitted FIN after the close
            fins = [s for s in segs if s.flags & FIN]
            segs += fins[:1]
        segments += segs
        t = max(s.ts for s in segs) + (0.001 if seed % 2 else 200.0)  # within or past the close linger
    assert _run(Dissector, segments, keep) == _run(ColdDissector, segments, keep)
