"""A Produce whose record batches a limit stops: a gzip bomb (8 MiB of zeros in a few KiB)
beside an ordinary batch, encoded with kafka-python's ProduceRequest v3 and MemoryRecordsBuilder.

    python tests/fuzz_regressions/record_bombs.py OUT.pcap
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from fuzz import harness  # noqa: E402
from helpers.pcapgen import conversation, write_pcap  # noqa: E402
from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402
from kafka.record import MemoryRecordsBuilder  # noqa: E402

_T = ProduceRequest.TopicProduceData
_P = _T.PartitionProduceData
_RT = ProduceResponse.TopicProduceResponse
_RP = _RT.PartitionProduceResponse

GOOD_VALUES = [f"value-{i}".encode() for i in range(3)]


def good_batch() -> bytes:
    bb = MemoryRecordsBuilder(2, 0, 1 << 20)
    for i, value in enumerate(GOOD_VALUES):
        bb.append(1_700_000_000_000 + i, f"key-{i}".encode(), value, [])
    bb.close()
    return bytes(bb.buffer())


def produce(cid: int) -> bytes:
    req = ProduceRequest[3](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        _T(name="bombs", partition_data=[_P(index=0, records=harness.hostile_record_sets()[0]),
                                         _P(index=1, records=good_batch())])])
    req.with_header(correlation_id=cid, client_id="crafted")
    return bytes(req.encode(framed=True, header=True))


def produce_response(cid: int) -> bytes:
    resp = ProduceResponse[3](responses=[_RT(name="bombs", partition_responses=[
        _RP(index=i, error_code=0, base_offset=0, log_append_time_ms=-1) for i in (0, 1)])], throttle_time_ms=0)
    resp.with_header(correlation_id=cid)
    return bytes(resp.encode(framed=True, header=True))


def write(out: Path) -> Path:
    msgs = [("c", produce(1)), ("s", produce_response(1))]
    write_pcap(out, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs))
    return out


if __name__ == "__main__":
    write(Path(sys.argv[1]))
