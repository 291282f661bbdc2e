"""Dissect capture files: readers + the driver (run.loop.PacketLoop), for the CLI and tests.

Several files are read as one capture, merged by packet timestamp (rotated
tcpdump files, or one file per broker).
"""

from __future__ import annotations

import heapq
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from kwinspect.capture.readers import PacketSource, open_capture
from kwinspect.dissect import ConnectionInfo, DissectConfig, Dissector, Event
from kwinspect.model import ErrorRow, Issue
from kwinspect.run.loop import PacketLoop

ProgressFn = Callable[[int, int], None]  # (bytes read so far, total bytes)
STDIN = "-"  # as a path: read the capture from standard input, as it arrives


def _stdin():
    """Standard input as a binary stream (a pipe is read as it arrives, never seeked)."""
    return sys.stdin.buffer


@dataclass
class FileRun:
    """What reading the files produced besides exchanges: counts and the dissector's state."""

    paths: list[str] = field(default_factory=list)
    total_bytes: int = 0
    dissector: Dissector | None = None
    issues: list[tuple[str, Issue]] = field(default_factory=list)  # (path, issue) from the readers
    sources: list[PacketSource] = field(default_factory=list)
    interrupted: bool = False
    # kinds of the record-batch problems the `records` table met (limits, bad records), counted
    record_problems: Counter[str] = field(default_factory=Counter)
    # the Dissector's on_close hook (one process only: `stats` counts connections with it)
    on_close: Callable[[ConnectionInfo], None] | None = None


def _merged(sources: list[PacketSource]) -> Iterable:
    """The packets of all sources by time; one source is its reader itself (PacketLoop feeds
    a reader's buffers to the compiled packet loop; several merged go one packet at a time)."""
    if len(sources) == 1:
        return sources[0]
    return heapq.merge(*sources, key=lambda raw: raw.ts)


def dissect_files(paths: Iterable[str | os.PathLike[str]], config: DissectConfig | None = None,
                  run: FileRun | None = None, progress: ProgressFn | None = None) -> Iterator[Event]:
    """Yield Exchange and ErrorRow values from one or more capture files, in capture order.

    Opening raises ``CaptureFormatError`` / ``OSError`` before anything is yielded
    for input that is not a readable capture; everything wrong inside a capture
    is reported as ErrorRows instead.
    """
    for batch in dissect_file_batches(paths, config, run, progress):
        yield from batch


def dissect_file_batches(paths: Iterable[str | os.PathLike[str]], config: DissectConfig | None = None,
                         run: FileRun | None = None, progress: ProgressFn | None = None
                         ) -> Iterator[list[Event]]:
    """dissect_files a list at a time (PacketLoop.batches): the same events, in order."""
    run = run if run is not None else FileRun()
    run.paths = [os.fspath(p) for p in paths]
    sources = [open_capture(_stdin() if p == STDIN else p) for p in run.paths]
    run.sources = sources
    run.total_bytes = sum(os.path.getsize(p) for p in run.paths if p != STDIN and os.path.isfile(p))
    dissector = Dissector(config, on_close=run.on_close)
    run.dissector = dissector
    for src in sources:  # TLS secrets inside pcapng files (Decryption Secrets Blocks)
        src.on_secrets = dissector.add_tls_secrets

    def tick(_count: int) -> None:
        if progress is not None:
            progress(sum(s.position() for s in sources), run.total_bytes)

    # A pipe (`tcpdump -U -w - | kwinspect exchanges -`) is read as it arrives: rows go
    # out as soon as they are in order, not every WATERMARK_EVERY packets (a watermark
    # per packet that completes something costs little at a live rate).
    eager = any(p == STDIN or not os.path.isfile(p) for p in run.paths)
    loop = PacketLoop(dissector, tick=tick, eager=eager, name=", ".join(run.paths))
    try:
        yield from loop.batches(_merged(sources))  # (a file gives no idle ticks: no None)
        for path, src in zip(run.paths, sources, strict=True):
            for issue in src.issues:  # truncated files and the like: reported, not fatal
                run.issues.append((path, issue))
                yield [ErrorRow(kind=issue.kind, message=f"{path}: {issue.message}", path=None)]
    finally:
        for src in sources:
            src.close()
    if progress is not None:
        progress(run.total_bytes, run.total_bytes)


def dissect_file(path: str | os.PathLike[str], config: DissectConfig | None = None) -> list[Event]:
    """Convenience for tests and notebooks: every event of one file as a list."""
    return list(dissect_files([path], config))
