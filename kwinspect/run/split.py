"""The one reader of ``--jobs N``: reads the capture once and hands each worker only the
packets of its own connections, in batches, with what it needs to stay in step.

It runs in a process of its own (run/parallel.py starts it beside the workers) and
does, once for the whole capture, what every worker used to do for itself:

- **routing**: the owner of a new TCP connection is decided by ``_Router`` (the worker
  with the fewest captured bytes so far, or crc32 of the 4-tuple), from the header bytes
  of the common Ethernet/IPv4/TCP packet, or from a full parse for anything else (VLANs,
  IPv6, fragments, link types other than Ethernet). Common packets travel as their raw
  bytes (the worker's Dissector parses them with the compiled core when it is built);
  the others travel as the parsed segment (an IP datagram reassembled from fragments is
  one segment standing for all its fragments).
- **the packet parser's counters and issues** (packets, not TCP, unparseable, fragments
  pending; malformed packets as error rows at their packet) are this process's, whole:
  the rows go to worker 0, at their packet, the counters to worker 0 at the end.
- **time**: the idle flush schedule (a check at the first TCP packet a minute after the
  last check) depends only on the packets' times, so it is computed here; a worker gets
  an ``advance`` item at each check that falls on another worker's packet, so idle
  connections are flushed at the same packets as with one process. Every worker gets a
  mark every ``WATERMARK_EVERY`` packets (the packet's number and time): the workers
  send their watermark there, as one process would compute it.
- **tcp.stream numbers** (tshark's numbering of every 4-tuple) are computed here and
  travel with each packet.
- **known brokers**: a shadow Dissector sees every connection until it is decided
  (then only time), so its set of broker endpoints proven on some connection is one
  process's; each endpoint it adds is sent to every worker at its packet. It is fed
  the segments this process's parser made (never fragments to reassemble again).
- TLS secrets found in pcapng files go to every worker at their place.

Batches go out every ``BATCH_PACKETS`` packets to every worker (a worker with no packet
in a batch still gets its marks), pickled, one message per worker per batch. Each worker
drains its pipe on a thread (run/parallel.py ``_Pump``), so this process is held back
only when a worker is that far behind.

**Runs.** For one pcap file the loop over the packets is compiled (``_csplit.c``,
``split_chunk``): it takes the *plain* packet (the common Ethernet/IPv4/TCP packet of a
connection already routed, numbered and decided, not a SYN, no idle check due: after a
connection's first packets, nearly all of them) without any Python, and hands each
worker its plain packets as runs of consecutive packet numbers (``TAG_RUN``): the
file's own records, which the worker feeds to its Dissector's compiled packet loop as
one process does. Everything else stops the C loop and takes ``route`` (the Python
above, one item per packet), in its place. For a regular uncompressed file the reader
maps the file (``records(mapped=True)``: no copy of it into read buffers) and a run is
its file offset (the worker copies its own runs out of its map of the file,
``gather_spans``, so no packet goes through a pipe); otherwise the records are copied
into the batch.
"""

from __future__ import annotations

import mmap
import os
import pickle
import traceback
import zlib
from typing import Any

from kwinspect.capture.packets import SYN
from kwinspect.capture.readers import RawPacket, RecordChunk, open_capture
from kwinspect.capture.tcp import TcpStreamNumbers, endpoint_key
from kwinspect.core import load as load_extension
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.run.files import _merged
from kwinspect.run.procs import die_with_parent
from kwinspect.stream.row_order import WATERMARK_EVERY

BATCH_PACKETS = 2048  # packets between two batches (a multiple of WATERMARK_EVERY)
MAX_ROUTES = 1_000_000  # 4-tuples whose owner is remembered (~150 bytes each, both directions)
LOAD_GUARD, GUARD_BYTES = 1.25, 1 << 20  # a worker this far ahead of the lightest misses its turn
IDLE_CHECK_EVERY = 60.0  # Dissector.flush_idle: the next check a minute after the last
NO_NUMBER = object()  # a direction whose tcp.stream number must be asked for
_csplit = load_extension("kwinspect.run._csplit")  # the compiled routing loop, or None
PCAP_HEADER = 24  # bytes before a pcap file's first record
CSPLIT_MAX_JOBS = 256  # workers the compiled loop keeps runs for (MAX_JOBS in _csplit.c); more: Python

