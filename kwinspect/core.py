"""Which core runs: the compiled extension modules, or the pure-Python reference.

The hot paths have two implementations: Python (the reference, always there) and C
extension modules built by ``pip install`` / ``make demo`` where a compiler and the
Python headers are found (setup.py; without them the install still succeeds and
the Python path runs). Each accelerated module asks ``load()`` for its extension
through its own facade (``capture/fastpath.py``, ``protocol/compiled.py``,
``stream/labels.py``, ``stream/conversation.py``, ``export/fastrender.py``) and falls
back to its Python code when it gets None. ``KWINSPECT_PURE=1`` forces the Python path everywhere
(the equality tests run both paths this way, in one process, through the facades).

Stdlib only: the bottom layer, importable from every other one.
"""

from __future__ import annotations

import gc
import importlib
import os
from types import ModuleType

PURE_ENV = "KWINSPECT_PURE"
# Every extension module setup.py builds (tests/test_core.py checks the two lists agree).
EXTENSIONS = ("kwinspect.capture._cpackets", "kwinspect.protocol._cdecode", "kwinspect.stream._clabels",
              "kwinspect.stream._cconv", "kwinspect.export._crender", "kwinspect._cdriver",
              "kwinspect.analyze._crows", "kwinspect.run._csplit", "kwinspect.capture._cstreams")


def pure_requested() -> bool:
    """KWINSPECT_PURE is set to something other than "" or "0"."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The extension module ``name`` (one of EXTENSIONS), or None when it is not built or
    the pure-Python core is requested."""
    if pure_requested():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def core_name() -> str:
    """"compiled" when every extension module loads (and none is refused), else "python"."""
    return "compiled" if all(load(name) is not None for name in EXTENSIONS) else "python"


def describe() -> str:
    """One line for ``kwinspect --version``: which core, and why when it is the Python one."""
    if pure_requested():
        return f"core: python ({PURE_ENV} is set)"
    if core_name() == "compiled":
        return "core: compiled"
    return "core: python (the compiled extension is not built: no C compiler at install time?)"


# allocations between two young-generation collections for a decoding process (CPython: 700)
GC_GEN0_THRESHOLD = 50_000


def tune_collector() -> None:
    """The collector thresholds of a process that decodes captures (the CLI, the TUI's
    indexing process). Decoding makes millions of short-lived, acyclic dicts and lists
    that reference counting frees; the default thresholds rescan them (and the rows and
    connections held) thousands of times: ~8% of a CLI run, 19% of the TUI's indexing on
    a capture of 108k connections. Cycles are still collected."""
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 100)
