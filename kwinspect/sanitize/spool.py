"""Disk spools: what sanitize must see again later is kept in temporary files, not memory.

``Spool`` is an append-only temporary file: ``add(data) -> position`` and
``read(position, length)``.  Sanitize keeps in them the Kafka frames the
dissector found, the frames they become, and the TCP payloads of the input, so
its memory holds only positions and lengths (arrays of integers), never the
capture's bytes.  ``spool_stdin`` copies standard input to a file, so ``-`` can
be read twice.

The files live in a private temporary directory (``TMPDIR``, else the system's)
and are removed when sanitize ends, whatever way it ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import IO

COPY_CHUNK = 1 << 20


class Spool:
    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, name)
        self.f: IO[bytes] = open(self.path, "w+b")  # noqa: SIM115 - closed by close()
        self.size = 0
        self._writing = True

    def add(self, data: bytes) -> int:
        if not self._writing:
            self.f.seek(0, os.SEEK_END)
            self._writing = True
        at = self.size
        self.f.write(data)
        self.size += len(data)
        return at

    def read(self, position: int, length: int) -> bytes:
        self._writing = False
        self.f.seek(position)
        return self.f.read(length)

    def close(self) -> None:
        self.f.close()


def spool_stdin(directory: str, stdin: IO[bytes]) -> str:
    """Standard input copied to a file in ``directory``; its path."""
    path = os.path.join(directory, "stdin.pcap")
    with open(path, "wb") as f:
        shutil.copyfileobj(stdin, f, COPY_CHUNK)
    return path


def temporary_directory() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="kwinspect-sanitize-")
