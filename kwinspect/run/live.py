"""Live capture driven into the Dissector: the packet source with its stop conditions,
the loop (run.loop.PacketLoop, rows in completion order), and a thread that feeds a
queue for the TUI. The socket itself is kwinspect.capture.live.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kwinspect.capture.live import DEFAULT_SNAPLEN, LiveCapture, PcapRotator, capture_filter
from kwinspect.capture.readers import RawPacket
from kwinspect.dissect import Dissector
from kwinspect.run.loop import PacketLoop

__all__ = ["LiveEventSource", "StopWhen", "live_events", "live_packets"]


@dataclass
class StopWhen:
    """Stop conditions; ``event`` is set from a signal handler or another thread."""

    event: threading.Event
    duration: float | None = None  # seconds of wall-clock time
    count: int | None = None  # packets captured (as tcpdump -c / tshark -c)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.reason: str | None = None
        self.drained = 0  # packets read after the stop (the socket's backlog)

    def remaining(self) -> float | None:
        if self.duration is None:
            return None
        return self.duration - (time.monotonic() - self.started)


def live_packets(capture: LiveCapture, stop: StopWhen, *,
                 on_packets: Callable[[list[RawPacket]], None] | None = None,
                 tick: float = 0.2, drain: float = 2.0) -> Iterator[RawPacket | None]:
    """The packets of a live capture until ``stop``, with ``None`` as an idle tick about
    every ``tick`` seconds. On stop (``stop.event``, ``duration``, ``count``) the
    packets already queued in the socket are still read, for up to ``drain`` seconds
    (not for ``count``; ``stop.drained`` counts them: decoding was behind the traffic).
    ``on_packets`` sees every batch first (the -w writer)."""
    next_tick = time.monotonic() + tick
    count = stop.count
    try:
        while True:
            if stop.event.is_set():
                stop.reason = stop.reason or "stopped"
                break
            wait = tick
            left = stop.remaining()
            if left is not None:
                if left <= 0:
                    stop.reason = "duration"
                    break
                wait = min(wait, left)
            limit = 4096
            if count is not None:
                limit = count - capture.counters.packets
                if limit <= 0:
                    stop.reason = "count"
                    break
                limit = min(limit, 4096)
            batch = capture.read(wait, limit)
            if batch:
                if on_packets is not None:
                    on_packets(batch)
                yield from batch
            now = time.monotonic()
            if not batch or now >= next_tick:  # idle, or busy for a whole tick: let the caller flush
                next_tick = now + tick
                yield None
        if stop.reason != "count" and drain > 0:
            deadline = time.monotonic() + drain
            while time.monotonic() < deadline:
                batch = capture.read(0, 4096)
                if not batch:
                    break
                stop.drained += len(batch)
                if on_packets is not None:
                    on_packets(batch)
                yield from batch
    finally:
        capture.kernel_stats()


def live_events(capture: LiveCapture, dissector: Dissector, stop: StopWhen, *,
                on_packets: Callable[[list[RawPacket]], None] | None = None,
                tick: float = 0.2, drain: float = 2.0) -> Iterator[Any]:
    """Exchange/ErrorRow values from a live capture, as they complete (not reordered:
    a live view shows what just happened), with ``None`` as an idle tick (callers
    flush outputs and print progress then). When the capture stops, the dissector is
    finished: requests still waiting for their response come out as
    ``response_missing`` exchanges. Memory stays flat over hours of traffic because
    the Dissector keeps only its newest ``keep_closed_connections`` closed
    connections, folding the others into its packet counts."""
    loop = PacketLoop(dissector, ordered=False, stop_unparseable=False)
    return loop.run(live_packets(capture, stop, on_packets=on_packets, tick=tick, drain=drain))


class LiveEventSource:
    """Live capture in a background thread, events into a queue (for the TUI).

        src = LiveEventSource("eth0", config, bpf=capture_filter(ports), write="s.pcap")
        q = src.start(end=END)       # opens the socket now: LiveCaptureError here
        ...                          # the consumer reads Exchange/ErrorRow values from q
        src.stop()                   # finishes the dissector, then puts `end` on the queue

    ``dissector`` is the live Dissector (topic names for records), ``error``
    holds a message if the thread died, ``capture.counters`` the counts.
    """

    def __init__(self, interface: str, config: Any = None, *, bpf: str | None = None,
                 dissector: Any = None, snaplen: int = DEFAULT_SNAPLEN, promisc: bool = True,
                 write: str | None = None, rotate_bytes: int | None = None,
                 rotate_seconds: float | None = None, max_files: int | None = None,
                 maxsize: int = 10_000) -> None:
        self.config = config
        self.dissector = dissector if dissector is not None else Dissector(config)
        if bpf is None:
            bpf = capture_filter(None)
        self.capture = LiveCapture(interface, bpf, snaplen=snaplen, promisc=promisc)
        self._write = (write, dict(max_bytes=rotate_bytes, every=rotate_seconds, max_files=max_files))
        self.writer: PcapRotator | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.stopped = threading.Event()
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self, end: Any = None) -> queue.Queue:
        self.capture.open()
        path, rotation = self._write
        if path:
            self.writer = PcapRotator(path, self.capture.linktype, self.capture.snaplen, **rotation)
        self._end = end
        self._thread = threading.Thread(target=self._run, name="kwinspect-live", daemon=True)
        self._thread.start()
        return self.queue

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        stop = StopWhen(self.stopped)
        on_packets = None
        if self.writer is not None:
            write = self.writer.write

            def on_packets(batch: list[RawPacket]) -> None:
                for raw in batch:
                    write(raw)
        try:
            for ev in live_events(self.capture, self.dissector, stop, on_packets=on_packets):
                if ev is None:
                    if self.writer is not None:
                        self.writer.tick()
                    continue
                while True:  # a full queue slows the reader down; the kernel buffer absorbs it
                    try:
                        self.queue.put(ev, timeout=0.2)
                        break
                    except queue.Full:
                        if self.stopped.is_set() and self.queue.full():
                            break
        except Exception as exc:  # noqa: BLE001 - a bug in the core: keep the app alive, say so
            self.error = f"live capture stopped: {type(exc).__name__}: {exc}"
        finally:
            self.capture.close()
            if self.writer is not None:
                self.writer.close()
            try:
                self.queue.put(self._end, timeout=1.0)
            except queue.Full:
                pass
