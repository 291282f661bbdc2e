"""Entry point of the indexing process: ``python -m kwinspect.tui.index_proc``.

Reads ``(paths, config, spill_path)`` pickled on stdin, runs
:func:`kwinspect.tui.indexer.index_process_main`, and writes its messages to
stdout as length-prefixed pickles.  The app started this process itself and
trusts it; nothing here reads untrusted pickles.  Stray prints go to stderr.
"""

from __future__ import annotations

import gc
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


# Allocations between two young-generation collections in this process: twenty times the
# CLI's. What it keeps grows with the capture (the Diagnoser's tables, the dissector's
# last 10,000 closed connections), and every young collection scanned all of that still
# young: 4% of its CPU on a capture of 17k connections, for about one cyclic object in a
# thousand exchanges (cycles are still collected, a million allocations later).
GEN0_THRESHOLD = 1_000_000


def tune_collector() -> None:
    """The collector thresholds of the indexing process (core.tune_collector's, the young
    generation's raised)."""
    core.tune_collector()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


class _NeverCancelled:
    @staticmethod
    def is_set() -> bool:
        return False  # the app ends this process by terminating it


def main() -> int:
    tune_collector()
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
