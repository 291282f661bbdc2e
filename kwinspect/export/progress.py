"""A progress bar on stderr for long inputs, and the Ctrl-C report.

The bar is drawn only when stderr is a terminal (so pipes, CI logs and
redirected output never see it) and disappears when done.  It is not drawn when
stdout is a pipe either (``kwinspect exchanges x.pcap | head``): the program
reading the pipe writes to the same terminal, between the bar's redraws, so the
bar could not tell which line to erase and would stay on screen.  Typical use in the
CLI::

    with Progress(total=total_bytes, description="reading capture.pcap") as bar:
        try:
            for item in source:
                ...
                bar.update(source.bytes_read, rows=writer.count)
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        print(interrupted_message(bar, {"exchanges": writer.count}), file=sys.stderr)
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import IO, Any


class Progress:
    """``update(completed)``/``advance(n)``; a no-op when disabled.

    ``total`` is in ``unit``s (bytes of input by default); None draws a
    spinner without a percentage.  Updates are cheap: the bar is redrawn at
    most ``refresh_per_second`` times, so calling ``update`` per packet is fine.
    """

    def __init__(
        self,
        total: int | None = None,
        description: str = "reading",
        *,
        enabled: bool | None = None,
        stream: IO[str] | None = None,
        unit: str = "bytes",
        refresh_per_second: float = 8,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty() and not _stdout_is_a_pipe()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self.total = total
        self.unit = unit
        self.completed = 0
        self.rows = 0
        self.description = description
        self._min_interval = 1.0 / refresh_per_second
        self._last = 0.0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            size_col = DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn()
            self._progress = RichProgress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TaskProgressColumn(),
                size_col,
                TextColumn("{task.fields[rows]:,} rows"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream, highlight=False),
                transient=True,
                auto_refresh=True,
                refresh_per_second=4,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, rows=0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.completed, rows=self.rows)
            self._progress.stop()
            self._progress = None

    def update(self, completed: int | None = None, *, rows: int | None = None,
               advance: int = 0) -> None:
        if completed is not None:
            self.completed = completed
        self.completed += advance
        if rows is not None:
            self.rows = rows
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last >= self._min_interval:
            self._last = now
            self._progress.update(self._task, completed=self.completed, rows=self.rows)

    def advance(self, n: int = 1) -> None:
        self.update(advance=n)

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.completed / self.total)


def _stdout_is_a_pipe() -> bool:
    """True when stdout feeds another program (a pipe or socket) rather than a terminal or file."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # replaced by a StringIO, closed, ...
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def interrupted_message(progress: Progress | None, counts: dict[str, int]) -> str:
    """One line for stderr after Ctrl-C: what was written, how far the input got.

    >>> interrupted_message(None, {"exchanges": 1200, "errors": 3})
    'interrupted: wrote 1,200 exchanges, 3 errors (output is complete up to there)'
    """
    parts = ", ".join(f"{n:,} {what}" for what, n in counts.items()) or "nothing"
    where = ""
    if progress is not None:
        frac = progress.fraction
        if frac is not None:
            where = f" after {frac:.0%} of the input"
        elif progress.completed:
            where = f" after {progress.completed:,} {progress.unit} of input"
    return f"interrupted{where}: wrote {parts} (output is complete up to there)"


__all__ = ["Progress", "interrupted_message"]
