"""Size-delimited Kafka frame splitting for one TCP direction (sans-IO).

Feed the in-order bytes of one direction, tell it about bytes TCP lost, then
pull events (the h11 "feed, then pull" style)::

    sp = FrameSplitter(RequestValidator())
    sp.feed(data, ts, pkt)     # any chunking: whole, per segment, byte by byte
    sp.gap(nbytes, ts)         # bytes lost in the capture; the splitter resyncs
    sp.finish()                # end of the direction
    for ev in sp.events():     # Frame | Skipped | FramingIssue, in stream order
        ...

Every Kafka request and response is ``int32 size`` + ``size`` bytes.  The
splitter slices frames without trusting sizes further than
``max_frame_size`` (default 100 MiB, the broker's ``socket.request.max.bytes``):
it never buffers more than one frame of at most that size (plus the chunk being
fed).  A larger frame is reported (``oversized_frame``) and skipped as it
streams past, without being buffered.

States
------
``sync``   the next byte starts a frame (the normal, fast path).
``skip``   skipping the known rest of a frame: an oversized one, or one cut by a
           gap whose end is still known from its size prefix.
``hunt``   looking for the next plausible frame boundary after a gap, after an
           implausible size, or when the direction was picked up mid-stream
           (``synced=False``).  A candidate boundary must have a size in
           ``[validator.min_payload, max_frame_size]``, a payload prefix the
           validator accepts, and (when more bytes follow) be followed by
           another sane size prefix and a payload prefix the validator accepts
           (the chain check).  The scan is done by a compiled regular
           expression, so garbage is skipped at C speed; candidates that pass
           the byte prefilter are checked in Python.

Accounting (per direction, always, see :meth:`FrameSplitter.check_accounting`)::

    frame_bytes + skipped_bytes + tail_bytes + buffered_bytes == fed_bytes
    stream bytes = fed_bytes + gap_bytes
                 = frame_bytes + skipped_bytes + gap_bytes + tail_bytes (+ buffered)

``frame_bytes`` counts the 4-byte size prefixes too.  ``buffered_bytes`` is 0
after :meth:`FrameSplitter.finish`.  The sums of the emitted ``Frame`` sizes
(+4 each) and ``Skipped.nbytes`` equal ``frame_bytes`` and ``skipped_bytes``.
"""

from __future__ import annotations

import functools
import re
import struct
from collections import deque
from collections.abc import Callable, Collection
from typing import NamedTuple

from kwinspect.model import (
    LIMIT_EXCEEDED,
    OVERSIZED_FRAME,
    RESYNC,
    SEVERITY_ERROR,
    SEVERITY_WARNING,
    TRUNCATED_FRAME,
    Issue,
)
from kwinspect.protocol.apis import API_NAMES, version_range
from kwinspect.protocol.peek import (
    MAX_UNKNOWN_KEY_VERSION,
    MIN_REQUEST_HEADER,
    NEW_API_KEY_LIMIT,
    NEW_VERSION_SLACK,
    peek_request_header,
    plausible_header,
)

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # broker default socket.request.max.bytes
DEFAULT_PEEK_BYTES = 1024  # payload prefix handed to a validator

# Skipped.reason values
SKIP_RESYNC = "resync"  # bytes passed over while hunting for a frame boundary
SKIP_OVERSIZED = OVERSIZED_FRAME  # the body of a frame larger than max_frame_size
SKIP_TRUNCATED = TRUNCATED_FRAME  # the parts we hold of a frame that a gap cut
SKIP_LOST = "lost_sync"  # after max_hunt_bytes without a boundary, until the next gap
DEFAULT_MAX_HUNT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_HUNT_CANDIDATES = 250_000

_SYNC = "sync"
_SKIP = "skip"
_HUNT = "hunt"
_LOST = "lost"

_NORMAL, _GAP, _FINISH = 0, 1, 2
_ACCEPT, _REJECT, _WAIT, _REJECT_CHECKED = 0, 1, 2, 3  # CHECKED: the validator said no

_COMPACT_AT = 1 << 20
_NO_CHUNK = (0, 0.0, 0)
_ZEROS8 = bytes(8)
_I32 = struct.Struct(">i").unpack_from


def _first_nonzero(buf: bytearray, q: int, n: int) -> int:
    """Index of the first non-zero byte in buf[q:n], or n (C-speed, 1 MiB windows)."""
    while q < n:
        end = min(n, q + (1 << 20))
        rest = len(buf[q:end].lstrip(b"\x00"))
        if rest:
            return end - rest
        q = end
    return n


class Frame(NamedTuple):
    """One size-delimited frame."""

    data: bytes  # payload, without the 4-byte size prefix
    offset: int  # stream offset of the size prefix
    ts_first: float  # ts of the data that held the first byte (of the prefix)
    ts_last: float  # ts of the data that held the last byte
    pkt_first: int = 0  # packet number of the data that held the first byte (0: not given)
    pkt_last: int = 0  # packet number of the data that held the last byte

    @property
    def size(self) -> int:
        return len(self.data)


