"""Child processes of the rig die with the process that started them."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

_PR_SET_PDEATHSIG = 1

# Resolved at import, not in the forked child: the rig's process runs librdkafka
# threads, and the child of a threaded fork must not dlopen or take locks.
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent() -> None:
    """preexec_fn for Popen: SIGTERM the child when its parent goes away (Linux).

    Keeps tcpdump and tansu from outliving a test run that was killed hard.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
