"""A real Spark standalone cluster on loopback: one master, workers with their own Python.

Started from a pyspark installation's own launcher (`bin/spark-class` with the
standalone Master and Worker classes), each process in its own session so it can be
stopped with everything it started (executors included).  The workers run the
Python given to them (the system's bare python3 in the tests): whatever kwinspect
needs there must come with the job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT = 120.0  # seconds: JVM start-up on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    url: str
    webui: str
    workdir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as r:
            return json.load(r)

    def completed_apps(self) -> int:
        return len(self.status().get("completedapps", []))

    def log_tail(self, n: int = 4000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}" for p in self.logs if p.exists())

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first (they stop their executors), then the master
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def start_cluster(spark_home: Path, workdir: Path, worker_python: str, workers: int = 2,
                  cores: int = 1, memory: str = "1g") -> Cluster:
    """A master and `workers` workers on 127.0.0.1, registered and ready; stop() ends them."""
    port, webui = free_port(), free_port()
    cluster = Cluster(url=f"spark://127.0.0.1:{port}", webui=f"http://127.0.0.1:{webui}", workdir=workdir)
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    base_env.update(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(workdir),
                    SPARK_NO_DAEMONIZE="1")

    def launch(name: str, args: list[str], env: dict[str, str]) -> None:
        log = workdir / f"{name}.log"
        cluster.logs.append(log)
        with open(log, "wb") as out:
            cluster.procs.append(subprocess.Popen(
                [str(spark_home / "bin" / "spark-class"), *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, cwd=workdir, start_new_session=True))

    try:
        launch("master", [MASTER, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)],
               base_env)
        # executors inherit the worker's environment: `python3` and PYSPARK_PYTHON are the bare one
        worker_env = {**base_env, "PYSPARK_PYTHON": worker_python,
                      "PATH": os.pathsep.join([str(Path(worker_python).parent), "/usr/bin", "/bin"])}
        for i in range(workers):
            wdir = workdir / f"worker{i}"
            wdir.mkdir()
            launch(f"worker{i}", [WORKER, cluster.url, "--host", "127.0.0.1", "--cores", str(cores),
                                  "--memory", memory, "--webui-port", str(free_port()),
                                  "--work-dir", str(wdir)], worker_env)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            alive = 0
            with suppress(OSError, ValueError):
                alive = sum(1 for w in cluster.status().get("workers", []) if w.get("state") == "ALIVE")
            if alive == workers:
                return cluster
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
                raise RuntimeError(f"the standalone cluster did not start ({alive} workers alive):\n"
                                   + cluster.log_tail())
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
