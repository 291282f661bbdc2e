"""`kwinspect sanitize IN... -o OUT`: two reads of the input, memory bounded.

1. The input is read once: the dissector (through PacketLoop, with an
   ``on_frame`` tap) finds the Kafka connections, which side is the client, and
   every complete frame of each direction, which goes to a spool file on disk;
   every TCP payload goes to another spool, and memory keeps only where each
   one is (positions and lengths).
2. The frames are walked twice, from their spool, a connection at a time (each
   request before the responses found after it): the first walk only learns the names, so free text met early (an
   error message naming a topic seen later) is cleaned too; the second decodes
   each frame, checks it encodes back to its own bytes (what does not is
   "undecodable": dropped or zeroed), replaces its fields (fields.py), encodes
   it again and spools what it became.
3. Each Kafka direction's byte stream is rebuilt by sequence number, one
   direction at a time, in a temporary file; the dissector's frames are found
   in it in order, and the bytes between them (resynchronised garbage, a cut-off
   last frame) are known to be zeroed.  That gives, per direction, a map from
   original stream offsets to new ones (a few integers per frame).
4. The input is read a second time and written: each Kafka packet carries the
   new bytes of the range its original carried (cut at the same frame offsets,
   so the packet boundaries stay where sizes allow), with sequence and
   acknowledgement numbers (and SACK edges) moved through the maps, so
   retransmissions, gaps, FINs and RSTs stay as they were; addresses and ports
   are mapped, checksums computed anew.

Memory: the dissector's own (bounded by the frames in flight and the open
connections), a few integers per frame and per TCP segment, and the largest
frame; the capture's bytes are on disk (spool.py), about three times the Kafka
bytes, plus a copy of standard input when the input is ``-``.
"""

from __future__ import annotations

import heapq
import ipaddress
import struct
from array import array
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kwinspect.capture.readers import open_capture
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector
from kwinspect.model import Endpoint
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.encode import EncodeError, encode_request, encode_response
from kwinspect.protocol.peek import peek_request_header, plausible_header
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.loop import PacketLoop
from kwinspect.sanitize import packets as pk
from kwinspect.sanitize.fields import Unsanitizable, sanitize_message
from kwinspect.sanitize.pcapout import open_writer
from kwinspect.sanitize.pseudonyms import Pseudonyms, new_secret
from kwinspect.sanitize.spool import Spool, temporary_directory

SYN, FIN, ACK = 0x02, 0x01, 0x10
MAX_PAYLOAD = 65000  # an IP packet holds at most 65535 bytes: larger new payloads are split
SASL_HANDSHAKE, API_VERSIONS = int(ApiKey.SASL_HANDSHAKE), int(ApiKey.API_VERSIONS)
FRAME_HEADER = struct.Struct("<iBi")  # spooled frame: stream number, is a request, length
FIND_CHUNK = 1 << 20  # bytes read at a time when a frame is not where the last one ended
LOOKAHEAD = 1024  # requests looked through for a response's, when it was found before it
SASL_HANDSHAKE_V0 = struct.pack(">hh", SASL_HANDSHAKE, 0)


@dataclass
class SanitizeOptions:
    values: str = "hash"  # hash | keep | truncate:N
    secret: bytes | None = None  # None: random for this run
    keep_topics: bool = False
    keep_other: bool = False
    undecodable: str = "drop"  # drop | zero
    addresses: str = "map"  # map | prefix | keep
    ports: str = "clients"  # clients | all | keep


@dataclass
class Report:
    inputs: list[str]
    output: str
    packets: Counter[str] = field(default_factory=Counter)
    frames: Counter[str] = field(default_factory=Counter)
    connections: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    replaced: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "output": self.output, "packets": dict(self.packets),
                "frames": dict(self.frames), "connections": dict(self.connections),
                "bytes": dict(self.bytes), "replaced": dict(sorted(self.replaced.items()))}