# items of a batch, each (tag, packet number, ...), in packet order
TAG_PACKET = 0  # (tag, pos, ts, linktype, data, wire_len, index, tcp_stream): a RawPacket's fields
TAG_SEGMENT = 1  # (tag, pos, TcpSegment fields, packets it stands for, tcp_stream)
TAG_ADVANCE = 2  # (tag, pos, ts): an idle check falls on another worker's packet
TAG_MARK = 3  # (tag, pos, ts): every WATERMARK_EVERY packets
TAG_BROKER = 4  # (tag, pos, endpoint): a broker endpoint proven on some connection
TAG_ROWS = 5  # (tag, pos, [ErrorRow]): the packet parser's issues at this packet (worker 0)
TAG_SECRETS = 6  # (tag, pos, secrets type, data): a pcapng Decryption Secrets Block
# (tag, first pos, count, byte offset, first record, bytes): packets first..first+count-1,
# plain pcap records (that many bytes) at that offset of the batch's record buffer (or of
# the capture file), their tcp.stream numbers from that record on in the batch's number
# buffer (native int32, -1 for None)
TAG_RUN = 7

# messages to a worker
# (msg, router load per worker, bytes read so far, items, records (bytes, or the path of the
# file the runs' offsets are in), numbers, pcap record layout)
MSG_BATCH = 0
MSG_END = 1  # (msg, last TCP time, packets, parser rows at the end, readers' issues, counters)
MSG_FALLBACK = 2  # (msg, why): go on in one process
MSG_ERROR = 3  # (msg, traceback)


class _Router:
    """Which worker owns a connection.

    Keys are (source ip, destination ip, source port, destination port) bytes, as they
    sit at offset 26 of an Ethernet/IPv4 frame; both directions are stored on first
    sight. ``balance`` (the default) gives new connections to the workers in turn,
    skipping a worker that has more than ``LOAD_GUARD`` times the captured bytes of the
    lightest (plus 1 MiB): a connection's size is unknown when it opens, and a client's
    connections to every broker open within a millisecond, the busy ones among them, so
    taking turns spreads them where "fewest bytes so far" sent them all to one worker
    (capture (a): 34/91 MB by bytes so far, 56/67 MB in turn). ``hash``: crc32 of the
    4-tuple.
    """

    def __init__(self, jobs: int, mode: str) -> None:
        self.jobs = jobs
        self.mode = mode
        self.owners: dict[bytes, int] = {}
        self.load = [0] * jobs  # captured bytes of each worker's connections (counted by the reader)
        self.turn = 0

    def assign(self, key: bytes, rkey: bytes) -> int:
        if self.mode == "hash" or len(self.owners) >= MAX_ROUTES:
            # past MAX_ROUTES, new connections are hashed and not remembered
            w = zlib.crc32(key if key <= rkey else rkey) % self.jobs
            if self.mode == "hash" and len(self.owners) < MAX_ROUTES:
                self.owners[key] = self.owners[rkey] = w
            return w
        load = self.load
        w = self.turn % self.jobs
        low = min(load)
        if load[w] > low * LOAD_GUARD + GUARD_BYTES:
            w = load.index(low)
        self.turn = w + 1
        self.owners[key] = self.owners[rkey] = w
        return w


def _reverse_key(key: bytes) -> bytes:
    """The key of the other direction: (dst ip, src ip, dst port, src port)."""
    n = len(key)
    half = (n - 4) // 2
    return key[half:2 * half] + key[:half] + key[n - 2:] + key[n - 4:n - 2]


def _seg_keys(seg) -> tuple[bytes, bytes]:
    a, b = endpoint_key(seg.src), endpoint_key(seg.dst)
    return a[:-2] + b[:-2] + a[-2:] + b[-2:], b[:-2] + a[:-2] + b[-2:] + a[-2:]


class _StreamNumbers:
    """tcp.stream numbers of every packet. ``TcpStreamNumbers.see`` is asked at every SYN
    and at the first packet of each direction (as the reassembler asks it); in between,
    a direction's number is remembered (a SYN on one direction forgets the other's,
    which may start a new stream)."""

    __slots__ = ("numbers", "known")

    def __init__(self) -> None:
        self.numbers = TcpStreamNumbers()
        self.known: dict[bytes, int | None] = {}

    def of(self, key: bytes, flags: int, seq: int) -> int | None:
        known = self.known
        if not flags & SYN and key in known:
            return known[key]
        rkey = _reverse_key(key)
        number = self.numbers.see(key if key <= rkey else rkey, 0 if key <= rkey else 1, flags, seq)
        if flags & SYN:
            known.pop(rkey, None)
        if len(known) < 2 * MAX_ROUTES:
            known[key] = number
        return number


