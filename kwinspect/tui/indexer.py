"""Fill an ExchangeStore from capture files or from a live event feed, in a thread.

File mode runs the packet loop itself (run.loop.PacketLoop, as
``run.files.dissect_files`` does, with the same reader merge) so that it can tap
the raw frames of every exchange for the store's spill file: ``FrameTap`` takes
them from the Dissector's frame hook and files them by correlation id (a request
carries it at bytes 4..8, a response at bytes 0..4); when an Exchange comes out it
takes its frames back.  Frames never paired with an exchange (undecodable
requests) are dropped once a connection holds too many.

Live mode consumes ``Exchange``/``ErrorRow`` values from any iterator or
``queue.Queue`` fed by another thread (the future live-capture layer, or
:class:`ReplaySource` for tests and demos); frames are not tapped there, the
store keeps the last decoded messages in its LRU instead.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from kwinspect.analyze.diagnose import Diagnoser
from kwinspect.capture.readers import open_capture
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector
from kwinspect.model import ErrorRow, Exchange
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.run.loop import PacketLoop
from kwinspect.stream.conversation import ConversationSummary, SharedState
from kwinspect.tui.store import ExchangeStore, FrameSpill, compact

BATCH = 2_000  # events per commit to the store
MAX_HELD_FRAMES = 20_000  # per connection, frames waiting for their exchange
MAX_CONN_SNAPSHOTS = 5_000  # connections described in detail to the app at the end of indexing
END = object()  # sentinel a feeder puts on a queue when it is done
FINDINGS_EVERY = 1.0  # seconds, at least, between two Diagnoser.findings() while indexing (~150 ms each)
# ... and at least this many times as long as the last one took: findings() walks the
# Diagnoser's whole state (0.5-1 s at a million exchanges), so it costs at most 1/20 of indexing
FINDINGS_COST_RATIO = 20
SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
_int32_at = struct.Struct(">i").unpack_from  # a frame's correlation id (signed, as the decoder reads it)
# An ErrorRow goes to the app as the tuple of its fields (ErrorRow(*t) there): pickling
# the slotted dataclass runs its __getstate__/__setstate__ in Python, which cost the
# indexing process about 2 us a row (half a million of them on a capture of 176k
# connections) and the app as much again.
error_fields = attrgetter(*(f.name for f in dataclasses.fields(ErrorRow)))


class Diagnosis:
    """A Diagnoser fed alongside the store, publishing findings as plain dicts (Finding.as_dict).

    ``findings()`` walks all of the Diagnoser's (bounded) state, so it runs at most
    every FINDINGS_EVERY seconds, and never more than 1/FINDINGS_COST_RATIO of the time.
    """

    def __init__(self) -> None:
        self.diagnoser = Diagnoser(deliveries=True)  # as `kwinspect diagnose`: the same findings
        self.dirty = False
        self.last = 0.0
        self.interval = FINDINGS_EVERY

    def add(self, ev: Any) -> None:
        self.diagnoser.add(ev)
        self.dirty = True

    def connections_ended(self, infos: Iterable[Any]) -> None:
        """Tell the Diagnoser how connections ended (as `kwinspect diagnose` does)."""
        try:
            infos = list(infos)  # a live dissector may still be adding connections
        except RuntimeError:
            return
        for info in infos:
            conv = getattr(info, "conversation", None)
            if conv is not None and getattr(info, "closed", None):
                self.diagnoser.connection_ended(conv.stream, info.closed, getattr(info, "closed_by", None))
                self.dirty = True

    def due(self) -> bool:
        return self.dirty and time.monotonic() - self.last >= self.interval

    def snapshot(self) -> tuple[list[dict[str, Any]], int]:
        t0 = time.monotonic()
        out = [f.as_dict() for f in self.diagnoser.findings()]
        t1 = time.monotonic()
        self.last, self.dirty = t1, False
        self.interval = max(FINDINGS_EVERY, FINDINGS_COST_RATIO * (t1 - t0))
        return out, self.diagnoser.exchanges

    def deliveries(self) -> tuple[list[dict[str, Any]], str | None]:
        """The deliveries table and its truncation note (at the end of indexing: it needs it all)."""
        tracker = self.diagnoser.deliveries
        if tracker is None:
            return [], None
        return list(tracker.rows()), tracker.truncation_note()


class _Tap:
    """One connection's frames waiting for their exchange, by correlation id: a frame
    alone (nearly always), or a deque of them when a correlation id is reused in flight."""

    __slots__ = ("req", "resp", "count")

    def __init__(self) -> None:
        self.req: dict[int, bytes | deque[bytes]] = {}
        self.resp: dict[int, bytes | deque[bytes]] = {}
        self.count = 0

    def put(self, side: dict[int, bytes | deque[bytes]], cid: int, frame: bytes) -> None:
        if self.count >= MAX_HELD_FRAMES:
            self.req.clear()
            self.resp.clear()
            self.count = 0
        held = side.get(cid)
        if held is None:
            side[cid] = frame
        elif type(held) is bytes:
            side[cid] = deque((held, frame))
        else:
            held.append(frame)
        self.count += 1

    def take(self, side: dict[int, bytes | deque[bytes]], cid: int | None) -> bytes | None:
        held = side.pop(cid, None)
        if held is None:
            return None
        self.count -= 1
        if type(held) is bytes:
            return held
        frame = held.popleft()
        if held:
            side[cid] = held
        return frame


class FrameTap:
    """The raw frames of each exchange, taken from the Dissector's frame hook.

    Frames are filed by correlation id (a request carries it at bytes 4..8, a response
    at bytes 0..4); when an Exchange comes out, ``frames_of`` takes its frames back.
    It also remembers each connection's SASL mechanism, from its SaslHandshake
    exchanges (the request names it, as the Conversation reads it): a table kept up
    to date per exchange, rather than a walk over every connection per batch (a
    capture with 100k connections spent 3% of indexing in that walk)."""

    def __init__(self) -> None:
        self.taps: dict[str, _Tap] = {}
        self._sasl: dict[str, str | None] = {}
        self._sasl_changed = True  # the app has not had the table yet
        self.dissector: Dissector | None = None

    def attach(self, config: DissectConfig | None) -> Dissector:
        """A Dissector tapped by this, which keeps only summaries of closed conversations
        (a capture with 100k+ connections must not keep 100k conversations alive)."""
        self.dissector = Dissector(config, on_frame=self.frame, keep_conversations=False)
        return self.dissector

    def frame(self, stream: str, direction: str, frame: bytes) -> None:
        if type(frame) is not bytes:
            frame = bytes(frame)
        if direction == "request":
            if len(frame) >= 8:
                tap = self.taps.get(stream)
                if tap is None:
                    tap = self.taps[stream] = _Tap()
                tap.put(tap.req, _int32_at(frame, 4)[0], frame)
        elif len(frame) >= 4:
            tap = self.taps.get(stream)
            if tap is None:
                tap = self.taps[stream] = _Tap()
            tap.put(tap.resp, _int32_at(frame, 0)[0], frame)

    def frames_of(self, ex: Exchange) -> tuple[bytes | None, bytes | None]:
        if ex.api_key == SASL_HANDSHAKE and ex.request is not None:
            self._note_sasl(ex)
        tap = self.taps.get(ex.stream)
        if tap is None:
            return None, None
        req = tap.take(tap.req, ex.correlation_id) if ex.request is not None else None
        resp = tap.take(tap.resp, ex.correlation_id) if ex.response is not None else None
        if tap.count <= 0:
            del self.taps[ex.stream]  # nothing in flight: a new tap is made on the next frame
        return req, resp

    def _note_sasl(self, ex: Exchange) -> None:
        body = ex.request.body
        mechanism = body.get("mechanism") if isinstance(body, dict) else None
        if mechanism and self._sasl.get(ex.stream) != mechanism:
            self._sasl[ex.stream] = mechanism
            self._sasl_changed = True

    def sasl_mechanisms(self) -> dict[str, str | None]:
        """SASL mechanism per stream (the last SaslHandshake's), every connection so far."""
        return dict(self._sasl)

    def sasl_update(self) -> dict[str, str | None] | None:
        """The whole table when it changed since the last call, else None."""
        if not self._sasl_changed:
            return None
        self._sasl_changed = False
        return self.sasl_mechanisms()


@dataclass
class IndexedConnections:
    """What the connections screen reads from a Dissector, sent back by the indexing
    process: the busiest connections (their conversations as summaries) and the
    shared broker and topic tables."""

    connections: dict[str, ConnectionInfo]
    shared: SharedState


def _index_capture(paths: list[str], sources: list, tap: FrameTap, d: Dissector,
                   label: Callable[[Any], Any], tick: Callable[[int], bool]) -> Iterator[Any]:
    """The rows of the capture files in capture order, as the commands give them
    (run.loop.PacketLoop), each labelled with its frames the moment it completes
    (the taps hand them out in completion order); ``tick`` True abandons."""
    # (label_batches: the compiled loop labels a batch's rows at its end, in completion
    # order; the taps hand frames out first in, first out per connection and correlation
    # id, so each row still gets its own)
    loop = PacketLoop(d, label=label, tick=tick, name=", ".join(paths), label_batches=True)
    merged = sources[0] if len(sources) == 1 else heapq.merge(*sources, key=lambda raw: raw.ts)
    yield from loop.run(merged)


def _bytes_read(sources: list[Any]) -> int:
    """Bytes of the capture files read so far (compressed bytes for .gz)."""
    return sum(max(s.stats.file_bytes, s.position()) for s in sources)


def index_process_main(paths: list[str], config: DissectConfig | None, spill_path: str, conn: Any,
                       cancel: Any) -> None:
    """The indexing process: dissect, spill frames, send compact rows to the app.

    Runs the CPU-heavy dissector outside the app's process so the UI keeps its
    GIL (a thread would make every key press wait behind it).
    """
    try:
        sources = [open_capture(p) for p in paths]
    except Exception as exc:  # noqa: BLE001 - reported in the app
        conn.send(("done", [], [], str(exc)))
        return
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    tap = FrameTap()
    d = tap.attach(config)
    for src in sources:  # TLS secrets inside pcapng files (Decryption Secrets Blocks)
        src.on_secrets = d.add_tls_secrets
    diag = Diagnosis()
    spill = open(spill_path, "ab")  # noqa: SIM115 - closed in finally
    conn.send(("ready",))
    offset = 0
    rows: list[tuple] = []
    errors: list[tuple] = []  # error_fields of each ErrorRow
    last_send = time.monotonic()
    sent_once = False
    error = None
    cancelled = False

    def label(ev: Any) -> tuple[Any, Any]:
        """Spill the frames of an event as it completes: (request offset, its length,
        response offset, its length) in the spill, -1 for a frame not kept."""
        nonlocal offset
        if not isinstance(ev, Exchange):
            return ev, None
        req, resp = tap.frames_of(ev)
        req_off = req_len = resp_off = resp_len = -1
        if req is not None:
            spill.write(req)
            req_off, req_len = offset, len(req)
            offset += req_len
        if resp is not None:
            spill.write(resp)
            resp_off, resp_len = offset, len(resp)
            offset += resp_len
        return ev, (req_off, req_len, resp_off, resp_len)

    def send(final: bool = False) -> None:
        nonlocal rows, errors, last_send
        spill.flush()
        done = _bytes_read(sources) if not final else total
        conn.send(("batch", rows, errors, done, total, dict(d.shared.topic_names), dict(d.shared.brokers),
                   tap.sasl_update()))
        rows, errors = [], []
        last_send = time.monotonic()

    def send_findings() -> None:
        findings, examined = diag.snapshot()
        conn.send(("findings", findings, examined))

    def tick(_count: int) -> bool:
        nonlocal sent_once, cancelled
        if cancel.is_set():
            cancelled = True
            return True
        now = time.monotonic()
        # small batches first (time to first rows), then big ones
        if len(rows) >= BATCH or ((rows or errors) and now - last_send > (0.1 if not sent_once else 0.3)):
            send()
            sent_once = True
            if diag.due():
                send_findings()
        return False

    try:
        for ev, refs in _index_capture(paths, sources, tap, d, label, tick):
            diag.add(ev)
            if isinstance(ev, Exchange):
                rows.append(compact(ev, refs))
            elif isinstance(ev, ErrorRow):
                errors.append(error_fields(ev))
        if cancelled:
            return
        for path, src in zip(paths, sources, strict=True):
            for issue in src.issues:
                err = ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}")
                errors.append(error_fields(err))
                diag.add(err)
        send(final=True)
        diag.connections_ended(d.connections.values())
        send_findings()
        conn.send(("deliveries", *diag.deliveries()))
    except Exception as exc:  # noqa: BLE001 - a bug in the core; keep what was indexed
        error = f"indexing stopped: {type(exc).__name__}: {exc}"
        try:
            send()
        except Exception:  # noqa: BLE001
            pass
    finally:
        spill.close()
        for src in sources:
            src.close()
    # The busiest connections only: a snapshot holds the ApiVersions map (~5 KB), and a
    # capture with 100k+ connections would cost the app hundreds of MB for rows the
    # connections view does not list anyway.
    infos = sorted(d.connections.values(), key=lambda i: -getattr(i.conversation, "requests", 0) or 0)
    conns = [_sendable(i) for i in infos[:MAX_CONN_SNAPSHOTS]]
    conn.send(("done", conns, [], error))


