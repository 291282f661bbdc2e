"""Fill an ExchangeStore from capture files or from a live event feed, in a thread.

File mode runs the dissector itself (like ``capture.files.dissect_files``, with
the same reader merge) so that it can tap the raw frames of every exchange for
the store's spill file.  The tap wraps each connection's
``Conversation.on_request/on_response`` the first time the dissector drains
frames for it and files the frames by correlation id (a request carries it at
bytes 4..8, a response at bytes 0..4); when an Exchange comes out it takes its
frames back.  Frames never paired with an exchange (undecodable requests) are
dropped once a connection holds too many.

Live mode consumes ``Exchange``/``ErrorRow`` values from any iterator or
``queue.Queue`` fed by another thread (the future live-capture layer, or
:class:`ReplaySource` for tests and demos); frames are not tapped there, the
store keeps the last decoded messages in its LRU instead.
"""

from __future__ import annotations

import heapq
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kwinspect.capture.readers import open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import ErrorRow, Exchange
from kwinspect.tui.store import ExchangeStore

BATCH = 2_000  # events per commit to the store
MAX_HELD_FRAMES = 20_000  # per connection, frames waiting for their exchange
END = object()  # sentinel a feeder puts on a queue when it is done


class _Tap:
    __slots__ = ("req", "resp", "count")

    def __init__(self) -> None:
        self.req: dict[int, deque[bytes]] = {}
        self.resp: dict[int, deque[bytes]] = {}
        self.count = 0

    def put(self, side: dict[int, deque[bytes]], cid: int, frame: bytes) -> None:
        if self.count >= MAX_HELD_FRAMES:
            self.req.clear()
            self.resp.clear()
            self.count = 0
        side.setdefault(cid, deque()).append(bytes(frame))
        self.count += 1

    def take(self, side: dict[int, deque[bytes]], cid: int | None) -> bytes | None:
        if cid is None:
            return None
        q = side.get(cid)
        if not q:
            return None
        frame = q.popleft()
        if not q:
            del side[cid]
        self.count -= 1
        return frame


class TappingDissector(Dissector):
    """A Dissector that also hands back the raw frames of each exchange."""

    def __init__(self, config: DissectConfig | None = None) -> None:
        super().__init__(config)
        self.taps: dict[str, _Tap] = {}
        self._tapped: set[int] = set()

    def _drain(self, conn, src) -> None:  # noqa: ANN001 - Dissector's private hook
        conv = conn.info.conversation
        if conv is not None and id(conv) not in self._tapped:
            self._tapped.add(id(conv))
            self._wrap(conv)
        super()._drain(conn, src)

    def _wrap(self, conv: Any) -> None:
        tap = self.taps.setdefault(conv.stream, _Tap())
        on_request, on_response = conv.on_request, conv.on_response

        def tapped_request(frame: bytes, ts_first: float, ts_last: float) -> None:
            if len(frame) >= 8:
                tap.put(tap.req, int.from_bytes(frame[4:8], "big", signed=True), frame)
            on_request(frame, ts_first, ts_last)

        def tapped_response(frame: bytes, ts_first: float, ts_last: float) -> None:
            if len(frame) >= 4:
                tap.put(tap.resp, int.from_bytes(frame[0:4], "big", signed=True), frame)
            on_response(frame, ts_first, ts_last)

        conv.on_request = tapped_request
        conv.on_response = tapped_response

    def frames_of(self, ex: Exchange) -> tuple[bytes | None, bytes | None]:
        tap = self.taps.get(ex.stream)
        if tap is None:
            return None, None
        req = tap.take(tap.req, ex.correlation_id) if ex.request is not None else None
        resp = tap.take(tap.resp, ex.correlation_id) if ex.response is not None else None
        return req, resp

    def sasl_mechanisms(self) -> dict[str, str | None]:
        out = {}
        for info in list(self.connections.values()):
            conv = info.conversation
            if conv is not None and conv.sasl_mechanism:
                out[conv.stream] = conv.sasl_mechanism
        return out