def _signed(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >= 1 << 31 else n


def _merged(paths: list[str]):
    sources = [open_capture(p) for p in paths]
    try:
        yield from (iter(sources[0]) if len(sources) == 1 else heapq.merge(*sources, key=lambda r: r.ts))
    finally:
        for s in sources:
            s.close()


# --------------------------------------------------------------------------- one direction


class _Direction:
    """One direction of a TCP connection: where its payloads and frames are spooled, its offset map."""

    def __init__(self) -> None:
        self.syn: int | None = None
        self.port_reused = False
        self.linktypes: set[int] = set()
        # TCP payloads: sequence number, position and length in the segment spool
        self.seg_seq, self.seg_pos, self.seg_len = array("q"), array("q"), array("q")
        # frames (no size prefix) in the frame spool; what each became in the new-frame
        # spool (with its size prefix; length 0 when dropped)
        self.frame_pos, self.frame_len = array("q"), array("q")
        self.new_pos, self.new_len = array("q"), array("q")
        self.base = 0
        # tiles of the original stream: start, length, new start, new length, position of
        # the new bytes in the new-frame spool (-1: blanked: zeros but for `kept` prefixes)
        self.starts, self.lens, self.new_starts = array("q"), array("q"), array("q")
        self.new_lens, self.blobs = array("q"), array("q")
        self.kept: dict[int, list[tuple[int, bytes]]] = {}  # tile -> (offset in it, size prefix kept)
        self.orig_end = 0
        self.new_end = 0

    def offset(self, seq: int) -> int:
        return _signed(seq - self.base)

    def tile(self, start: int, length: int, new_start: int, new_length: int, blob: int) -> None:
        for a, v in ((self.starts, start), (self.lens, length), (self.new_starts, new_start),
                     (self.new_lens, new_length), (self.blobs, blob)):
            a.append(v)

    def map(self, x: int) -> int:
        """New stream offset of original offset x (sequence space; FIN and SYN included)."""
        if x <= 0 or not self.starts:
            return x
        if x >= self.orig_end:
            return self.new_end + (x - self.orig_end)
        i = bisect_right(self.starts, x) - 1
        return self.new_starts[i] + min(x - self.starts[i], self.new_lens[i])

    def new_bytes(self, a: int, b: int, spool: Spool) -> bytes:
        """The new stream's bytes [a, b); past the tiles (never captured) there is nothing to give."""
        out = bytearray()
        i = max(bisect_right(self.new_starts, a) - 1, 0)
        while i < len(self.starts) and a < b:
            n_start, n_len = self.new_starts[i], self.new_lens[i]
            if n_start >= b:
                break
            lo, hi = max(a, n_start), min(b, n_start + n_len)
            if lo < hi:
                blob = self.blobs[i]
                if blob >= 0:
                    out += spool.read(blob + lo - n_start, hi - lo)
                else:
                    chunk = bytearray(hi - lo)
                    for at, prefix in self.kept.get(i, ()):
                        for k in range(4):
                            if lo <= n_start + at + k < hi:
                                chunk[n_start + at + k - lo] = prefix[k]
                    out += chunk
            i += 1
        return bytes(out)


class _Connection:
    def __init__(self, info: ConnectionInfo, to_broker: _Direction, to_client: _Direction) -> None:
        self.client, self.broker = info.client, info.broker
        self.to_broker, self.to_client = to_broker, to_client
        self.unsafe: str | None = None
        # a SaslHandshake v0 among its requests: the SASL exchange follows as raw
        # size-prefixed tokens, not Kafka messages; what does not decode is a token
        self.raw_sasl = False

    def direction(self, src: Endpoint) -> tuple[_Direction, _Direction]:
        if src == self.client:
            return self.to_broker, self.to_client
        return self.to_client, self.to_broker


class Sanitizer:
    def __init__(self, paths: list[str], output: str, options: SanitizeOptions,
                 config: DissectConfig | None = None, names: list[str] | None = None) -> None:
        self.paths, self.output, self.options = paths, output, options
        self.config = config or DissectConfig()
        self.ps = Pseudonyms(options.secret or new_secret(), values=options.values,
                             keep_topics=options.keep_topics, addresses=options.addresses)
        self.ps.body_ports = options.ports == "all"
        self.report = Report(inputs=list(names or paths), output=output)
        self.flows: dict[tuple[Endpoint, Endpoint], _Direction] = {}
        self.connections: dict[tuple[Endpoint, Endpoint], _Connection] = {}
        self.by_stream: dict[int, _Connection] = {}
        self.stream_numbers: dict[str, int] = {}
        self.macs: dict[bytes, bytes] = {}
        self.original_v4: set[bytes] = set()
        self.broker_ports: frozenset[int] = frozenset()
        self.tls: set[tuple[Endpoint, Endpoint]] = set()  # TLS connections: never written
        self.other_linktypes: set[int] = set()  # packets that are not TCP over IP
        self.segments = self.frames = self.new_frames = None  # Spools, made by run()

    # ------------------------------------------------------------------ read 1

    def _flow(self, key: tuple[Endpoint, Endpoint]) -> _Direction:
        d = self.flows.get(key)
        if d is None:
            d = self.flows[key] = _Direction()
        return d

    def _tee(self, packets):
        """The packets, on to the dissector, with each TCP payload spooled on the way."""
        for raw in packets:
            p = pk.parse(raw.linktype, raw.data)
            if p is None:
                self.other_linktypes.add(raw.linktype)
            else:
                d = self._flow((Endpoint(p.src, p.sport), Endpoint(p.dst, p.dport)))
                d.linktypes.add(raw.linktype)
                if p.flags & SYN:
                    if d.syn is not None and d.syn != p.seq:
                        d.port_reused = True  # two connections on one 4-tuple
                    d.syn = p.seq
                payload = p.payload
                if payload:
                    d.seg_seq.append(p.seq)
                    d.seg_pos.append(self.segments.add(payload))
                    d.seg_len.append(len(payload))
            yield raw

    def read_frames(self) -> None:
        infos: dict[str, ConnectionInfo] = {}
        numbers = self.stream_numbers
        where: dict[tuple[int, bool], tuple[array, array]] = {}
        raw_sasl: set[int] = set()

        def on_frame(stream: str, direction: str, frame: bytes) -> None:
            n = numbers.setdefault(stream, len(numbers))
            is_request = direction == "request"
            if is_request and frame[:4] == SASL_HANDSHAKE_V0:
                raw_sasl.add(n)
            at = self.frames.add(FRAME_HEADER.pack(n, is_request, len(frame)) + frame)
            pos, lens = where.setdefault((n, is_request), (array("q"), array("q")))
            pos.append(at + FRAME_HEADER.size)
            lens.append(len(frame))

        def on_close(info: ConnectionInfo) -> None:
            infos[info.stream] = info

        d = Dissector(self.config, on_frame=on_frame, on_close=on_close, keep_conversations=False)
        for _ in PacketLoop(d).run(self._tee(_merged(self.paths))):
            pass
        for info in d.connections.values():
            infos.setdefault(info.stream, info)
        for info in infos.values():
            if info.kind != "kafka" or info.client is None or info.broker is None:
                self.report.connections["not_kafka" if info.kind != "tls" else "tls"] += 1
                if info.kind == "tls":
                    self.tls.update({(info.a, info.b), (info.b, info.a)})
                continue
            if info.tls is not None:
                self.report.connections["tls"] += 1
                self.tls.update({(info.client, info.broker), (info.broker, info.client)})
                continue
            conn = _Connection(info, self._flow((info.client, info.broker)), self._flow((info.broker, info.client)))
            n = numbers.get(info.stream)
            if n is not None:
                self.by_stream[n] = conn
                conn.raw_sasl = n in raw_sasl
                for is_request, dd in ((True, conn.to_broker), (False, conn.to_client)):
                    dd.frame_pos, dd.frame_len = where.pop((n, is_request), (array("q"), array("q")))
            self.connections[(info.client, info.broker)] = conn
            self.connections[(info.broker, info.client)] = conn
        self.broker_ports = frozenset(c.broker.port for c in self.connections.values())

    def _kafka_connections(self) -> list[_Connection]:
        seen, out = set(), []
        for conn in self.connections.values():
            if id(conn) not in seen:
                seen.add(id(conn))
                out.append(conn)
        return out

    # ------------------------------------------------------------------ the frames

    def sanitize_frames(self) -> None:
        conns = self._kafka_connections()
        for conn in conns:  # addresses first, so host fields holding them get the same ones
            self.ps.ip(conn.client.ip)
            self.ps.ip(conn.broker.ip)
        self.ps.counting = False
        self._walk_frames(keep=False)  # learn the names
        self.ps.counting = True
        self._walk_frames(keep=True)
        self.report.replaced.update(self.ps.counts)

    def _walk_frames(self, keep: bool) -> None:
        for conn in self._kafka_connections():
            self._walk_connection(conn, keep)

    def _walk_connection(self, conn: _Connection, keep: bool) -> None:
        """A connection's frames, each request before the responses the dissector found after
        it (a response needs its request's api key and version); a response whose request
        comes later (packets captured out of order) finds it up to LOOKAHEAD requests on.
        So only the requests in flight are held, not the connection's."""
        reqs, resps = conn.to_broker, conn.to_client
        pending: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
        n_req, i = len(reqs.frame_pos), 0

        def request(k: int) -> None:
            frame = self.frames.read(reqs.frame_pos[k], reqs.frame_len[k])
            self._emit(reqs, self._frame(frame, True, pending, keep, conn.raw_sasl), keep)

        for j in range(len(resps.frame_pos)):
            while i < n_req and reqs.frame_pos[i] < resps.frame_pos[j]:
                request(i)
                i += 1
            frame = self.frames.read(resps.frame_pos[j], resps.frame_len[j])
            if len(frame) >= 4 and (cid := struct.unpack_from(">i", frame)[0]) not in pending:
                for k in range(i, min(n_req, i + LOOKAHEAD)):
                    head = self.frames.read(reqs.frame_pos[k], min(reqs.frame_len[k], 8))
                    if len(head) == 8 and struct.unpack_from(">i", head, 4)[0] == cid:
                        while i <= k:
                            request(i)
                            i += 1
                        break
            self._emit(resps, self._frame(frame, False, pending, keep, conn.raw_sasl), keep)
        while i < n_req:
            request(i)
            i += 1

    def _emit(self, d: _Direction, new: bytes, keep: bool) -> None:
        """What a frame became, spooled (the walk that only learns names keeps nothing)."""
        if keep:
            d.new_pos.append(self.new_frames.add(new) if new else -1)
            d.new_len.append(len(new))

    @staticmethod
    def _plausible_request(frame: bytes) -> bool:
        peek = peek_request_header(frame)
        return peek is not None and plausible_header(peek)

    def _undecodable(self, frame: bytes) -> bytes:
        if self.options.undecodable == "drop":
            return b""
        return struct.pack(">i", len(frame)) + bytes(len(frame))

    def _frame(self, frame: bytes, is_request: bool, pending: dict, keep: bool, raw_sasl: bool) -> bytes:
        if keep:
            self.report.frames["requests" if is_request else "responses"] += 1
        if raw_sasl and (not is_request or not self._plausible_request(frame)) and (
                is_request or len(frame) < 4 or struct.unpack_from(">i", frame)[0] not in pending):
            if keep:
                self.report.frames["sasl_tokens_blanked"] += 1
            # 0xFF, not zeros: a blank token must not read as a Produce v0 request
            return struct.pack(">i", len(frame)) + b"\xff" * len(frame)
        if not is_request and len(frame) >= 4 and struct.unpack_from(">i", frame)[0] not in pending:
            # its request is not in the capture (it started mid-connection): the body cannot be
            # read, the correlation id can; kept, so the response is still seen unanswered
            if keep:
                self.report.frames["responses_without_request_blanked"] += 1
            return struct.pack(">i", len(frame)) + frame[:4] + bytes(len(frame) - 4)
        new = self._sanitize_frame(frame, is_request, pending)
        if new is None:
            if keep:
                self.report.frames[f"undecodable_{'dropped' if self.options.undecodable == 'drop' else 'zeroed'}"] += 1
            return self._undecodable(frame)
        if keep:
            self.report.frames["sanitized"] += 1
        return struct.pack(">i", len(new)) + new

    def _sanitize_frame(self, frame: bytes, is_request: bool, pending: dict) -> bytes | None:
        if is_request:
            msg = decode_request(frame)
            if msg.api_key is not None and msg.correlation_id is not None:
                pending[msg.correlation_id] = (msg.api_key, msg.api_version)
            encode = encode_request
        else:
            if len(frame) < 4:
                return None
            kv = pending.pop(struct.unpack_from(">i", frame)[0], None)
            if kv is None:
                return None
            msg = decode_response(frame, *kv)
            encode = encode_response
        if msg.body is None:
            return None
        try:
            again = encode(msg, like=frame)
        except EncodeError:
            again = None
        if again is None or not frame.startswith(again):
            if not is_request and msg.api_key == API_VERSIONS:
                # a rejection in a layout of the broker's own (librdkafka's mock): numbers
                # and feature names only, nothing that names anyone: kept as it came
                self.report.frames["api_versions_kept_as_sent"] += 1 if self.ps.counting else 0
                return frame
            return None
        padding = frame[len(again):]
        # understood in full, or up to zero padding (librdkafka pads ApiVersions v0 requests)
        if padding.strip(b"\0"):
            return None
        try:
            sanitize_message(msg, self.ps)
            return encode(msg, like=frame) + padding
        except (Unsanitizable, EncodeError):
            return None

    # ------------------------------------------------------------------ the offset maps

    def rebuild_streams(self, directory: str) -> set[int]:
        linktypes: set[int] = set(self.other_linktypes) if self.options.keep_other else set()
        for key, d in self.flows.items():
            if key in self.connections or self.options.keep_other:
                linktypes |= d.linktypes
        stream = Spool(directory, "stream")
        try:
            for conn in self._kafka_connections():
                if conn.to_broker.port_reused or conn.to_client.port_reused:
                    conn.unsafe = "port_reused"
                for d in (conn.to_broker, conn.to_client):
                    if conn.unsafe is None:
                        conn.unsafe = self._tile(d, stream)
                if conn.unsafe is not None:
                    self.report.connections[f"dropped_{conn.unsafe}"] += 1
                else:
                    self.report.connections["kafka"] += 1
        finally:
            stream.close()
        for d in self.flows.values():  # the payloads are no longer needed, only the maps
            d.seg_seq = d.seg_pos = d.seg_len = d.frame_pos = d.frame_len = array("q")
        return linktypes

    def _tile(self, d: _Direction, stream: Spool) -> str | None:
        n = len(d.seg_seq)
        if d.syn is not None:
            d.base = (d.syn + 1) & 0xFFFFFFFF
        elif n:
            first = d.seg_seq[0]
            d.base = (first + min(_signed(s - first) for s in d.seg_seq)) & 0xFFFFFFFF
        # one payload per sequence number, the longest (the first of equals); applied in
        # stream order, a later one overwriting what it overlaps
        longest: dict[int, int] = {}
        for i in range(n):
            j = longest.get(d.seg_seq[i])
            if j is None or d.seg_len[i] > d.seg_len[j]:
                longest[d.seg_seq[i]] = i
        order = sorted(longest.values(), key=lambda i: d.offset(d.seg_seq[i]))
        del longest
        # the stream is rebuilt in a file (holes read as zeros); a retransmission that differs
        # from what the dissector framed makes its frames unfindable below: the connection is
        # then dropped, never guessed at
        f = stream.f
        f.seek(0)
        f.truncate()
        length = 0
        covered: list[list[int]] = []  # [start, end) ranges the capture holds, merged
        for i in order:
            x, size = d.offset(d.seg_seq[i]), d.seg_len[i]
            if x < 0:
                return "data_before_syn"
            f.seek(x)
            f.write(self.segments.read(d.seg_pos[i], size))
            length = max(length, x + size)
            if covered and x <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], x + size)
            else:
                covered.append([x, x + size])
        del order
        f.flush()
        at_boundary_start = d.syn is not None
        pos = new_pos = 0
        for k in range(len(d.frame_pos)):
            blob = struct.pack(">i", d.frame_len[k]) + self.frames.read(d.frame_pos[k], d.frame_len[k])
            at = self._find(stream, blob, pos, length)
            if at < 0:
                return "frames_not_found"
            if at > pos:  # bytes no frame holds: blanked
                self._blank_tile(d, stream, pos, at, new_pos, covered, pos > 0 or at_boundary_start)
                new_pos += at - pos
            d.tile(at, len(blob), new_pos, d.new_len[k], d.new_pos[k])
            new_pos += d.new_len[k]
            pos = at + len(blob)
        if pos < length:
            self._blank_tile(d, stream, pos, length, new_pos, covered, pos > 0 or at_boundary_start)
            new_pos += length - pos
        d.orig_end, d.new_end = length, new_pos
        self.report.bytes["kafka_in"] += length
        self.report.bytes["kafka_out"] += new_pos
        return None

    @staticmethod
    def _find(stream: Spool, blob: bytes, pos: int, length: int) -> int:
        """Where ``blob`` is first found in the rebuilt stream at or after ``pos``, -1 if nowhere;
        read a chunk at a time (a chunk and a frame in memory, not the stream)."""
        if stream.read(pos, len(blob)) == blob:  # where the last frame ended: the usual case
            return pos
        step = max(FIND_CHUNK, len(blob))
        while pos + len(blob) <= length:
            chunk = stream.read(pos, step + len(blob) - 1)
            at = chunk.find(blob)
            if at >= 0:
                return pos + at
            pos += step
        return -1

    def _blank_tile(self, d: _Direction, stream: Spool, start: int, end: int, new_start: int,
                    covered: list[list[int]], at_boundary: bool) -> None:
        """Bytes no frame holds (a frame a gap cut, a cut-off last frame), blanked: when the
        region starts where a frame starts (after a frame, or at a SYN), the size prefixes
        that chain from there are kept (the dissector skips a cut frame by its size, and
        must land where it did); everything else is zeroed."""
        kept = []
        pos = start
        starts = [a for a, _ in covered]
        while at_boundary and pos + 4 <= end:
            i = bisect_right(starts, pos) - 1
            if i < 0 or pos + 4 > covered[i][1]:
                break
            prefix = stream.read(pos, 4)
            size = struct.unpack(">i", prefix)[0]
            if size < 0 or size > self.config.max_frame_size:
                break
            kept.append((pos - start, prefix))
            pos += 4 + size
        if kept:
            d.kept[len(d.starts)] = kept
        d.tile(start, end - start, new_start, end - start, -1)
        self.report.bytes["zeroed_outside_frames"] += end - start

    # ------------------------------------------------------------------ read 2

    def _mac(self, mac: bytes) -> bytes:
        if not mac.strip(b"\0"):
            return mac  # loopback's zero addresses say nothing
        mapped = self.macs.get(mac)
        if mapped is None:
            n = len(self.macs) + 1
            mapped = self.macs[mac] = (b"\x02" + n.to_bytes(len(mac) - 1, "big"))[:len(mac)]
        return mapped

    def write(self, linktypes: set[int]) -> None:
        # an original IPv4 address must not appear even by chance: a TCP checksum ending in
        # 0x7f, then urgent pointer 0 and a NOP, reads 7f 00 00 01 (see move_leading_nops)
        if self.options.addresses != "keep":
            self.original_v4 = {ipaddress.ip_address(ep.ip).packed for conn in self._kafka_connections()
                                for ep in (conn.client, conn.broker) if ":" not in ep.ip}
        for conn in self._kafka_connections():  # the connections' ports mapped, one per end
            if conn.unsafe is None:
                for port, is_client in ((conn.client.port, True), (conn.broker.port, False)):
                    if self._port(port, is_client) != port:
                        self.report.replaced["tcp_port"] += 1
        with open(self.output, "wb") as f:
            writer = open_writer(f, self.output, linktypes)
            count = self.report.packets
            for raw in _merged(self.paths):
                count["read"] += 1
                p = pk.parse(raw.linktype, raw.data)
                key = None if p is None else (Endpoint(p.src, p.sport), Endpoint(p.dst, p.dport))
                conn = None if key is None else self.connections.get(key)
                if key in self.tls:
                    count["dropped_tls"] += 1
                    continue
                if conn is None or conn.unsafe is not None:
                    if conn is not None:
                        count["dropped_unsafe_connection"] += 1
                    elif self.options.keep_other:
                        count["kept_other"] += 1
                        writer.write(raw.ts, raw.linktype, raw.data)
                    else:
                        count["dropped_other"] += 1
                    continue
                count["kafka"] += 1
                for data in self._rewrite(p, raw.linktype, conn):
                    count["written"] += 1
                    writer.write(raw.ts, raw.linktype, data)
            count["written"] += count["kept_other"]

    def _port(self, port: int, is_client: bool) -> int:
        """A TCP port as written: client ports mapped (never onto a broker port kept), broker
        ports mapped only with --ports all (then as the ports in Kafka bodies are)."""
        mode = self.options.ports
        if mode == "keep" or (mode == "clients" and not is_client):
            return port
        return self.ps.port(port, self.broker_ports if mode == "clients" else frozenset())

    def _rewrite(self, p: pk.Packet, linktype: int, conn: _Connection) -> list[bytes]:
        src_ep = Endpoint(p.src, p.sport)
        d, r = conn.direction(src_ep)
        x = d.offset(p.seq)
        n = len(p.payload)
        start = d.map(x)
        payload = d.new_bytes(start, d.map(x + n), self.new_frames) if n else b""
        ack = (r.base + r.map(r.offset(p.ack))) if p.flags & ACK else p.ack
        src, dst = self.ps.ip(p.src), self.ps.ip(p.dst)
        from_client = src_ep == conn.client
        sport, dport = self._port(p.sport, from_client), self._port(p.dport, not from_client)

        def sack(edge: int) -> int:
            return r.base + r.map(r.offset(edge))

        out = []
        chunks = [payload[i:i + MAX_PAYLOAD] for i in range(0, len(payload), MAX_PAYLOAD)] or [b""]
        for i, chunk in enumerate(chunks):
            data = pk.build(p, linktype, src=src, dst=dst, seq=d.base + start + i * MAX_PAYLOAD, ack=ack,
                            payload=chunk, map_sack=sack, map_link=self._mac, clear_fin=i < len(chunks) - 1,
                            sport=sport, dport=dport)
            if any(a in data for a in self.original_v4):
                data = pk.move_leading_nops(data, p)
                self.report.packets["address_look_alike_moved"] += 1
            out.append(data)
        return out

    def run(self) -> Report:
        with temporary_directory() as directory:
            self.segments, self.frames = Spool(directory, "segments"), Spool(directory, "frames")
            self.new_frames = Spool(directory, "new-frames")
            try:
                self.read_frames()
                self.sanitize_frames()
                linktypes = self.rebuild_streams(directory)
                self.segments.close()
                self.frames.close()
                self.write(linktypes)
            finally:
                for spool in (self.segments, self.frames, self.new_frames):
                    spool.close()
        return self.report

    def mapping(self) -> dict[str, dict[str, str]]:
        return {kind: dict(m) for kind, m in self.ps.mapping.items()}


