"""The kwinspect TUI application: sources, the indexing thread, screens.

    KwinspectApp(paths=["capture.pcap"]).run()              # a capture file
    KwinspectApp(live=queue_of_events, label="eth0").run()   # a live feed

The app owns one ExchangeStore and one Indexer running in a daemon thread
(file: dissect + tap frames; live: consume Exchange/ErrorRow values from a
queue or iterator).  Screens read the store; nothing blocks the event loop.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from textual.app import App
from textual.message import Message

from kwinspect.dissect import DissectConfig
from kwinspect.tui.indexer import Indexer
from kwinspect.tui.record_match import RecordFiltering
from kwinspect.tui.store import ExchangeStore

LIVE_MAX_ROWS = 1_000_000  # live mode keeps at most this many exchanges (oldest dropped in chunks)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def give_back_big_buffers() -> None:
    """Have glibc map every buffer of 128 KiB or more on its own, so that it goes back to the
    system when freed. By default the threshold rises to the size of the largest buffer freed
    (up to 32 MiB): after the first filters over a million rows, their numpy columns came
    from the heap and stayed in the app's RSS (~30 MB more at a million rows). No-op
    without glibc."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError, TypeError):
        pass


class KwinspectApp(App):
    TITLE = "kwinspect"
    ENABLE_COMMAND_PALETTE = False

    class ViewChanged(Message):
        """A filter/toggle/sort finished; ``count`` rows are shown (tests wait on it)."""

        def __init__(self, count: int) -> None:
            super().__init__()
            self.count = count

    class DetailShown(Message):
        def __init__(self, row: int) -> None:
            super().__init__()
            self.row = row

    class Exported(Message):
        def __init__(self, path: str, count: int) -> None:
            super().__init__()
            self.path = path
            self.count = count

    def __init__(self, paths: Sequence[str | os.PathLike[str]] = (), *, config: DissectConfig | None = None,
                 live: queue.Queue | Iterable[Any] | None = None, live_dissector: Any = None,
                 label: str | None = None, values: str = "auto", max_rows: int | None = None,
                 initial_filter: str | None = None, schemas: Any = None) -> None:
        super().__init__()
        give_back_big_buffers()
        self.schemas = schemas  # analyze.schema_values.SchemaValues: decodes the records tab's keys/values
        self.paths = [os.fspath(p) for p in paths]
        self.config = config
        self.live = live
        live_mode = live is not None
        # file mode: the indexing process writes the frame spill; live mode keeps an LRU of messages
        self.store = ExchangeStore(redact=config.redact if config else True, values=values,
                                   max_rows=max_rows if max_rows is not None else (LIVE_MAX_ROWS if live_mode else None),
                                   spill=False)
        self.indexer = Indexer(self.store)
        # compiles the filter bar's expressions; key./value. fields need the schemas, and are
        # matched in a helper process for capture files
        self.record_filtering = RecordFiltering(schemas, self.store)
        self._live_dissector = live_dissector
        self.source_label = label or (", ".join(os.path.basename(p) for p in self.paths) if self.paths else "live")
        self.initial_filter = initial_filter
        self._thread: threading.Thread | None = None

    @property
    def dissector(self) -> Any:
        return self.indexer.dissector or self._live_dissector

    def on_mount(self) -> None:
        from kwinspect.tui.screens.main import MainScreen

        self.title = f"kwinspect — {self.source_label}"
        if self.live is not None:
            target, args = self.indexer.consume, (self.live, self._live_dissector)
        else:
            target, args = self.indexer.index_files_in_process, (self.paths, self.config)
        self._thread = threading.Thread(target=target, args=args, name="kwinspect-index", daemon=True)
        self._thread.start()
        self.push_screen(MainScreen())

    def on_unmount(self) -> None:
        self.indexer.cancel()
        proc = getattr(self.indexer, "process", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()  # our own child; its reader thread then sees EOF
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.record_filtering.close()
        self.store.close()


def run_tui(paths: Sequence[str], config: DissectConfig | None = None, *, replay: bool = False,
            rate: float | None = None, **kw: Any) -> int:
    """`kwinspect tui`: browse capture files, or replay them as a live feed (``replay``)."""
    source = None
    if replay:
        from kwinspect.tui.indexer import ReplaySource

        source = ReplaySource(list(paths), config, rate=rate, speed=None if rate else 1.0)
        kw["live"] = source.start()
        kw.setdefault("label", "replay of " + ", ".join(os.path.basename(p) for p in paths))
    try:
        KwinspectApp([] if replay else paths, config=config, **kw).run()
    finally:
        if source is not None:
            source.stop.set()
    return 0


def run_live(interface: str, config: DissectConfig | None = None, *, kafka_ports: Any = None,
             **kw: Any) -> int:
    """`kwinspect tui --live -i IFACE`: the live-capture layer feeds the app's queue.

    The capture and its Dissector run in a thread of this process
    (``capture.live.LiveEventSource``); the app consumes its queue like any live
    feed and shows the live dissector's connections.
    """
    import sys

    from kwinspect.capture.live import LiveCaptureError, capture_filter
    from kwinspect.run.live import LiveEventSource
    from kwinspect.tui.indexer import END

    source = LiveEventSource(interface, config, bpf=capture_filter(kafka_ports))
    try:
        q = source.start(end=END)
    except LiveCaptureError as exc:
        print(f"kwinspect: {exc}", file=sys.stderr)
        return 1
    kw.setdefault("label", f"live on {interface}")
    try:
        KwinspectApp(config=config, live=q, live_dissector=source.dissector, **kw).run()
    finally:
        source.stop()
    return 0
