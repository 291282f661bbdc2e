"""Run a command and report its peak RSS alone (a fresh parent whose only child it is:
getrusage(RUSAGE_CHILDREN) of the test process would include every earlier child)."""

from __future__ import annotations

import subprocess
import sys

_WRAP = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], stdout=sys.stdout, stderr=sys.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(p.returncode)\n"
)


def run_with_peak(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, int]:
    """(the finished process, with its own stderr; its peak RSS in MiB)."""
    proc = subprocess.run([sys.executable, "-c", _WRAP, *cmd], capture_output=True, text=True, **kw)
    lines = proc.stderr.rstrip("\n").split("\n")
    peak_kib = int(lines[-1])
    proc.stderr = "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "")
    return proc, peak_kib >> 10
