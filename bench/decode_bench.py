"""Decode speed of kwinspect.protocol for a few representative frames.

    python bench/decode_bench.py [--seconds 1.0]
    python bench/decode_bench.py --capture FILE [--kafka-ports P,P] [--rounds 5]

Frames are encoded by kio (an independent encoder): a Produce v9 request
carrying record batches, a Fetch v12 response with record batches in several
partitions, a Metadata v12 response for a 50-topic cluster, and two small
frames (ApiVersions v3 response, Heartbeat v4 request).  Each is decoded in a
loop for about --seconds; the table shows frames/s and MB/s (frame bytes, size
prefix excluded) and the one-time cost of compiling that version's readers.
Records are handed to protocol/records.py, which parses batch headers only
(records themselves decode lazily), so that cost is included.

With --capture, every frame kwinspect decodes from that capture is recorded
once, then decoded again with the generated fast decoders (decode_request /
decode_response) and with the reference closure decoder alone
(decode_*_reference); the table shows CPU seconds of each over all frames
(best of --rounds) and the speedup.

Not part of `make test`: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import io
import platform
import sys
import time

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_writer
from kio.static.primitive import i16, i32, i32Timedelta, i64

from kwinspect.protocol import decode as decode_module
from kwinspect.protocol import decode_request, decode_response


def record_batch(n_records: int, value_size: int, base_offset: int = 0) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 24)
    for i in range(n_records):
        b.append(i, timestamp=1_700_000_000_000 + i, key=f"key-{i}".encode(),
                 value=bytes(value_size), headers=[("trace", b"abc")])
    raw = bytearray(b.build())
    raw[0:8] = base_offset.to_bytes(8, "big")
    return bytes(raw)


def _frame(header_cls, header, entity) -> bytes:
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def request(entity) -> bytes:
    return _frame(RequestHeader, RequestHeader(request_api_key=entity.__api_key__,
                                               request_api_version=entity.__version__,
                                               correlation_id=i32(1), client_id="bench"), entity)


def response(entity) -> bytes:
    cls = ResponseHeaderV0 if entity.__api_key__ == 18 else ResponseHeaderV1
    return _frame(cls, cls(correlation_id=i32(1)), entity)


ZERO = i32Timedelta.parse(datetime.timedelta(0))


def frames():
    from kio.schema.api_versions.v3 import response as av
    from kio.schema.fetch.v12 import response as fr
    from kio.schema.heartbeat.v4 import request as hb
    from kio.schema.metadata.v12 import response as mr
    from kio.schema.produce.v9 import request as pr

    produce = pr.ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=tuple(
            pr.TopicProduceData(name=f"orders-{t}", partition_data=tuple(
                pr.PartitionProduceData(index=i32(p), records=record_batch(20, 200))
                for p in range(3)))
            for t in range(2)))
    fetch = fr.FetchResponse(
        throttle_time=ZERO, error_code=ErrorCode.none, session_id=i32(7),
        responses=tuple(
            fr.FetchableTopicResponse(topic=f"events-{t}", partitions=tuple(
                fr.PartitionData(partition_index=i32(p), error_code=ErrorCode.none,
                                 high_watermark=i64(1000), last_stable_offset=i64(1000),
                                 log_start_offset=i64(0), aborted_transactions=(),
                                 preferred_read_replica=i32(-1),
                                 records=record_batch(50, 100) + record_batch(50, 100, 50))
                for p in range(4)))
            for t in range(2)))
    metadata = mr.MetadataResponse(
        throttle_time=ZERO,
        brokers=tuple(mr.MetadataResponseBroker(node_id=i32(b), host=f"broker-{b}.example.com",
                                                port=i32(9092), rack=f"rack-{b % 3}") for b in range(6)),
        cluster_id="bench-cluster", controller_id=i32(1),
        topics=tuple(
            mr.MetadataResponseTopic(
                error_code=ErrorCode.none, name=f"topic-{t:03d}", topic_id=None, is_internal=False,
                partitions=tuple(
                    mr.MetadataResponsePartition(
                        error_code=ErrorCode.none, partition_index=i32(p), leader_id=i32(p % 6),
                        leader_epoch=i32(3), replica_nodes=(i32(p % 6), i32((p + 1) % 6), i32((p + 2) % 6)),
                        isr_nodes=(i32(p % 6), i32((p + 1) % 6)), offline_replicas=())
                    for p in range(10)),
                topic_authorized_operations=i32(-2147483648))
            for t in range(50)))
    api_versions = av.ApiVersionsResponse(
        error_code=ErrorCode.none, throttle_time=ZERO,
        api_keys=tuple(av.ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(9)) for k in range(60)))
    heartbeat = hb.HeartbeatRequest(group_id="group", generation_id=i32(5), member_id="member-1",
                                    group_instance_id=None)
    return [
        ("Produce v9 request (6 batches x 20 records)", request(produce), None),
        ("Fetch v12 response (16 batches x 50 records)", response(fetch), (1, 12)),
        ("Metadata v12 response (50 topics x 10 partitions)", response(metadata), (3, 12)),
        ("ApiVersions v3 response (60 api keys)", response(api_versions), (18, 3)),
        ("Heartbeat v4 request", request(heartbeat), None),
    ]


def bench(label, frame, resp, seconds):
    decode_module.clear_caches()  # measure the one-time compile for this version too
    t0 = time.perf_counter()
    msg = decode_request(frame) if resp is None else decode_response(frame, *resp)
    first = time.perf_counter() - t0
    assert msg.ok, [i.as_dict() for i in msg.issues]
    if resp is None:
        def run():
            decode_request(frame)
    else:
        key, version = resp

        def run():
            decode_response(frame, key, version)
    # Calibrate a batch size, then time whole batches until `seconds` have passed.
    n, elapsed = 0, 0.0
    batch = 1
    while elapsed < seconds:
        t0 = time.perf_counter()
        for _ in range(batch):
            run()
        elapsed += time.perf_counter() - t0
        n += batch
        batch = min(batch * 2, 10_000)
    rate = n / elapsed
    return label, len(frame), rate, rate * len(frame) / 1e6, first * 1e3


def capture_frames(path: str, ports: str | None):
    """Every request frame and (response frame, key, version) the driver decodes."""
    from kwinspect.dissect import DissectConfig
    from kwinspect.run.files import dissect_file
    from kwinspect.stream import conversation

    requests, responses = [], []
    real_request, real_response = conversation.decode_request, conversation.decode_response

    def record_request(frame):
        requests.append(bytes(frame))
        return real_request(frame)

    def record_response(frame, key, version):
        responses.append((bytes(frame), key, version))
        return real_response(frame, key, version)

    conversation.decode_request, conversation.decode_response = record_request, record_response
    try:
        cfg = DissectConfig(kafka_ports=frozenset(int(p) for p in ports.split(","))) if ports else DissectConfig()
        dissect_file(path, cfg)
    finally:
        conversation.decode_request, conversation.decode_response = real_request, real_response
    return requests, responses


def bench_capture(path: str, ports: str | None, rounds: int) -> int:
    requests, responses = capture_frames(path, ports)
    print(f"{path}: {len(requests)} requests, {len(responses)} responses, "
          f"{sum(map(len, requests)) + sum(len(f) for f, _k, _v in responses):,} bytes")
    variants = {
        "fast": (decode_module.decode_request, decode_module.decode_response),
        "reference": (decode_module.decode_request_reference, decode_module.decode_response_reference),
    }
    best = {}
    for _ in range(rounds):
        for name, (dreq, dresp) in variants.items():
            t0 = time.process_time()
            for frame in requests:
                dreq(frame)
            for frame, key, version in responses:
                dresp(frame, key, version)
            elapsed = time.process_time() - t0
            best[name] = min(best.get(name, elapsed), elapsed)
    for name, seconds in best.items():
        print(f"{name:<10} {seconds:8.3f} s CPU  {len(requests) + len(responses):,} frames")
    print(f"speedup    {best['reference'] / best['fast']:8.2f}x")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per frame (default 1.0)")
    parser.add_argument("--capture", help="decode every frame of this capture instead")
    parser.add_argument("--kafka-ports", help="broker ports of --capture (comma separated)")
    parser.add_argument("--rounds", type=int, default=5, help="--capture: rounds, best is shown (default 5)")
    args = parser.parse_args(argv)
    if args.capture:
        return bench_capture(args.capture, args.kafka_ports, args.rounds)
    print(f"kwinspect decode benchmark -- Python {platform.python_version()} on {platform.machine()}")
    rows = [bench(label, frame, resp, args.seconds) for label, frame, resp in frames()]
    w = max(len(r[0]) for r in rows)
    print(f"{'frame':<{w}}  {'bytes':>7}  {'frames/s':>10}  {'MB/s':>7}  {'first decode ms':>15}")
    for label, size, rate, mbps, first in rows:
        print(f"{label:<{w}}  {size:>7}  {rate:>10,.0f}  {mbps:>7.1f}  {first:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
