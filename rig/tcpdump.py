"""Start and stop tcpdump around a scenario so the pcap holds complete traffic.

`tcpdump -i lo -U --immediate-mode -w FILE 'tcp port P or ...'`:
- `--immediate-mode` hands packets over as they arrive (without it the last
  second of traffic can be lost when we stop),
- `-U` flushes the file after every packet,
- we wait for tcpdump's "listening on" line (printed after the filter is
  attached) before the caller starts any traffic, and stop it with SIGINT after
  a short drain so the FIN/ACK of the last connection is in the file.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence

from rig._proc import die_with_parent

_STATS = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")


class TcpdumpError(RuntimeError):
    pass


def tcpdump_path() -> str | None:
    for cand in (shutil.which("tcpdump"), "/usr/bin/tcpdump", "/usr/sbin/tcpdump"):
        if cand and os.path.exists(cand):
            return cand
    return None


def tcpdump_version() -> str:
    path = tcpdump_path()
    if not path:
        return "unavailable"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    first = (out.stdout or out.stderr).splitlines()
    return first[0].strip() if first else "unknown"


def port_filter(ports: Iterable[int]) -> str:
    return " or ".join(f"tcp port {int(p)}" for p in sorted(set(ports)))


class Tcpdump:
    """One running capture.  Use as a context manager or start()/stop().

    `prefix` runs tcpdump through another command (e.g. `ip netns exec NS`).
    """

    def __init__(
        self,
        path: str,
        ports: Iterable[int],
        *,
        interface: str = "lo",
        prefix: Sequence[str] = (),
        snaplen: int = 262144,
        buffer_kib: int = 65536,
        start_timeout: float = 10.0,
    ) -> None:
        self.path = str(path)
        self.ports = sorted(set(int(p) for p in ports))
        if not self.ports:
            raise ValueError("tcpdump needs at least one port to filter on")
        self.interface = interface
        self.prefix = list(prefix)
        self.snaplen = snaplen
        self.buffer_kib = buffer_kib
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None
        self.stats: dict[str, int] = {}

    @property
    def filter(self) -> str:
        return port_filter(self.ports)

    def command(self) -> list[str]:
        exe = tcpdump_path()
        if exe is None:
            raise TcpdumpError("tcpdump is not installed (make sysdeps installs it)")
        # -B: libpcap sizes ring-buffer frames by the snap length (256 KiB here, as
        # loopback packets reach 64 KiB); the default 2 MiB buffer then holds only
        # 8 frames and bursts of small packets get dropped.  64 MiB holds 256.
        # -Z root: do not drop privileges, so the file can be written anywhere
        # root can write (pytest's tmp dirs are mode 0700).
        cmd = [*self.prefix, exe, "-i", self.interface, "-U", "--immediate-mode",
               "-B", str(self.buffer_kib), "-s", str(self.snaplen), "-n"]
        if os.geteuid() == 0:
            cmd += ["-Z", "root"]
        return [*cmd, "-w", self.path, self.filter]

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip("\n"))
            if "listening on" in line:
                self._listening.set()

    def start(self) -> Tcpdump:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # our signals only, not the test runner's Ctrl-C
            preexec_fn=die_with_parent,
        )
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._listening.wait(0.05):
                break
            if self.proc.poll() is not None:
                break
        if not self._listening.is_set():
            self._kill()
            raise TcpdumpError("tcpdump did not start: " + " | ".join(self._stderr[-5:]))
        # The file header is written once the handle is open; wait for it too.
        while time.monotonic() < deadline and not (
            os.path.exists(self.path) and os.path.getsize(self.path) >= 24
        ):
            time.sleep(0.01)
        time.sleep(0.1)  # the filter is attached; leave the kernel a moment
        return self

    def stop(self, drain: float = 0.3) -> dict[str, int]:
        """Let in-flight packets land, then stop with SIGINT; returns tcpdump's counters."""
        if self.proc is None:
            return self.stats
        if self.proc.poll() is None:
            time.sleep(drain)
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        if self._reader is not None:
            self._reader.join(timeout=5)
        for line in self._stderr:
            for m in _STATS.finditer(line):
                self.stats[m.group(2).replace(" ", "_")] = int(m.group(1))
        self.proc = None
        return self.stats

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    @property
    def stderr(self) -> list[str]:
        return list(self._stderr)

    def __enter__(self) -> Tcpdump:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
