"""The helper processes of ``--jobs`` (the reader and the workers) end with the process
that started them.

They are forked with ``daemon=True``, which only helps when the main process exits
normally: killed (SIGKILL, or SIGTERM with no handler), it left them running until
their pipes broke. On Linux each asks the kernel to kill it when its parent dies
(``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing changes. The parent is the thread that
forked them, so they must be started from a thread that outlives them (the main
thread, as the CLI does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Called first thing in a forked helper: SIGKILL it when its parent dies, and exit at
    once if the parent (``parent_pid``, the pid before the fork) is already gone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the pipes end it, as before
        return
    if os.getppid() != parent_pid:  # the parent died between the fork and the prctl
        os._exit(1)
