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
from types import SimpleNamespace
from typing import Any

from kwinspect.analyze.diagnose import Diagnoser
from kwinspect.capture.readers import open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import ErrorRow, Exchange
from kwinspect.stream.row_order import END as END_KEY
from kwinspect.stream.row_order import WATERMARK_EVERY, RowOrder
from kwinspect.tui.store import ExchangeStore, FrameSpill, compact

BATCH = 2_000  # events per commit to the store
MAX_HELD_FRAMES = 20_000  # per connection, frames waiting for their exchange
MAX_CONN_SNAPSHOTS = 5_000  # connections described in detail to the app at the end of indexing
END = object()  # sentinel a feeder puts on a queue when it is done
FINDINGS_EVERY = 1.0  # seconds, at least, between two Diagnoser.findings() while indexing (~150 ms each)


class Diagnosis:
    """A Diagnoser fed alongside the store, publishing findings as plain dicts (Finding.as_dict).

    ``findings()`` walks all of the Diagnoser's (bounded) state, so it runs at most
    every FINDINGS_EVERY seconds, and never more than a fifth of the time.
    """

    def __init__(self) -> None:
        self.diagnoser = Diagnoser()
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
        self.interval = max(FINDINGS_EVERY, 5 * (t1 - t0))
        return out, self.diagnoser.exchanges


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
        self._sasl: dict[str, str | None] = {}

    def _drain(self, conn, src) -> None:  # noqa: ANN001 - Dissector's private hook
        conv = conn.info.conversation
        if conv is not None and id(conv) not in self._tapped:
            self._tapped.add(id(conv))
            self._wrap(conv)
        super()._drain(conn, src)

    def _wrap(self, conv: Any) -> None:
        stream = conv.stream
        taps = self.taps
        on_request, on_response = conv.on_request, conv.on_response

        def tapped_request(frame: bytes, ts_first: float, ts_last: float) -> None:
            if len(frame) >= 8:
                tap = taps.get(stream) or taps.setdefault(stream, _Tap())
                tap.put(tap.req, int.from_bytes(frame[4:8], "big", signed=True), frame)
            on_request(frame, ts_first, ts_last)

        def tapped_response(frame: bytes, ts_first: float, ts_last: float) -> None:
            if len(frame) >= 4:
                tap = taps.get(stream) or taps.setdefault(stream, _Tap())
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
        if tap.count <= 0:
            del self.taps[ex.stream]  # nothing in flight: a new tap is made on the next frame
        return req, resp

    def _close(self, conn_id, ts: float, reason: str) -> None:  # noqa: ANN001 - Dissector's private hook
        super()._close(conn_id, ts, reason)
        # A closed connection's Conversation (pending maps, splitter state) is no longer
        # needed; keep only what the connections view shows, so a capture with 100k+
        # connections does not keep 100k conversations alive in the indexing process.
        info = self.connections.get(conn_id)
        conv = getattr(info, "conversation", None)
        if conv is not None and not isinstance(conv, SimpleNamespace):
            info.conversation = SimpleNamespace(
                stream=conv.stream, client_software=conv.client_software, sasl_mechanism=conv.sasl_mechanism,
                advertised=dict(conv.advertised) if conv.advertised else None, requests=conv.requests)
            self._tapped.discard(id(conv))
            if conv.sasl_mechanism:
                self._sasl[conv.stream] = conv.sasl_mechanism

    def sasl_mechanisms(self) -> dict[str, str | None]:
        """SASL mechanism per stream: closed connections (kept) plus the open ones."""
        out = dict(self._sasl)
        for conn in list(self._conns.values()):
            conv = conn.info.conversation
            if conv is not None and getattr(conv, "sasl_mechanism", None):
                out[conv.stream] = conv.sasl_mechanism
        return out


def _bytes_read(sources: list[Any]) -> int:
    """Bytes of the capture files read so far.

    ``PacketSource.stats.file_bytes`` is only set when a file ends (the pcap fast
    path in capture/readers.py counts in a local variable), so while reading we
    ask the OS for the position of the file descriptor underneath (compressed
    position for .gz, which is what the total is measured in).
    """
    total = 0
    for s in sources:
        done = s.stats.file_bytes
        f = getattr(getattr(s, "_reader", None), "_f", None)
        try:
            done = max(done, os.lseek(f.fileno(), 0, os.SEEK_CUR))
        except (AttributeError, OSError, ValueError, TypeError):
            pass
        total += done
    return total


def _conn_snapshot(info: Any) -> dict[str, Any]:
    conv = info.conversation
    return {
        "stream": info.stream, "kind": info.kind, "bytes": dict(info.bytes), "gap_bytes": info.gap_bytes,
        "closed": info.closed, "first_ts": info.first_ts, "last_ts": info.last_ts,
        "conversation": None if conv is None else {
            "client_software": conv.client_software, "sasl_mechanism": conv.sasl_mechanism,
            "advertised": dict(conv.advertised) if conv.advertised else None, "stream": conv.stream},
    }