class Skipped(NamedTuple):
    """Bytes the splitter held but could not put in a frame."""

    offset: int  # stream offset of the first skipped byte
    nbytes: int
    reason: str  # SKIP_RESYNC | SKIP_OVERSIZED | SKIP_TRUNCATED


# FramingIssues of one kind listed per direction (like conversation.MAX_ISSUES_PER_KIND):
# the rest are counted and reported in one row when the direction ends
MAX_ISSUES_PER_KIND = 100

class FramingIssue(NamedTuple):
    """Something worth reporting: ``kind`` is a model issue kind."""

    kind: str  # OVERSIZED_FRAME | TRUNCATED_FRAME | RESYNC
    offset: int  # stream offset it refers to
    message: str
    ts: float | None = None
    pkt: int = 0  # packet number of the data at `offset` (0: not given)

    def as_issue(self) -> Issue:
        """The shared model's Issue (offset = stream offset of the direction)."""
        severity = SEVERITY_WARNING if self.kind == RESYNC else SEVERITY_ERROR
        return Issue(self.kind, self.message, self.offset, None, severity)


Event = Frame | Skipped | FramingIssue
Validator = Callable[[memoryview], bool]


@functools.cache
def _hunt_tables(known_kafka: bool) -> tuple[tuple[bytes, int], frozenset[int] | None]:
    """A RequestValidator's byte prefilter for the hunt (payload bytes 0..9: api key,
    version, a non-negative correlation id, a client id length < 256 or -1) and the
    (api_key << 16 | api_version) values our tables know (a fast first check; None for a
    connection known to carry Kafka). The same for every validator of a kind: built once
    (from every API's version range, ~30 us; a validator is made per connection)."""
    ranges = [version_range(k) for k in API_NAMES]
    max_key = max(API_NAMES) if API_NAMES else 0
    max_ver = max((r[1] for r in ranges if r), default=0)
    if known_kafka:
        max_key = NEW_API_KEY_LIMIT
        max_ver = max(max_ver + NEW_VERSION_SLACK, MAX_UNKNOWN_KEY_VERSION)
    prefilter = (
        rb"\x00[\x00-" + re.escape(bytes([min(max_key, 255)])) + rb"]\x00[\x00-"
        + re.escape(bytes([min(max_ver, 255)])) + rb"][\x00-\x7f][\s\S]{3}(?:\x00[\s\S]|\xff\xff)",
        10,
    )
    known = None if known_kafka else frozenset(
        (k << 16) | v for k in API_NAMES if (r := version_range(k)) for v in range(r[0], r[1] + 1)
    )
    return prefilter, known


class RequestValidator:
    """Resync validator for the client->broker direction.

    Accepts a payload prefix that :func:`kwinspect.protocol.peek.plausible_request`
    accepts.  ``known_kafka`` loosens the api key/version checks for a
    connection already known to carry Kafka.  When ``last_correlation_id``
    is known (the splitter sets it through ``note_last_frame`` to the last
    request framed before a hunt; the owner may set it too), a candidate's
    correlation id must come after it, within ``correlation_window``
    (correlation ids grow per connection; Java clients share one counter
    across connections, so they may jump).
    """

    # (a slot: the compiled conversation walk sets it at every request; the rest in the dict)
    __slots__ = ("last_correlation_id", "__dict__")

    min_payload = MIN_REQUEST_HEADER

    def __init__(
        self,
        known_kafka: bool = False,
        last_correlation_id: int | None = None,
        correlation_window: int = 1 << 20,
    ) -> None:
        self.known_kafka = known_kafka
        self.last_correlation_id = last_correlation_id
        self.correlation_window = correlation_window
        self.prefilter, self._known = _hunt_tables(known_kafka)

    def note_last_frame(self, payload: bytes) -> None:
        """Called by the splitter before it hunts: the last frame it framed."""
        peek = peek_request_header(payload)
        if peek is not None:
            self.last_correlation_id = peek.correlation_id

    def __call__(self, payload: memoryview | bytes) -> bool:
        if len(payload) < MIN_REQUEST_HEADER:
            return False
        if self._known is not None and int.from_bytes(payload[0:4], "big") not in self._known:
            return False
        if bytes(payload[0:8]) == _ZEROS8:
            return False  # a run of zeros reads as "Produce v0, correlation id 0"
        peek = peek_request_header(payload)
        if peek is None or not plausible_header(peek, known_kafka=self.known_kafka):
            return False
        return self._cid_follows(peek.correlation_id)

    def _cid_follows(self, cid: int) -> bool:
        last = self.last_correlation_id
        if last is not None:
            delta = (cid - last) & 0x7FFFFFFF
            return 0 < delta <= self.correlation_window
        return True

    def partial(self, prefix: memoryview | bytes) -> bool:
        """Judge a prefix cut short by a gap or the end: False only when what is
        there already rules a request out."""
        n = len(prefix)
        if n >= MIN_REQUEST_HEADER and peek_request_header(prefix) is not None:
            return self(prefix)
        if n >= 4:
            key = int.from_bytes(prefix[0:2], "big", signed=True)
            ver = int.from_bytes(prefix[2:4], "big", signed=True)
            if self._known is not None:
                if (key << 16) | ver not in self._known or key < 0:
                    return False
            elif not (0 <= key <= NEW_API_KEY_LIMIT and 0 <= ver <= MAX_UNKNOWN_KEY_VERSION + NEW_VERSION_SLACK + 20):
                return False
        if n >= 8:
            if bytes(prefix[0:8]) == _ZEROS8:
                return False
            cid = int.from_bytes(prefix[4:8], "big", signed=True)
            if cid < 0 or not self._cid_follows(cid):
                return False
        if n >= MIN_REQUEST_HEADER:
            clen = int.from_bytes(prefix[8:10], "big", signed=True)
            if clen < -1:
                return False
            text = bytes(prefix[10 : 10 + max(clen, 0)]).decode("utf-8", errors="replace").rstrip("\ufffd")
            if "\ufffd" in text or not text.isprintable():
                return False
        return True