class _NoticedSet(set):
    """The shadow's known broker endpoints: each new one is sent to every worker."""

    def __init__(self, splitter: Splitter) -> None:
        super().__init__()
        self.splitter = splitter

    def add(self, ep: Any) -> None:
        if not set.__contains__(self, ep):
            set.add(self, ep)
            self.splitter.to_all((TAG_BROKER, self.splitter.pos, ep))


class Splitter:
    """Reads the capture files and sends each of ``outs`` (one pipe per worker) its batches."""

    def __init__(self, config: DissectConfig | None, jobs: int, mode: str, outs: list, max_open: int) -> None:
        self.outs = outs
        self.jobs = jobs
        self.max_open = max_open
        self.router = _Router(jobs, mode)
        self.balance = mode != "hash"
        # the parser's counters and issues (this Dissector is never fed a segment)
        self.parsing = Dissector(config, idle_checks=False)
        # sees every connection until it is decided: the known broker endpoints
        self.shadow = Dissector(config, known_brokers=_NoticedSet(self))
        self.decided: set[bytes] = set()
        self.streams = _StreamNumbers()
        self.batches: list[list] = [[] for _ in range(jobs)]
        # the compiled routing loop: each worker's plain packets as pcap records (bytes as
        # in the file), their tcp.stream numbers, and the file's record layout
        self.split = _csplit.split_chunk if _csplit is not None and jobs <= CSPLIT_MAX_JOBS else None
        self.records: list[bytearray] | None = [bytearray() for _ in range(jobs)]
        self.numbers: list[bytearray] = [bytearray() for _ in range(jobs)]
        self.layout: tuple | None = None
        self.path: str | None = None  # a regular file the workers read their runs from
        self.pos = 0
        self.last_ts: float | None = None
        self.next_check = 0.0  # the idle check schedule every Dissector follows
        self.sources: list = []

    def to_all(self, item: tuple) -> None:
        for batch in self.batches:
            batch.append(item)

    def on_secrets(self, secrets_type: int, data: bytes) -> None:
        self.shadow.add_tls_secrets(secrets_type, data)
        self.to_all((TAG_SECRETS, self.pos, secrets_type, data))

    def _send(self, w: int, msg: tuple) -> None:
        self.outs[w].send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))

    def flush(self) -> bool:
        """Send every worker its batch; False when the run must go on in one process."""
        open_now = self.shadow.tcp.open_connections()
        if open_now > self.max_open:
            why = f"more than {self.max_open:,} TCP connections open at once"
            for w in range(self.jobs):
                self._send(w, (MSG_FALLBACK, why))
            return False
        load = list(self.router.load)
        done = sum(s.stats.file_bytes for s in self.sources)
        for w, batch in enumerate(self.batches):
            numbers = self.numbers[w]
            if self.records is None:
                records: bytes | str = self.path
            else:
                records = bytes(self.records[w])
                if records:
                    self.records[w] = bytearray()
            self._send(w, (MSG_BATCH, load, done, batch, records, bytes(numbers), self.layout))
            self.batches[w] = []
            if numbers:
                self.numbers[w] = bytearray()
        return True

    def to_shadow(self, raw, key: bytes, rkey: bytes, seg=None, packets: int = 1) -> None:
        """A packet of an undecided connection (or a SYN) for the shadow: the common packet
        as it is (its parser's fast path), anything else as the reader's parser made it
        (a datagram reassembled from fragments the shadow never sees one by one)."""
        shadow = self.shadow
        if seg is None:
            seg = shadow.parser.parse(raw)
        if seg is not None:
            shadow.feed_segment(seg, _packets=packets)
            info = shadow.connection(seg.src, seg.dst)
            if info is not None and info.kind != "undecided" and key:
                self.decided.add(key)
                self.decided.add(rkey)
        shadow.drain()

    def _idle_check(self, w: int, pos: int, ts: float) -> None:
        """An idle check falls on this packet: its owner makes it itself, the others are told."""
        self.next_check = ts + IDLE_CHECK_EVERY
        item = (TAG_ADVANCE, pos, ts)
        for other, batch in enumerate(self.batches):
            if other != w:
                batch.append(item)

    def _segment(self, w: int, pos: int, raw, seg, key: bytes, rkey: bytes, packets: int) -> None:
        """What a segment the reader's parser made costs besides its own item: the idle
        schedule and the shadow."""
        ts = seg.ts
        self.last_ts = ts
        if ts >= self.next_check:
            self._idle_check(w, pos, ts)
        shadow = self.shadow
        if key in self.decided and not seg.flags & SYN:  # SYN: the 4-tuple starts over
            if ts >= shadow.next_idle_check:
                shadow.advance(ts)
        else:
            self.to_shadow(raw, key, rkey, seg, packets)

    def route(self, raw, pos: int) -> None:
        """One packet, numbered ``pos``: to its owner's batch, with what it costs the
        parser's books, the tcp.stream numbers, the idle schedule and the shadow."""
        router, batches, streams = self.router, self.batches, self.streams
        parsing = self.parsing
        pst = parsing.parser.stats
        data = raw.data
        # The parser's fast path (Ethernet, IPv4 without options or fragments,
        # TCP): the owner comes from the header bytes, the worker parses it.
        n = len(data)
        if (raw.linktype == 1 and n >= 54 and data[12] == 8 and data[13] == 0
                and data[14] == 0x45 and data[23] == 6 and not (data[20] & 0x3F or data[21])
                and 40 <= (total := (data[16] << 8) | data[17]) <= n - 14
                and 20 <= (data[46] >> 4) * 4 <= total - 20):
            key = data[26:38]
            w = router.owners.get(key)
            rkey = None
            if w is None:
                rkey = data[30:34] + data[26:30] + data[36:38] + data[34:36]
                w = router.assign(key, rkey)
            if self.balance:
                router.load[w] += n
            pst.packets += 1
            pst.tcp += 1
            flags = data[47]
            ts = raw.ts
            # StreamNumbers.of, inlined for the common packet (no SYN, direction known)
            number = streams.known.get(key, NO_NUMBER) if not flags & SYN else NO_NUMBER
            if number is NO_NUMBER:
                number = streams.of(key, flags, int.from_bytes(data[38:42], "big"))
            batches[w].append((TAG_PACKET, pos, ts, 1, data, raw.wire_len, raw.index, number))
            # what every TCP packet costs besides its own item (as _segment, inlined)
            self.last_ts = ts
            if ts >= self.next_check:
                self._idle_check(w, pos, ts)
            if key in self.decided and not flags & SYN:  # SYN: the 4-tuple starts over
                shadow = self.shadow
                if ts >= shadow.next_idle_check:
                    shadow.advance(ts)
            else:
                self.to_shadow(raw, key, rkey if rkey is not None else _reverse_key(key))
        else:
            parsing.stats.packets = pos  # the packet number of its issues' rows
            tcp_before = pst.tcp
            seg = parsing.parser.parse(raw)
            parsing.report_parser_issues(raw.ts)
            if parsing.pending:
                batches[0].append((TAG_ROWS, pos, parsing.drain()))
            if seg is not None:
                key, rkey = _seg_keys(seg)
                w = router.owners.get(key)
                if w is None:
                    w = router.assign(key, rkey)
                if self.balance:
                    router.load[w] += n
                packets = max(1, pst.tcp - tcp_before)  # a reassembled datagram: its fragments
                batches[w].append((TAG_SEGMENT, pos, tuple(seg), packets,
                                   streams.of(key, seg.flags, seg.seq)))
                self._segment(w, pos, raw, seg, key, rkey, packets)

    def _run_records(self, src, path: str) -> int:
        """The packets of one pcap file, the plain ones routed in C (``_csplit.split_chunk``:
        a connection already routed, numbered and decided, no SYN, no idle check due),
        the rest by ``route``. The number of the last packet, or -1 when the run must go
        on in one process.

        A regular uncompressed file is read again by the workers, each the stretch of the
        file that holds its runs (sent as file offsets), instead of its packets being copied
        through a pipe: on (c) that copy cost the reader more CPU than routing. The offsets
        are counted here from the records' lengths and checked against the file at each
        buffer the reader fills."""
        split, route, to_all = self.split, self.route, self.to_all
        fd = None
        if not src.compressed and os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            self.records, self.path = None, path
        try:
            state = (self.router.owners, self.streams.known, self.decided,
                     self.router.load if self.balance else None, self.records, self.numbers, self.batches,
                     RawPacket, TAG_RUN)
            pst = self.parsing.parser.stats
            shadow = self.shadow
            pos = 0
            offset = PCAP_HEADER  # of the next record in the file
            rec_len = 16
            for item in src.records(mapped=fd is not None):
                if type(item) is not RecordChunk:  # a record the reader's Python path read
                    offset += rec_len + len(item.data)
                    self.pos = pos = pos + 1
                    route(item, pos)
                    if pos % WATERMARK_EVERY == 0:
                        to_all((TAG_MARK, pos, item.ts))
                        if pos % BATCH_PACKETS == 0 and not self.flush():
                            return -1
                    continue
                if self.layout is None:
                    self.layout = item.layout
                    rec_len = item.layout[3]
                if type(item.buf) is mmap.mmap:  # the map of the whole file: pos is the offset
                    offset = item.pos
                elif fd is not None:
                    _check_offset(fd, offset, item, rec_len)
                while True:
                    taken, raw, last_ts, offset = split(state, item, WATERMARK_EVERY - pos % WATERMARK_EVERY,
                                                        self.next_check, shadow.next_idle_check, offset)
                    if taken:
                        pos += taken
                        pst.packets += taken
                        pst.tcp += taken
                        self.last_ts = last_ts
                    if raw is not None:
                        pos += 1
                        self.pos = pos
                        route(raw, pos)
                    elif not taken:
                        break  # no whole record left in the chunk
                    self.pos = pos
                    if pos % WATERMARK_EVERY == 0:
                        to_all((TAG_MARK, pos, item.ts))
                        if pos % BATCH_PACKETS == 0 and not self.flush():
                            return -1
            return pos
        finally:
            if fd is not None:
                os.close(fd)

    def run(self, paths: list[str]) -> None:
        sources = self.sources = [open_capture(p) for p in paths]
        for src in sources:
            src.on_secrets = self.on_secrets
        pos = 0
        try:
            if self.split is not None and len(sources) == 1 and sources[0].format == "pcap":
                pos = self._run_records(sources[0], paths[0])
            else:
                for raw in _merged(sources):
                    self.pos = pos = pos + 1
                    self.route(raw, pos)
                    if pos % WATERMARK_EVERY == 0:
                        self.to_all((TAG_MARK, pos, raw.ts))
                        if pos % BATCH_PACKETS == 0 and not self.flush():
                            return
            if pos < 0:  # the run goes on in one process
                return
            if not self.flush():
                return
            parsing = self.parsing
            # the end: the parser's last issues (incomplete fragments), as Dissector.finish makes them
            parsing.stats.packets = pos
            if self.last_ts is not None:
                parsing.advance(self.last_ts)
            parsing.finish()
            rows = parsing.drain()
            issues = [(path, issue) for path, src in zip(paths, sources, strict=True) for issue in src.issues]
            counts = parsing.packet_counts()
            reader = {k: counts[k] for k in ("packets", "not_tcp", "unparseable", "fragments_pending")}
            for w in range(self.jobs):
                self._send(w, (MSG_END, self.last_ts, pos, rows if w == 0 else [], issues if w == 0 else [],
                               reader))
        finally:
            for src in sources:
                src.close()


