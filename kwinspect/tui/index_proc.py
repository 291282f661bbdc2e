"""Entry point of the indexing process: ``python -m kwinspect.tui.index_proc``.

Reads ``(paths, config, spill_path)`` pickled on stdin, runs
:func:`kwinspect.tui.indexer.index_process_main`, and writes its messages to
stdout as length-prefixed pickles.  The app started this process itself and
trusts it; nothing here reads untrusted pickles.  Stray prints go to stderr.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

from kwinspect import core


class _Writer:
    def __init__(self, fd: int) -> None:
        self.out = os.fdopen(fd, "wb")

    def send(self, obj: object) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.out.write(struct.pack("!I", len(data)) + data)
        self.out.flush()


class _NeverCancelled:
    @staticmethod
    def is_set() -> bool:
        return False  # the app ends this process by terminating it


def main() -> int:
    core.tune_collector()  # as the CLI does
    paths, config, spill_path = pickle.load(sys.stdin.buffer)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # keep the message channel clean
    from kwinspect.tui.indexer import index_process_main

    try:
        index_process_main(paths, config, spill_path, _Writer(out_fd), _NeverCancelled())
    except BrokenPipeError:
        return 0  # the app went away
    return 0


if __name__ == "__main__":
    sys.exit(main())