class ResponseValidator:
    """Resync validator for the broker->client direction.

    ``pending`` returns the correlation ids of requests still waiting for a
    response (the conversation layer provides it).  When it returns some, a
    candidate must carry one of them; otherwise (nothing known) a response is
    plausible when its correlation id is not negative (together with the size
    and chained-size checks of the splitter).
    """

    min_payload = 4
    prefilter = (rb"[\x00-\x7f]", 1)  # correlation id >= 0

    def __init__(self, pending: Callable[[], Collection[int]] | None = None) -> None:
        self.pending = pending

    def __call__(self, payload: memoryview | bytes) -> bool:
        if len(payload) < 4:
            return False
        cid = int.from_bytes(payload[0:4], "big", signed=True)
        pend = self.pending() if self.pending is not None else None
        if pend:
            return cid in pend
        return cid >= 0

    def partial(self, prefix: memoryview | bytes) -> bool:
        """Judge a prefix cut short by a gap or the end (see RequestValidator.partial)."""
        return len(prefix) < 4 or self(prefix)


def _size_class(max_frame_size: int) -> bytes:
    top = min(max_frame_size >> 24, 0x7F)
    return rb"[\x00-" + re.escape(bytes([top])) + rb"]"


@functools.lru_cache(maxsize=64)
def _prefilter(max_frame_size: int, frag: bytes) -> re.Pattern[bytes]:
    """The hunt's candidate regex (made once: every connection makes two splitters)."""
    return re.compile(_size_class(max_frame_size) + rb"(?=[\s\S]{3}" + frag + rb")")