def map_file(path: str) -> mmap.mmap:
    """The capture file, mapped read-only (the workers take their runs out of it)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def gather_spans(buf: Any, spans: list[tuple[int, int]]) -> bytes:
    """The (offset, length) spans of ``buf``, one after the other (copied once, in C when built)."""
    if _csplit is not None:
        return _csplit.gather(buf, spans)
    view = memoryview(buf)
    try:
        return b"".join([view[off:off + n] for off, n in spans])
    finally:
        view.release()


def _check_offset(fd: int, offset: int, chunk: RecordChunk, rec_len: int) -> None:
    """The record at ``chunk.pos`` is the file's at ``offset`` (the workers read it there)."""
    want = chunk.buf[chunk.pos:chunk.pos + rec_len]
    if want and os.pread(fd, len(want), offset) != want:
        raise RuntimeError(f"--jobs: the capture file changed while it was read (record at offset {offset})")


def read_and_split(paths: list[str], config: DissectConfig | None, jobs: int, mode: str, outs: list,
                   max_open: int, parent_pid: int | None = None) -> None:
    """The reader process's body; a failure goes to every worker, which reports it."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
    try:
        splitter = Splitter(config, jobs, mode, outs, max_open)
        splitter.run(paths)
        if os.environ.get("KWINSPECT_JOBS_DEBUG"):
            import resource
            import sys

            ru = resource.getrusage(resource.RUSAGE_SELF)
            print(f"kwinspect reader: cpu {ru.ru_utime + ru.ru_stime:.2f} s, packets {splitter.pos}, "
                  f"load {splitter.router.load}", file=sys.stderr)
    except BaseException:  # noqa: BLE001 - handed to the workers, then to the main process
        for out in outs:
            try:
                out.send_bytes(pickle.dumps((MSG_ERROR, traceback.format_exc())))
            except OSError:
                pass
    finally:
        for out in outs:
            out.close()