class Indexer:
    """Runs in a worker thread; the app polls ``progress``/``done`` and the store."""

    def __init__(self, store: ExchangeStore) -> None:
        self.store = store
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.bytes_read = 0
        self.total_bytes = 0
        self.error: str | None = None
        self.dissector: Dissector | None = None
        self.reader_issues: list[str] = []

    @property
    def progress(self) -> float | None:
        if self.total_bytes <= 0:
            return None
        return min(1.0, self.bytes_read / self.total_bytes)

    def cancel(self) -> None:
        self.cancelled.set()

    # -- capture files ----------------------------------------------------------------

    def index_files(self, paths: Iterable[str | os.PathLike[str]], config: DissectConfig | None = None) -> None:
        store = self.store
        try:
            paths = [os.fspath(p) for p in paths]
            sources = [open_capture(p) for p in paths]
        except Exception as exc:  # noqa: BLE001 - shown in the app, never a traceback
            self.error = str(exc)
            self.done.set()
            return
        self.total_bytes = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
        d = TappingDissector(config)
        self.dissector = d
        batch: list[tuple[Any, Any]] = []
        merged = sources[0] if len(sources) == 1 else heapq.merge(*sources, key=lambda raw: raw.ts)
        last_commit = time.monotonic()

        def drain() -> None:
            for ev in d.pop_events():
                batch.append((ev, d.frames_of(ev) if isinstance(ev, Exchange) else None))

        try:
            count = 0
            for raw in merged:
                d.feed_packet(raw)
                if d._events:  # noqa: SLF001 - cheap emptiness check before pop_events()
                    drain()
                count += 1
                if count & 0x3FF == 0:
                    self.bytes_read = sum(s.stats.file_bytes for s in sources)
                    if self.cancelled.is_set():
                        return
                    now = time.monotonic()
                    # commit often at first (time to first rows), then in big batches
                    if len(batch) >= BATCH or (batch and now - last_commit > 0.2):
                        self._commit(batch)
                        batch = []
                        last_commit = now
            d.finish()
            drain()
            for path, src in zip(paths, sources, strict=True):
                for issue in src.issues:
                    self.reader_issues.append(f"{path}: {issue.message}")
                    batch.append((ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}"), None))
            self._commit(batch)
            self.bytes_read = self.total_bytes
        except Exception as exc:  # noqa: BLE001 - a bug in the core; keep what was indexed
            self.error = f"indexing stopped: {type(exc).__name__}: {exc}"
        finally:
            for src in sources:
                src.close()
            if store.spill is not None:
                store.spill.flush()
            self.done.set()

    def _commit(self, batch: list[tuple[Any, Any]]) -> None:
        d = self.dissector
        if d is not None:
            self.store.topic_names = d.shared.topic_names
            if isinstance(d, TappingDissector):
                self.store.sasl_mechanisms = d.sasl_mechanisms()
        self.store.add_events(batch)
        if self.store.spill is not None:
            self.store.spill.flush()

    # -- live feeds ------------------------------------------------------------------

    def consume(self, source: Iterable[Any] | queue.Queue, dissector: Dissector | None = None) -> None:
        """Index events from an iterator or a queue until it ends (queue: the END sentinel)."""
        self.dissector = dissector
        batch: list[tuple[Any, Any]] = []
        try:
            for ev in _events_of(source, self.cancelled):
                if ev is None:  # idle tick: commit what we have
                    if batch:
                        self._commit(batch)
                        batch = []
                    continue
                batch.append((ev, None))
                if len(batch) >= 256:
                    self._commit(batch)
                    batch = []
            if batch:
                self._commit(batch)
        except Exception as exc:  # noqa: BLE001
            self.error = f"live feed stopped: {type(exc).__name__}: {exc}"
        finally:
            self.done.set()


def _events_of(source: Iterable[Any] | queue.Queue, cancelled: threading.Event) -> Iterator[Any]:
    """Events from a queue (with None ticks while idle) or an iterator."""
    if isinstance(source, queue.Queue):
        while not cancelled.is_set():
            try:
                ev = source.get(timeout=0.05)
            except queue.Empty:
                yield None
                continue
            if ev is END:
                return
            yield ev
            if source.empty():
                yield None
        return
    for ev in source:
        if cancelled.is_set():
            return
        yield ev


class ReplaySource:
    """Replays a capture file's events into a queue at a controlled pace.

    ``rate`` = events per second (None: as fast as possible), or ``speed`` =
    multiple of the capture's own timing.  Stands in for live capture in tests
    and demos: the TUI consumes the queue exactly as it will consume the
    live-capture layer's.
    """

    def __init__(self, paths: list[str], config: DissectConfig | None = None, *, rate: float | None = None,
                 speed: float | None = None, loop: bool = False) -> None:
        self.paths = paths
        self.config = config
        self.rate = rate
        self.speed = speed
        self.loop = loop
        self.queue: queue.Queue = queue.Queue(maxsize=10_000)
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> queue.Queue:
        self._thread = threading.Thread(target=self._run, name="kwinspect-replay", daemon=True)
        self._thread.start()
        return self.queue

    def _run(self) -> None:
        from kwinspect.capture.files import dissect_files

        try:
            while not self.stop.is_set():
                first_ts: float | None = None
                t0 = time.monotonic()
                for n, ev in enumerate(dissect_files(self.paths, self.config)):
                    if self.stop.is_set():
                        return
                    if self.rate:
                        _sleep_until(t0 + n / self.rate, self.stop)
                    elif self.speed:
                        ts = getattr(ev, "request_ts", None) or getattr(ev, "ts", None)
                        if ts is not None:
                            first_ts = ts if first_ts is None else first_ts
                            _sleep_until(t0 + (ts - first_ts) / self.speed, self.stop)
                    self.queue.put(ev)
                if not self.loop:
                    break
        finally:
            self.queue.put(END)


def _sleep_until(deadline: float, stop: threading.Event) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        stop.wait(min(delay, 1.0))


ProgressFn = Callable[[int, int], None]
