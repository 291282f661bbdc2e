"""`kwinspect live`: capture on an interface, print rows as they complete.

The front-end half of live capture (the capture half is capture/live.py):
rows out through the same writers as the offline commands, ``-w`` pcap files,
a one-line status on stderr when it is a terminal, stop on Ctrl-C / SIGTERM /
``--duration`` / ``--count``, then a summary on stderr.

Memory stays flat over hours: exchanges are written and dropped, closed
connections are pruned from the dissector, and the counters kept for the
summary are bounded (per API name, status and error kind).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from kwinspect.capture.live import (
    DEFAULT_BUFFER,
    DEFAULT_SNAPLEN,
    LiveCapture,
    LiveCaptureError,
    PcapRotator,
)
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.export.tables import CAPTURE_TABLES, rows_of
from kwinspect.model import ErrorRow, Exchange, plural
from kwinspect.run.live import StopWhen, live_events


@dataclass
class LiveOptions:
    interface: str
    bpf: str
    config: DissectConfig
    table: str = "exchanges"  # exchanges | records | errors | none
    fmt: str = "jsonl"
    output: str | None = None
    keep: Callable[[dict], bool] | None = None  # the compiled --filter
    values: str = "auto"
    write: str | None = None
    rotate_bytes: int | None = None
    rotate_seconds: float | None = None
    max_files: int | None = None
    duration: float | None = None
    count: int | None = None
    snaplen: int = DEFAULT_SNAPLEN
    buffer_bytes: int = DEFAULT_BUFFER
    promisc: bool = True
    quiet: bool = False
    status_interval: float = 1.0
    also: list[tuple[str, str, str]] = field(default_factory=list)  # (table, format, path)
    metrics: tuple[str, int] | None = None  # --metrics (host, port): serve the Prometheus endpoint
    metrics_label_cap: int | None = None  # --max-labels for the endpoint's label values


class LiveTally:
    """Bounded counters for the status line and the final summary."""

    def __init__(self) -> None:
        self.exchanges = 0
        self.records = 0
        self.apis: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def add(self, ev: Any) -> None:
        if isinstance(ev, Exchange):
            self.exchanges += 1
            self.apis[ev.api_name or f"api_{ev.api_key}"] += 1
            self.statuses[ev.status] += 1
        elif isinstance(ev, ErrorRow):
            self.errors[ev.kind] += 1


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


class _Status:
    """The periodic one-line status on stderr (terminals only)."""

    def __init__(self, stream: IO[str], interval: float, enabled: bool) -> None:
        self.stream = stream
        self.interval = interval
        self.enabled = enabled and _isatty(stream)
        self.t0 = time.monotonic()
        self.last = self.t0
        self.last_packets = 0
        self.last_bytes = 0
        self.shown = False

    def maybe(self, cap: LiveCapture, tally: LiveTally, dissector: Dissector) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        c = cap.counters
        dt = now - self.last
        pps = (c.packets - self.last_packets) / dt
        bps = (c.bytes - self.last_bytes) / dt
        self.last, self.last_packets, self.last_bytes = now, c.packets, c.bytes
        received, dropped = cap.kernel_stats()
        backlog = max(0, received - dropped - c.packets)
        line = (f"[{cap.interface} {now - self.t0:6.0f}s] {c.packets:,} pkts ({pps:,.0f}/s, "
                f"{bps / 1e6:.1f} MB/s), {dropped:,} dropped, {backlog:,} queued, "
                f"{dissector.stats.kafka_connections:,} kafka conns, {tally.exchanges:,} exchanges, "
                f"{sum(tally.errors.values()):,} errors")
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Sink:
    """One table going to one destination (the main -t/-o, or an --also TABLE=FILE)."""

    def __init__(self, table: str, fmt: str, output: str | None, keep: Callable[[dict], bool] | None) -> None:
        from kwinspect.export.writers import open_writer

        kw: dict[str, Any] = {}
        if fmt == "jsonl":
            kw["line_buffered"] = True  # also into a file: `tail -f` shows rows at once
        elif fmt == "table":
            kw["chunk_size"] = 1
        self.table = table
        self.fmt = fmt
        self.output = output
        self.keep = keep
        self.rows = 0
        self.to_stdout = output in (None, "-")
        self.writer = open_writer(fmt, table, output, **kw)

    def put(self, item: Any) -> None:
        if self.keep is None or self.keep(item.row()):
            self.writer.write(item)
            self.rows += 1

    def flush(self) -> None:
        """CSV is not flushed per row by its writer: flush on the loop's ticks."""
        self.writer.flush()