class FrameSplitter:
    """Split one direction's ordered bytes into size-delimited frames.

    ``validator`` is called with a payload prefix (a memoryview of at most
    ``peek_bytes`` bytes) of a candidate frame while resynchronizing, and to
    tell an oversized frame (skipped) from lost sync (hunt).  It may carry
    ``min_payload`` (smallest plausible payload, default 4), ``prefilter``
    ``(regex_fragment, length)`` describing the payload's first bytes, used to
    scan quickly, ``note_last_frame(payload)``, called with the last frame
    framed before each hunt, and ``partial(prefix)``, judging a header cut
    short by a gap or the end (False only when it rules the frame out); all
    are optional.  ``synced=False`` starts by
    hunting (the direction was picked up mid-stream).  ``start_offset`` is the
    stream offset of the first byte fed.  A hunt that finds no boundary in
    ``max_hunt_bytes`` bytes or ``max_hunt_candidates`` Python-checked
    candidates gives up: the direction is skipped (``lost_sync``) until the
    next :meth:`gap`, which bounds the work adversarial bytes can cause.

    No method raises on any input bytes.
    """

    # Slots, not an instance dict: the compiled driver (_cdriver.c) reads and writes a
    # dozen of these fields per segment, at their offsets instead of by dict lookups.
    __slots__ = (
        "validator", "max_frame_size", "peek_bytes", "max_hunt_bytes", "max_hunt_candidates", "_hunted",
        "_tried", "_min_payload", "_prefilter", "_prefilter_len", "_buf", "_pos", "_base", "_chunks", "ready",
        "_issue_counts", "_state", "_finished", "_run_start", "_run_count", "_run_reason", "_skip_left",
        "_skip_then", "_last_frame", "_need_off", "_parts", "_parts_len", "_part_chunks", "_landing",
        "fed_bytes", "gap_bytes", "frame_bytes", "skipped_bytes", "tail_bytes", "frames", "resyncs",
        "peak_buffered", "_emitted_skipped",
    )

    def __init__(
        self,
        validator: Validator | None = None,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        synced: bool = True,
        peek_bytes: int = DEFAULT_PEEK_BYTES,
        start_offset: int = 0,
        max_hunt_bytes: int | None = DEFAULT_MAX_HUNT_BYTES,
        max_hunt_candidates: int | None = DEFAULT_MAX_HUNT_CANDIDATES,
    ) -> None:
        if max_frame_size < 0 or max_frame_size > 0x7FFFFFFF:
            raise ValueError("max_frame_size must be within 0..2**31-1")
        self.validator = validator
        self.max_frame_size = max_frame_size
        self.peek_bytes = max(16, peek_bytes)
        self.max_hunt_bytes = max_hunt_bytes
        self.max_hunt_candidates = max_hunt_candidates
        self._hunted = 0  # bytes rejected by the current hunt
        self._tried = 0  # candidates the current hunt checked in Python
        self._min_payload = int(getattr(validator, "min_payload", 4))
        frag, flen = getattr(validator, "prefilter", (b"", 0)) or (b"", 0)
        # candidate positions: a size prefix whose top byte fits the limit,
        # followed by what the validator says a payload starts with (a leading
        # character class lets the regex engine skip bytes fast; runs of zeros
        # are jumped over in _hunt)
        self._prefilter = _prefilter(max_frame_size, bytes(frag))
        self._prefilter_len = 4 + flen

        self._buf = bytearray()
        self._pos = 0  # index in _buf of the next undecided byte
        self._base = start_offset  # stream offset of _buf[0]
        # (offset of first byte, ts, packet number) of the chunks fed, from the one
        # holding the first undecided byte on
        self._chunks: deque[tuple[int, float, int]] = deque()
        self.ready: deque[Event] = deque()  # events() hands these out; tested for emptiness per segment
        self._issue_counts: dict[str, int] = {}  # FramingIssues per kind (MAX_ISSUES_PER_KIND)
        self._state = _SYNC if synced else _HUNT
        self._finished = False
        # open run of skipped bytes (not yet reported as a Skipped event)
        self._run_start = start_offset
        self._run_count = 0
        self._run_reason = SKIP_RESYNC
        # skip state
        self._skip_left = 0
        self._skip_then = _SYNC
        # payload of the last frame framed (for the validator's note_last_frame)
        self._last_frame: bytes | None = None
        self._need_off = 0  # stream offset the buffer must reach before _sync can progress
        # chunks fed after _buf while inside a frame of known size, not yet copied
        # into it (only while _need_off is ahead; see _flatten)
        self._parts: list[bytes] = []
        self._parts_len = 0
        # (offset, ts, packet number) of each part: _chunks entries for when a gap or the
        # end cuts the frame and its bytes go back to the buffer (issues may point inside)
        self._part_chunks: list[tuple[int, float, int]] = []
        self._landing = False  # the hunt starts where a trusted size said a frame starts

        self.fed_bytes = 0
        self.gap_bytes = 0
        self.frame_bytes = 0
        self.skipped_bytes = 0
        self.tail_bytes = 0
        self.frames = 0
        self.resyncs = 0
        self.peak_buffered = 0
        self._emitted_skipped = 0

    # ------------------------------------------------------------------ API

    @property
    def offset(self) -> int:
        """Stream offset just past the last byte fed or lost."""
        return self._base + len(self._buf) + self._parts_len

    @property
    def buffered_bytes(self) -> int:
        """Bytes held, waiting for the rest of a frame (or for a resync decision)."""
        return len(self._buf) - self._pos + self._parts_len

    def first_buffered_packet(self) -> int:
        """The number of the packet that brought the first byte held (0: none held, or
        fed without packet numbers): a frame still to come starts there or later."""
        if len(self._buf) - self._pos + self._parts_len <= 0 or not self._chunks:
            return 0
        offset = self._base + self._pos
        pkt = 0
        for start, _ts, chunk_pkt in self._chunks:  # looked at, not consumed (issues may look back)
            if start > offset:
                break
            pkt = chunk_pkt
        return pkt or self._chunks[0][2]

    @property
    def synced(self) -> bool:
        """True while the splitter knows where the next frame starts."""
        return self._state in (_SYNC, _SKIP)

    def feed(self, data: bytes | bytearray | memoryview, ts: float, pkt: int = 0) -> None:
        """Append in-order bytes of the direction; ``ts`` is their capture time, ``pkt``
        the number of the packet that brought them (the frames' ``pkt_first``/``pkt_last``)."""
        # The compiled driver (kwinspect/_cdriver.c) is the twin of the fast path below and
        # of the "still inside a frame" branch, on these same fields: _finished, _buf,
        # _state, _base, _pos, max_frame_size, ready, frames, frame_bytes, fed_bytes,
        # _last_frame, _chunks, _parts, _parts_len, _part_chunks, _need_off, peak_buffered.
        # A change to them changes the C too (tests/test_core.py compares both cores'
        # state after every packet).
        if self._finished or not data:
            return
        n = len(data)
        buf = self._buf
        if not buf and self._state == _SYNC and type(data) is bytes:
            # Fast path: nothing held and in sync, so the frames at the start of `data`
            # are sliced straight out of it (one copy, no trip through the buffer), all
            # with this chunk's ts; whatever follows (part of a frame, a bad size) takes
            # the general path below, as if fed on its own.
            base = self._base
            maxs = self.max_frame_size
            append = self.ready.append
            new_tuple = tuple.__new__
            p = 0
            last = None
            while n - p >= 4:
                size = _I32(data, p)[0]
                if size < 0 or size > maxs:
                    break
                end = p + 4 + size
                if end > n:
                    break
                last = data[p + 4 : end]
                append(new_tuple(Frame, (last, base + p, ts, ts, pkt, pkt)))
                self.frames += 1
                p = end
            if p:
                self._last_frame = last
                self.frame_bytes += p
                self.fed_bytes += p
                self._base = base + p
                chunks = self._chunks
                chunks.clear()
                chunks.append((base, ts, pkt))
                if p == n:
                    return
                data = data[p:]
                n -= p
        parts = self._parts
        end_off = self._base + len(buf) + self._parts_len + n
        need = self._need_off
        if end_off < need:
            # Still inside a frame whose size is known: nothing to decide yet. Its
            # (offset, ts) entry is set aside: a complete frame only asks for the ts of
            # its first byte (in an earlier chunk) and its last one (this call's), but a
            # gap or the end of the stream can cut the frame and then ask anywhere.
            # The chunk is kept as it is (no copy) until the frame is complete.
            self._part_chunks.append((end_off - n, ts, pkt))
            parts.append(data if type(data) is bytes else bytes(data))
            self._parts_len += n
            self.fed_bytes += n
            held = len(buf) - self._pos + self._parts_len
            if held > self.peak_buffered:
                self.peak_buffered = held
            return
        if parts:
            pos = self._pos
            base = self._base
            if self._state != _SYNC or len(buf) - pos < 4 or base + pos + 4 + _I32(buf, pos)[0] != need:
                # a _need_off left by a gap's last _sync, not the frame at _pos
                self._flatten()
            else:
                self._complete(data, n, need, end_off, ts, pkt)
                return
        self._chunks.append((end_off - n, ts, pkt))
        buf += data
        self.fed_bytes += n
        self._process(_NORMAL)

    def gap(self, nbytes: int, ts: float, pkt: int = 0) -> None:
        """``nbytes`` of the direction were lost (not captured) at this point."""
        if self._finished or nbytes <= 0:
            return
        if self._parts:
            self._flatten()
        self._need_off = 0
        self._process(_GAP)
        self._note_hunt()
        lost_from = self.offset
        lost_to = lost_from + nbytes
        self.gap_bytes += nbytes
        avail = len(self._buf) - self._pos
        st = self._state
        if st == _SYNC:
            if avail:
                frame_at = self._base + self._pos
                frame_end = None
                if avail >= 4:
                    size = int.from_bytes(self._buf[self._pos : self._pos + 4], "big", signed=True)
                    if 0 <= size <= self.max_frame_size:
                        frame_end = frame_at + 4 + size
                self._issue(TRUNCATED_FRAME, frame_at, f"frame cut by a gap of {nbytes} bytes")
                self._skip_buffered(SKIP_TRUNCATED)
                self._flush_run()
                if frame_end is not None and frame_end > lost_to:
                    # the size prefix still tells where the next frame starts
                    self._state = _SKIP
                    self._skip_left = frame_end - lost_to
                    self._skip_then = _HUNT  # verify the landing point
                    self._run_reason = SKIP_TRUNCATED
                else:
                    self._state = _HUNT
            else:
                self._state = _HUNT
        elif st == _SKIP:
            self._flush_run()
            if self._skip_left > nbytes:
                self._skip_left -= nbytes
                self._skip_then = _HUNT
            else:
                self._skip_left = 0
                self._state = _HUNT
        else:  # hunting, or lost: a gap is a fresh chance to resync
            self._skip_buffered(SKIP_RESYNC)
            self._flush_run()
            self._state = _HUNT
        self._hunted = self._tried = 0
        self._landing = False
        self._run_reason = SKIP_RESYNC if self._state == _HUNT else self._run_reason
        self._buf.clear()
        self._pos = 0
        self._base = lost_to
        self._run_start = lost_to
        self._chunks.clear()
        self._chunks.append((lost_to, ts, pkt))

    def finish(self) -> None:
        """End of the direction: what is left is a truncated tail or skipped."""
        if self._finished:
            return
        if self._parts:
            self._flatten()
        self._process(_FINISH)
        avail = len(self._buf) - self._pos
        if self._state == _SYNC and avail:
            at = self._base + self._pos
            self.tail_bytes += avail
            self._issue(TRUNCATED_FRAME, at, f"stream ended inside a frame ({avail} bytes held)")
            self._pos = len(self._buf)
        elif avail:  # cannot happen: hunt/skip decide everything at finish
            self._skip_buffered(self._run_reason)
        if self._state == _SKIP and self._skip_left:
            self._issue(TRUNCATED_FRAME, self.offset, f"stream ended {self._skip_left} bytes before the end of a skipped frame")
        self._flush_run()
        self._buf.clear()
        self._base += self._pos
        self._pos = 0
        self._finished = True
        for kind, n in self._issue_counts.items():
            if n > MAX_ISSUES_PER_KIND:
                self.ready.append(FramingIssue(
                    LIMIT_EXCEEDED, self.offset, f"{n - MAX_ISSUES_PER_KIND} more {kind} rows in "
                    f"this direction not listed (the first {MAX_ISSUES_PER_KIND} are)",
                    self._chunks[-1][1] if self._chunks else None))

    def events(self) -> list[Event]:
        """Events produced so far, in stream order; clears them."""
        out = list(self.ready)
        self.ready.clear()
        return out

    def next_event(self) -> Event | None:
        """The next event, or None when there is none for now."""
        return self.ready.popleft() if self.ready else None

    def accounting(self) -> dict[str, int]:
        return {
            "fed_bytes": self.fed_bytes,
            "gap_bytes": self.gap_bytes,
            "frame_bytes": self.frame_bytes,
            "skipped_bytes": self.skipped_bytes,
            "tail_bytes": self.tail_bytes,
            "buffered_bytes": self.buffered_bytes,
        }

    def accounting_error(self) -> str | None:
        """None when every byte is accounted for, else what does not add up."""
        a = self.accounting()
        held = a["frame_bytes"] + a["skipped_bytes"] + a["tail_bytes"] + a["buffered_bytes"]
        if held != a["fed_bytes"]:
            return f"frame+skipped+tail+buffered={held} != fed={a['fed_bytes']}: {a}"
        if self._emitted_skipped + self._run_count != self.skipped_bytes:
            return f"Skipped events {self._emitted_skipped} + open run {self._run_count} != skipped {self.skipped_bytes}"
        if self._finished and a["buffered_bytes"]:
            return f"bytes still buffered after finish: {a}"
        return None

    def check_accounting(self) -> None:
        """Raise AssertionError when bytes were lost track of (a test/debug aid)."""
        err = self.accounting_error()
        if err is not None:
            raise AssertionError(err)

    # ------------------------------------------------------------ internals

    def _complete(self, data: bytes | bytearray | memoryview, n: int, need: int, end_off: int,
                  ts: float, pkt: int) -> None:
        """``data`` completes the frame the buffer starts (_sync stopped at its size
        prefix, which it checked): join its pieces once, then carry on with the rest
        of the chunk as if fed on its own."""
        parts = self._parts
        buf = self._buf
        pos = self._pos
        base = self._base
        k = need - (end_off - n)  # bytes of this chunk that end the frame
        parts.append(data[:k] if k < n else data)
        with memoryview(buf) as mv:
            parts[0:0] = (mv[pos + 4 :],)
            last = b"".join(parts)
        off = base + pos
        first = self._chunk_at(off)
        self.ready.append(tuple.__new__(Frame, (last, off, first[1], ts, first[2], pkt)))
        self._last_frame = last
        self.frames += 1
        self.frame_bytes += need - off
        self.fed_bytes += k
        parts.clear()
        self._part_chunks.clear()
        self._parts_len = 0
        self._need_off = 0
        buf.clear()
        self._pos = 0
        self._base = need
        chunks = self._chunks
        chunks.clear()
        chunks.append((need, ts, pkt))
        if k == n:
            return
        data = data[k:]
        n -= k
        self.feed(data, ts, pkt)

    def _flatten(self) -> None:
        """Copy the chunks held aside into the buffer (a gap or the end cut the frame)."""
        buf = self._buf
        for part in self._parts:
            buf += part
        self._parts.clear()
        self._parts_len = 0
        self._chunks.extend(self._part_chunks)
        self._part_chunks.clear()

    def _chunk_at(self, offset: int) -> tuple[int, float, int]:
        """(offset, ts, packet number) of the chunk that holds ``offset``."""
        chunks = self._chunks
        while len(chunks) > 1 and chunks[1][0] <= offset:
            chunks.popleft()
        return chunks[0] if chunks else _NO_CHUNK

    def _ts_at(self, offset: int) -> float:
        return self._chunk_at(offset)[1]

    def _issue(self, kind: str, offset: int, message: str) -> None:
        n = self._issue_counts.get(kind, 0) + 1
        self._issue_counts[kind] = n
        if n <= MAX_ISSUES_PER_KIND:  # the rest are counted, one row at finish()
            _off, ts, pkt = self._chunk_at(offset)
            self.ready.append(FramingIssue(kind, offset, message, ts, pkt))

    def _skip_buffered(self, reason: str) -> None:
        avail = len(self._buf) - self._pos
        if avail:
            if self._run_count == 0:
                self._run_start = self._base + self._pos
                self._run_reason = reason
            self._run_count += avail
            self.skipped_bytes += avail
            self._pos = len(self._buf)

    def _flush_run(self) -> None:
        if self._run_count:
            self.ready.append(Skipped(self._run_start, self._run_count, self._run_reason))
            self._emitted_skipped += self._run_count
            self._run_start += self._run_count
            self._run_count = 0

    def _process(self, mode: int) -> None:
        while True:
            st = self._state
            if st == _SYNC:
                changed = self._sync(mode)
            elif st == _SKIP:
                changed = self._skip()
            elif st == _HUNT:
                changed = self._hunt(mode)
            else:
                changed = self._lost()
            if not changed:
                break
        buf = self._buf
        held = len(buf) - self._pos
        if held > self.peak_buffered:
            self.peak_buffered = held
        if self._pos:
            if held == 0:
                self._base += len(buf)
                buf.clear()
                self._pos = 0
            elif self._pos >= _COMPACT_AT or self._pos > held:
                del buf[: self._pos]
                self._base += self._pos
                self._pos = 0
            chunks = self._chunks
            cur = self._base + self._pos
            while len(chunks) > 1 and chunks[1][0] <= cur:
                chunks.popleft()

    def _sync(self, mode: int) -> bool:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        maxs = self.max_frame_size
        base = self._base
        chunks = self._chunks
        append = self.ready.append
        nbytes = 0
        nframes = 0
        changed = False
        last = None
        new_tuple = tuple.__new__
        single = len(chunks) == 1
        single_ts, single_pkt = (chunks[0][1], chunks[0][2]) if single else (0.0, 0)
        with memoryview(buf) as mv:
            while n - pos >= 4:
                size = _I32(mv, pos)[0]
                if size < 0 or size > maxs:
                    self._pos = pos
                    if last is not None:
                        # a hunt starting here tells the validator about the
                        # last frame framed, which may be one from this very
                        # loop: it must not depend on where a chunk ended
                        self._last_frame = last
                        last = None
                    changed = self._bad_size(mv, size, mode)
                    pos = self._pos
                    break
                end = pos + 4 + size
                if end > n:
                    self._need_off = base + end
                    break
                off = base + pos
                if single:
                    t0 = t1 = single_ts
                    p0 = p1 = single_pkt
                else:
                    _o, t0, p0 = self._chunk_at(off)
                    _o, t1, p1 = self._chunk_at(off + 3 + size)
                last = bytes(mv[pos + 4 : end])
                append(new_tuple(Frame, (last, off, t0, t1, p0, p1)))  # Frame(...) without its Python __new__
                nbytes += end - pos
                nframes += 1
                pos = end
        self._pos = pos
        if last is not None:
            self._last_frame = last
        self.frame_bytes += nbytes
        self.frames += nframes
        return changed

    def _note_hunt(self) -> None:
        note = getattr(self.validator, "note_last_frame", None)
        if note is not None and self._last_frame is not None:
            note(self._last_frame)

    def _bad_size(self, mv: memoryview, size: int, mode: int) -> bool:
        """A size prefix out of range at self._pos: skip the frame or hunt."""
        pos = self._pos
        at = self._base + pos
        n = len(mv)
        if size < 0:
            self._issue(OVERSIZED_FRAME, at, f"negative frame size {size}; resynchronizing")
            self._note_hunt()
            self._state = _HUNT
            return True
        validator = self.validator
        if validator is not None:
            have = n - pos - 4
            if have < self.peek_bytes and mode == _NORMAL:
                return False  # wait for enough of the header to judge
            ok = bool(validator(mv[pos + 4 : pos + 4 + min(have, self.peek_bytes)]))
        else:
            ok = True
        if not ok:
            self._issue(RESYNC, at, f"implausible frame size {size} (limit {self.max_frame_size}); resynchronizing")
            self._note_hunt()
            self._state = _HUNT
            return True
        self._issue(OVERSIZED_FRAME, at, f"frame of {size} bytes exceeds the limit of {self.max_frame_size}; skipped")
        self._flush_run()
        self._state = _SKIP
        self._skip_left = 4 + size
        self._skip_then = _SYNC
        self._run_start = at
        self._run_reason = SKIP_OVERSIZED
        return True

    def _skip(self) -> bool:
        avail = len(self._buf) - self._pos
        k = min(avail, self._skip_left)
        if k:
            if self._run_count == 0:
                self._run_start = self._base + self._pos
            self._pos += k
            self._skip_left -= k
            self._run_count += k
            self.skipped_bytes += k
        if self._skip_left == 0:
            self._flush_run()
            self._state = self._skip_then
            # landing where a trusted size prefix said the next frame starts
            self._landing = self._state == _HUNT
            self._run_reason = SKIP_RESYNC
            self._run_start = self._base + self._pos
            return True
        return False

    def _candidate(self, mv: memoryview, q: int, n: int, mode: int) -> int:
        if n - q < 4:
            return _WAIT if mode == _NORMAL else _REJECT
        size = int.from_bytes(mv[q : q + 4], "big", signed=True)
        if size < self._min_payload or size > self.max_frame_size:
            return _REJECT
        want = size if size < self.peek_bytes else self.peek_bytes
        have = n - q - 4
        if have < want and mode == _NORMAL:
            return _WAIT
        validator = self.validator
        if validator is not None and not validator(mv[q + 4 : q + 4 + min(want, have)]):
            return _REJECT_CHECKED
        fe = q + 4 + size
        if fe + 4 <= n:
            nsize = int.from_bytes(mv[fe : fe + 4], "big", signed=True)
            if not self._min_payload <= nsize <= self.max_frame_size:
                return _REJECT
            if validator is None:
                return _ACCEPT
            nwant = nsize if nsize < self.peek_bytes else self.peek_bytes
            nhave = n - fe - 4
            if nhave >= nwant:
                return _ACCEPT if validator(mv[fe + 4 : fe + 4 + nwant]) else _REJECT_CHECKED
            if mode == _NORMAL:
                return _WAIT  # judge once the next frame's header is seen
            # a gap or the end cut the next header: judge what there is of it,
            # and demand enough of it (a size plus a correlation id alone is
            # found inside many responses)
            if nhave < self._min_payload:
                return _REJECT
            partial = getattr(validator, "partial", None)
            if partial is not None and not partial(mv[fe + 4 : n]):
                return _REJECT_CHECKED
            return _ACCEPT
        if mode == _NORMAL:
            return _WAIT  # judge once the next size prefix (or the end) is seen
        if fe != n:
            # cut by a gap or by the end (or followed by a cut size prefix): too
            # little evidence to trust its size, and trusting a false one would
            # hide real frames behind it
            return _REJECT
        return _ACCEPT

    def _landing_check(self, mv: memoryview, q: int, n: int, mode: int) -> int:
        """A landing point needs no chain check: the boundary came from a size."""
        if n - q < 4:
            return _WAIT if mode == _NORMAL else _REJECT
        size = int.from_bytes(mv[q : q + 4], "big", signed=True)
        if size < self._min_payload or size > self.max_frame_size:
            return _REJECT
        want = size if size < self.peek_bytes else self.peek_bytes
        have = n - q - 4
        if have < want and mode == _NORMAL:
            return _WAIT
        validator = self.validator
        if validator is not None and not validator(mv[q + 4 : q + 4 + min(want, have)]):
            return _REJECT
        return _ACCEPT

    def _hunt(self, mode: int) -> bool:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        found = stop = lost_at = -1
        if self._landing:
            with memoryview(buf) as mv:
                r = self._landing_check(mv, pos, n, mode)
            if r == _WAIT:
                return False
            self._landing = False
            if r == _ACCEPT:
                self._state = _SYNC
                self._hunted = self._tried = 0
                return True
        search = self._prefilter.search
        checked = 0  # candidates that reached the validator (and were rejected)
        limit = n - self._prefilter_len + 1  # positions the prefilter can judge
        # The budgets are positional, so the outcome does not depend on how
        # the bytes were chunked.
        budget_end = n + 1
        cand_left = -1
        if mode == _NORMAL:
            if self.max_hunt_bytes is not None:
                budget_end = pos + max(0, self.max_hunt_bytes - self._hunted)
            if self.max_hunt_candidates is not None:
                cand_left = max(0, self.max_hunt_candidates - self._tried)
        scan_limit = min(limit, budget_end)
        p = pos
        with memoryview(buf) as mv:
            while p < scan_limit:
                m = search(buf, p, n)
                if m is None or m.start() >= scan_limit:
                    p = scan_limit
                    break
                q = m.start()
                r = self._candidate(mv, q, n, mode)
                if r == _ACCEPT:
                    found = q
                    break
                if r == _WAIT:
                    stop = q
                    break
                p = q + 1
                if r == _REJECT_CHECKED:
                    checked += 1
                    if checked > cand_left >= 0:
                        lost_at = p
                        break
                if buf[q] == 0 and buf[q + 1] == 0 and buf[q + 2] == 0 and buf[q + 3] == 0:
                    # a run of zeros: every size prefix inside it is 0
                    p = max(p, _first_nonzero(buf, q, n) - 3)
            if found < 0 and stop < 0 and lost_at < 0:
                if p >= budget_end:
                    lost_at = budget_end
                elif mode == _NORMAL:
                    stop = max(pos, p, limit)
                else:
                    for q in range(max(pos, p, limit), n):
                        if self._candidate(mv, q, n, mode) == _ACCEPT:
                            found = q
                            break
                    else:
                        stop = n
        if lost_at >= 0:
            new_pos = lost_at
        else:
            new_pos = found if found >= 0 else stop
        rejected = new_pos - pos
        if rejected:
            if self._run_count == 0:
                self._run_start = self._base + pos
                self._run_reason = SKIP_RESYNC
            self._run_count += rejected
            self.skipped_bytes += rejected
            self._hunted += rejected
        self._tried += checked
        self._pos = new_pos
        if lost_at >= 0:
            self._issue(
                RESYNC,
                self._base + new_pos,
                f"no frame boundary in {self._hunted} bytes ({self._tried} candidates); "
                "skipping the direction until the next gap",
            )
            self._flush_run()
            self._state = _LOST
            return True
        if found < 0:
            return False
        at = self._base + found
        skipped = self._run_count
        self._flush_run()
        if skipped:
            self._issue(RESYNC, at, f"resynchronized after skipping {skipped} bytes")
        self._run_start = at
        self._hunted = self._tried = 0
        self.resyncs += 1
        self._state = _SYNC
        return True

    def _lost(self) -> bool:
        """Given up hunting: skip everything (at memcpy speed) until a gap."""
        avail = len(self._buf) - self._pos
        if avail:
            if self._run_count == 0:
                self._run_start = self._base + self._pos
                self._run_reason = SKIP_LOST
            self._run_count += avail
            self.skipped_bytes += avail
            self._pos = len(self._buf)
        return False