# --------------------------------------------------------------------------- the command


def parse_values(text: str) -> str:
    """--values: hash, keep or truncate:N (N >= 0)."""
    if text in ("hash", "keep"):
        return text
    if text.startswith("truncate:") and text[9:].isdigit():
        return f"truncate:{int(text[9:])}"
    raise ValueError(f"--values {text!r}: hash, keep or truncate:N (N a number of bytes)")


def render_report(report: Report) -> str:
    """The report as text, one count a line, grouped; readable at 80 columns."""
    lines = [f"sanitized {', '.join(report.inputs)} -> {report.output}"]
    for title, counts in (("packets", report.packets), ("connections", report.connections),
                          ("frames", report.frames), ("bytes", report.bytes),
                          ("replaced (values and names)", report.replaced)):
        lines.append(f"{title}:")
        if not counts:
            lines.append("  (none)")
        for kind, n in sorted(counts.items()):
            lines.append(f"  {kind:<40} {n:>12,}")
    return "\n".join(lines) + "\n"


SECRET_ENV = "KWINSPECT_SANITIZE_SECRET"


def read_secret(args, environ) -> bytes | None:
    """The key of the hashes and pseudonyms: --secret, else --secret-file (its first line),
    else $KWINSPECT_SANITIZE_SECRET; None (random for this run) when none is given."""
    if args.secret is not None and args.secret_file is not None:
        raise ValueError("--secret and --secret-file: give one")
    if args.secret is not None:
        text = args.secret
    elif args.secret_file is not None:
        try:
            with open(args.secret_file, encoding="utf-8") as f:
                text = f.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            # the file's name, never its content
            raise ValueError(f"--secret-file {args.secret_file}: cannot read it "
                             f"({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
        if not text:
            raise ValueError(f"--secret-file {args.secret_file}: its first line is empty")
    else:
        text = environ.get(SECRET_ENV) or None
    return text.encode() if text else None


def run_command(args, config: DissectConfig) -> int:
    """`kwinspect sanitize`: write the sanitized capture, the report, and the mapping if asked."""
    import json
    import os
    import sys

    from kwinspect.sanitize.spool import spool_stdin

    out = args.output
    if out == "-":
        raise ValueError("-o -: the sanitized capture is written to a file (it is written after "
                         "the input is read, and the report goes to stdout)")
    if any(p != "-" and os.path.abspath(p) == os.path.abspath(out) for p in args.pcap):
        raise ValueError(f"-o {out}: that is one of the inputs")
    if args.pcap.count("-") > 1:
        raise ValueError("- (standard input) can be given once")
    options = SanitizeOptions(values=parse_values(args.values), secret=read_secret(args, os.environ),
                              keep_topics=args.keep_topics, keep_other=args.keep_other,
                              undecodable=args.undecodable, addresses=args.addresses,
                              ports="keep" if args.keep_ports else args.ports)
    with temporary_directory() as directory:
        # standard input is read twice: copied to a file first (disk, not memory)
        paths = [spool_stdin(directory, sys.stdin.buffer) if p == "-" else p for p in args.pcap]
        sanitizer = Sanitizer(paths, out, options, config, names=list(args.pcap))
        report = sanitizer.run()
    if args.report and args.report != "-":
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report.as_dict(), f, indent=2)
            f.write("\n")
    elif args.report == "-":
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if not args.report or args.report != "-":
        sys.stdout.write(render_report(report))
    if args.mapping:
        with open(args.mapping, "w", encoding="utf-8") as f:
            json.dump(sanitizer.mapping(), f, indent=2, ensure_ascii=False)
            f.write("\n")
    return 0