def run_live(opts: LiveOptions, *, stderr: IO[str] | None = None) -> int:
    """Capture until stopped; returns the exit status (0 on a clean stop).

    Raises ``LiveCaptureError`` (exit 1) before anything is written when the
    interface does not exist or capture is not permitted.
    """
    err = stderr if stderr is not None else sys.stderr
    cap = LiveCapture(opts.interface, opts.bpf, snaplen=opts.snaplen, buffer_bytes=opts.buffer_bytes,
                      promisc=opts.promisc).open()
    pcap: PcapRotator | None = None
    sinks: list[_Sink] = []
    stop_event = threading.Event()
    stop = StopWhen(stop_event, duration=opts.duration, count=opts.count)
    old_handlers: dict[int, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if stop_event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up on the clean stop
        stop.reason = "interrupted" if signum == signal.SIGINT else "terminated"
        stop_event.set()

    # The socket is capturing from here on (the kernel queues what arrives), so say so
    # before the slower set-up (pyarrow comes with the row writers).
    link = {1: "EN10MB (Ethernet)", 101: "RAW (IP)", 113: "LINUX_SLL (Linux cooked v1)"}.get(
        cap.linktype, str(cap.linktype))
    print(f"kwinspect: listening on {cap.interface}, link-type {link}, snapshot length "
          f"{opts.snaplen} bytes, filter {opts.bpf!r}", file=err, flush=True)
    exporter = None
    if opts.metrics is not None:
        exporter = _start_metrics(opts, cap, err)
    dissector = Dissector(opts.config, on_close=exporter.add_connection if exporter is not None else None)
    tally = LiveTally()
    status = _Status(err, opts.status_interval, not opts.quiet)
    try:
        if opts.write:
            pcap = PcapRotator(opts.write, cap.linktype, opts.snaplen, max_bytes=opts.rotate_bytes,
                               every=opts.rotate_seconds, max_files=opts.max_files)
        if opts.table != "none":
            sinks.append(_Sink(opts.table, opts.fmt, opts.output, opts.keep))
        for table, fmt, path in opts.also:
            sinks.append(_Sink(table, fmt, path, None))
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old_handlers[sig] = signal.signal(sig, on_signal)

        on_packets = None
        if pcap is not None:
            pwrite = pcap.write

            def on_packets(batch: list) -> None:
                for raw in batch:
                    pwrite(raw)

        by_table = {t: [k for k in sinks if k.table == t] for t in CAPTURE_TABLES}
        ex_sinks, rec_sinks, err_sinks = by_table["exchanges"], by_table["records"], by_table["errors"]
        shares_terminal = (status.enabled and _isatty(sys.stdout) and any(k.to_stdout for k in sinks))
        for ev in live_events(cap, dissector, stop, on_packets=on_packets):
            if ev is None:
                if pcap is not None:
                    pcap.tick()
                if exporter is not None:
                    cap.kernel_stats()  # the drop counter a scrape reads
                for k in sinks:
                    k.flush()
                status.maybe(cap, tally, dissector)
                continue
            tally.add(ev)
            if exporter is not None:
                exporter.add(ev, dissector.shared.topic_names)
            if not sinks:
                continue
            if shares_terminal and status.shown:
                status.clear()  # rows and the status line share the terminal: the line goes first
            if isinstance(ev, Exchange):
                for k in ex_sinks:
                    k.put(ev)
                if rec_sinks:
                    for rec in rows_of("records", ev, values=opts.values, topic_names=dissector.shared.topic_names):
                        tally.records += 1
                        for k in rec_sinks:
                            k.put(rec)
            else:
                for k in err_sinks:
                    k.put(ev)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        cap.close()
        if pcap is not None:
            pcap.close()
        if exporter is not None:
            exporter.close()
        status.clear()
        try:
            for k in sinks:
                k.writer.close()
        finally:
            if not opts.quiet:
                _summary(err, opts, cap, dissector, tally, pcap, stop, time.monotonic() - status.t0, sinks)
    return 0


def _start_metrics(opts: LiveOptions, cap: LiveCapture, err: IO[str]) -> Any:
    """The Prometheus endpoint (export/metrics.py; prometheus_client is imported only then).
    Raises LiveCaptureError when the address cannot be bound."""
    from kwinspect.export.metrics import METRICS_LABEL_CAP, MetricsExporter

    counters = cap.counters

    def capture_counts() -> dict[str, int]:
        return {"packets": counters.packets, "dropped_packets": counters.kernel_dropped,
                "received_packets": counters.kernel_received}

    exporter = MetricsExporter(opts.metrics_label_cap or METRICS_LABEL_CAP, kafka_ports=opts.config.kafka_ports,
                               capture=capture_counts)
    host, port = opts.metrics  # type: ignore[misc]
    try:
        host, port = exporter.serve(host, port)
    except OSError as exc:
        cap.close()
        raise LiveCaptureError(f"--metrics {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    print(f"kwinspect: metrics on http://{shown}:{port}/metrics", file=err, flush=True)
    return exporter


def _summary(err: IO[str], opts: LiveOptions, cap: LiveCapture, d: Dissector, tally: LiveTally,
             pcap: PcapRotator | None, stop: StopWhen, elapsed: float, sinks: list[_Sink]) -> None:
    c = cap.counters
    why = {"interrupted": "interrupted (Ctrl-C)", "terminated": "terminated (SIGTERM)",
           "duration": f"--duration {opts.duration or 0:g} s reached",
           "count": f"--count {opts.count} packets reached"}.get(stop.reason or "", stop.reason or "stopped")
    unread = max(0, c.kernel_received - c.kernel_dropped - c.packets)
    lines = [
        f"kwinspect live: {why} after {elapsed:.1f} s",
        f"  {c.packets:,} packets captured ({_mb(c.bytes)}), {c.kernel_received:,} received by filter, "
        f"{c.kernel_dropped:,} dropped by kernel, {unread:,} left unread at the stop, "
        f"{c.truncated:,} cut by the snapshot length",
        f"  {plural(d.stats.kafka_connections, 'Kafka connection')}, {plural(tally.exchanges, 'exchange')}"
        + (f" ({', '.join(f'{n:,} {s}' for s, n in tally.statuses.most_common())})" if tally.statuses else ""),
    ]
    if stop.drained:
        lines.append(f"  {stop.drained:,} of them were read after the stop (decoding was behind the traffic)")
    if tally.apis:
        lines.append("  APIs: " + ", ".join(f"{a} {n:,}" for a, n in tally.apis.most_common(12)))
    if any(k.table == "records" for k in sinks):
        lines.append(f"  {tally.records:,} records")
    if tally.errors:
        lines.append("  errors: " + ", ".join(f"{k} {n:,}" for k, n in tally.errors.most_common(12)))
    for k in sinks:
        lines.append(f"  {k.rows:,} {k.table} rows written to {k.output or 'stdout'}")
    if pcap is not None:
        kept = pcap.kept
        where = kept[0] if len(kept) == 1 else f"{len(kept)} files, {kept[0]} .. {kept[-1]}"
        lines.append(f"  {pcap.packets:,} packets written to {where}"
                     + (f" ({len(pcap.removed)} older files removed by -W)" if pcap.removed else ""))
    err.write("\n".join(lines) + "\n")
    err.flush()