def _sendable(info: ConnectionInfo) -> ConnectionInfo:
    """A connection as the app shows it, its conversation a summary (still open ones,
    after an error, carry a live Conversation)."""
    conv = info.conversation
    if conv is not None and not isinstance(conv, ConversationSummary):
        info = dataclasses.replace(info, conversation=conv.summary())
    return info


class Indexer:
    """Runs in a worker thread; the app polls ``progress``/``done`` and the store."""

    def __init__(self, store: ExchangeStore) -> None:
        self.store = store
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.bytes_read = 0
        self.total_bytes = 0
        self.error: str | None = None
        self.dissector: Any = None  # Dissector (thread, live) or IndexedConnections (process mode)
        self.tap: FrameTap | None = None  # thread mode: the raw frames of each exchange
        self.reader_issues: list[str] = []
        self.process: Any = None  # the indexing subprocess (file mode)
        self.diagnosis: Diagnosis | None = None  # thread and live modes (file mode diagnoses in the child)

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
        tap = self.tap = FrameTap()
        d = tap.attach(config)
        for src in sources:  # TLS secrets inside pcapng files (Decryption Secrets Blocks)
            src.on_secrets = d.add_tls_secrets
        self.dissector = d
        self.diagnosis = Diagnosis()
        batch: list[tuple[Any, Any]] = []
        last_commit = time.monotonic()

        def label(ev: Any) -> tuple[Any, Any]:
            return ev, tap.frames_of(ev) if isinstance(ev, Exchange) else None

        def tick(_count: int) -> bool:
            nonlocal batch, last_commit
            self.bytes_read = _bytes_read(sources)
            if self.cancelled.is_set():
                return True
            now = time.monotonic()
            # commit often at first (time to first rows), then in big batches
            if len(batch) >= BATCH or (batch and now - last_commit > 0.2):
                self._commit(batch)
                batch = []
                last_commit = now
            return False

        try:
            for item in _index_capture(paths, sources, tap, d, label, tick):
                batch.append(item)
            if self.cancelled.is_set():
                return
            for path, src in zip(paths, sources, strict=True):
                for issue in src.issues:
                    self.reader_issues.append(f"{path}: {issue.message}")
                    batch.append((ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}"), None))
            self._commit(batch, final=True)
            self.bytes_read = self.total_bytes
        except Exception as exc:  # noqa: BLE001 - a bug in the core; keep what was indexed
            self.error = f"indexing stopped: {type(exc).__name__}: {exc}"
        finally:
            for src in sources:
                src.close()
            if store.spill is not None:
                store.spill.flush()
            self.done.set()

    def _commit(self, batch: list[tuple[Any, Any]], final: bool = False) -> None:
        diag = self.diagnosis
        if diag is not None:
            for ev, _frames in batch:
                diag.add(ev)
            if final:
                d = self.dissector
                diag.connections_ended(getattr(d, "connections", {}).values() if d is not None else ())
            if final or diag.due():
                self.store.set_findings(*diag.snapshot())
            if final:
                self.store.set_deliveries(*diag.deliveries())
        d = self.dissector
        if d is not None:
            self.store.topic_names = d.shared.topic_names
            sasl = self.tap.sasl_update() if self.tap is not None else None
            if sasl is not None:
                self.store.sasl_mechanisms = sasl
        self.store.add_events(batch)
        if self.store.spill is not None:
            self.store.spill.flush()

    def index_files_in_process(self, paths: Iterable[str | os.PathLike[str]],
                               config: DissectConfig | None = None) -> None:
        """Like index_files, with the dissector in a child process (this thread only appends rows).

        The child is ``python -m kwinspect.tui.index_proc``; it writes the frame
        spill itself and sends compact rows as length-prefixed pickles on its stdout.
        """
        import pickle
        import struct
        import subprocess
        import sys

        store = self.store
        paths = [os.fspath(p) for p in paths]
        spill = FrameSpill(external=True)
        store.spill = spill
        brokers: dict = {}
        proc = None
        try:
            proc = subprocess.Popen([sys.executable, "-m", "kwinspect.tui.index_proc"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.process = proc
            proc.stdin.write(pickle.dumps((paths, config, spill.path)))
            proc.stdin.close()
            out = proc.stdout
            while not self.cancelled.is_set():
                head = out.read(4)
                if len(head) < 4:
                    code = proc.wait()
                    if code:
                        self.error = self.error or f"indexing process ended with exit code {code}"
                    break
                (size,) = struct.unpack("!I", head)
                msg = pickle.loads(out.read(size))  # noqa: S301 - our own child process
                kind = msg[0]
                if kind == "ready":
                    spill.unlink()  # both sides have it open; nothing is left behind on exit
                elif kind == "batch":
                    _kind, rows, errors, done, total, topic_names, brokers, sasl = msg
                    self.total_bytes = total
                    self.bytes_read = done
                    store.topic_names = topic_names
                    if sasl is not None:  # None: unchanged since the last batch
                        store.sasl_mechanisms = sasl
                    if self.dissector is None:
                        self.dissector = IndexedConnections({}, SharedState())
                    self.dissector.shared.brokers = brokers
                    self.dissector.shared.topic_names = topic_names
                    with store.lock:
                        for t in rows:
                            store.add_compact(t)
                        for err in errors:
                            store.add_error(ErrorRow(*err))
                        store.trim()
                        store.generation += 1
                elif kind == "findings":
                    _kind, findings, examined = msg
                    store.set_findings(findings, examined)
                elif kind == "deliveries":
                    _kind, deliveries, note = msg
                    store.set_deliveries(deliveries, note)
                elif kind == "done":
                    _kind, conns, _issues, error = msg
                    if error:
                        self.error = error
                    self.dissector = IndexedConnections({c.stream: c for c in conns},
                                                        SharedState(brokers=brokers, topic_names=store.topic_names))
                    self.bytes_read = self.total_bytes
                    break
        except Exception as exc:  # noqa: BLE001 - shown in the status line
            self.error = f"indexing failed: {type(exc).__name__}: {exc}"
        finally:
            spill.unlink()
            if proc is not None:
                if proc.poll() is None:
                    proc.terminate()
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                if proc.stdout is not None:
                    proc.stdout.close()
            self.done.set()

    # -- live feeds ------------------------------------------------------------------

    def consume(self, source: Iterable[Any] | queue.Queue, dissector: Dissector | None = None) -> None:
        """Index events from an iterator or a queue until it ends (queue: the END sentinel)."""
        self.dissector = dissector
        self.diagnosis = Diagnosis()
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
            self._commit(batch, final=True)
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
        from kwinspect.run.files import dissect_files

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