def snapshot_namespace(conns: list[dict[str, Any]], brokers: dict, topic_names: dict) -> SimpleNamespace:
    """What the connections screen reads from a Dissector, rebuilt from plain values."""
    out = {}
    for c in conns:
        conv = c["conversation"]
        ns = SimpleNamespace(**{**c, "conversation": SimpleNamespace(**conv) if conv else None})
        out[c["stream"]] = ns
    return SimpleNamespace(connections=out, shared=SimpleNamespace(brokers=brokers, topic_names=topic_names))


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
    d = TappingDissector(config)
    diag = Diagnosis()
    spill = open(spill_path, "ab")  # noqa: SIM115 - closed in finally
    conn.send(("ready",))
    offset = 0
    rows: list[tuple] = []
    errors: list[ErrorRow] = []
    merged = sources[0] if len(sources) == 1 else heapq.merge(*sources, key=lambda raw: raw.ts)
    last_send = time.monotonic()
    sent_once = False
    error = None

    held = RowOrder()  # rows in capture order, as the commands give them

    def drain(end: bool = False) -> None:
        """Spill the frames of the events now (the taps hand them out in emission order),
        hold the rows back until they are in capture order."""
        nonlocal offset
        pos = END_KEY if end else count
        for ev in d.pop_events():
            refs = None
            if isinstance(ev, Exchange):
                refs = [-1, -1, -1, -1]
                for n, frame in enumerate(d.frames_of(ev)):
                    if frame is not None:
                        spill.write(frame)
                        refs[2 * n], refs[2 * n + 1] = offset, len(frame)
                        offset += len(frame)
            held.push(ev.order or pos, (ev, refs))

    def release(items: list) -> None:
        for ev, refs in items:
            diag.add(ev)
            if isinstance(ev, Exchange):
                rows.append(compact(ev, refs))
            elif isinstance(ev, ErrorRow):
                errors.append(ev)

    def send(final: bool = False) -> None:
        nonlocal rows, errors, last_send
        spill.flush()
        done = _bytes_read(sources) if not final else total
        conn.send(("batch", rows, errors, done, total, dict(d.shared.topic_names), dict(d.shared.brokers),
                   d.sasl_mechanisms()))
        rows, errors = [], []
        last_send = time.monotonic()

    def send_findings() -> None:
        findings, examined = diag.snapshot()
        conn.send(("findings", findings, examined))

    count = 0
    try:
        for raw in merged:
            d.feed_packet(raw)
            count += 1
            if d._events:  # noqa: SLF001 - cheap emptiness check before pop_events()
                drain()
            if count % WATERMARK_EVERY == 0:
                release(held.pop_ready(d.watermark(raw.ts)))
            if count & 0x3FF == 0:
                if cancel.is_set():
                    return
                now = time.monotonic()
                # small batches first (time to first rows), then big ones
                if len(rows) >= BATCH or ((rows or errors) and now - last_send > (0.1 if not sent_once else 0.3)):
                    send()
                    sent_once = True
                    if diag.due():
                        send_findings()
        d.finish()
        drain(end=True)
        release(held.pop_all())
        for path, src in zip(paths, sources, strict=True):
            for issue in src.issues:
                errors.append(ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}"))
                diag.add(errors[-1])
        send(final=True)
        diag.connections_ended(d.connections.values())
        send_findings()
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
    conns = [_conn_snapshot(i) for i in infos[:MAX_CONN_SNAPSHOTS]]
    conn.send(("done", conns, [], error))


class Indexer:
    """Runs in a worker thread; the app polls ``progress``/``done`` and the store."""

    def __init__(self, store: ExchangeStore) -> None:
        self.store = store
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.bytes_read = 0
        self.total_bytes = 0
        self.error: str | None = None
        self.dissector: Any = None  # Dissector (thread mode) or a snapshot of its connections (process mode)
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
        d = TappingDissector(config)
        self.dissector = d
        self.diagnosis = Diagnosis()
        batch: list[tuple[Any, Any]] = []
        merged = sources[0] if len(sources) == 1 else heapq.merge(*sources, key=lambda raw: raw.ts)
        last_commit = time.monotonic()

        held = RowOrder()  # rows in capture order, as the commands give them
        count = 0

        def drain(end: bool = False) -> None:
            pos = END_KEY if end else count
            for ev in d.pop_events():  # frames now: the taps hand them out in emission order
                held.push(ev.order or pos, (ev, d.frames_of(ev) if isinstance(ev, Exchange) else None))

        try:
            for raw in merged:
                d.feed_packet(raw)
                count += 1
                if d._events:  # noqa: SLF001 - cheap emptiness check before pop_events()
                    drain()
                if count % WATERMARK_EVERY == 0:
                    batch.extend(held.pop_ready(d.watermark(raw.ts)))
                if count & 0x3FF == 0:
                    self.bytes_read = _bytes_read(sources)
                    if self.cancelled.is_set():
                        return
                    now = time.monotonic()
                    # commit often at first (time to first rows), then in big batches
                    if len(batch) >= BATCH or (batch and now - last_commit > 0.2):
                        self._commit(batch)
                        batch = []
                        last_commit = now
            d.finish()
            drain(end=True)
            batch.extend(held.pop_all())
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
        d = self.dissector
        if d is not None:
            self.store.topic_names = d.shared.topic_names
            if isinstance(d, TappingDissector):
                self.store.sasl_mechanisms = d.sasl_mechanisms()
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
                    store.sasl_mechanisms = sasl
                    if self.dissector is None:
                        self.dissector = snapshot_namespace([], brokers, topic_names)
                    self.dissector.shared.brokers = brokers
                    self.dissector.shared.topic_names = topic_names
                    with store.lock:
                        for t in rows:
                            store.add_compact(t)
                        for err in errors:
                            store.add_error(err)
                        store._trim()  # noqa: SLF001 - the store's own bounding, after a batch
                        store.generation += 1
                elif kind == "findings":
                    _kind, findings, examined = msg
                    store.set_findings(findings, examined)
                elif kind == "done":
                    _kind, conns, _issues, error = msg
                    if error:
                        self.error = error
                    self.dissector = snapshot_namespace(conns, brokers, store.topic_names)
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
