"""The pipeline on a real Spark standalone cluster whose workers run the system's bare Python.

A master and two workers (one core, 1 GiB each) are started from the pyspark
installation of a fresh `pip install kwinspect[spark]` venv (the driver), on
loopback.  The workers' Python has neither kwinspect nor pyarrow: without
--ship-env the job fails the way a real cluster does (ModuleNotFoundError); with it
the executors run the driver's packed virtualenv and the tables equal, row for row,
`kwinspect exchanges|records|errors -F parquet` of the same files read as one
capture (a capture rotated into four files in the middle of its connections, a
pcapng, and one more file).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dpkt
import pytest

from rig.spark_cluster import start_cluster
from tests.helpers.wheel import clean_env
from tests.spark.compare import compare

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("extra-venvs")]

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
ROTATED = "netns-mtu1500-produce-consume.pcap"
PCAPNG = "kafka-python-mock-group.pcap"
OTHER = "confluent-mock-produce-consume.pcap"
PIECES = 4
# small executors: two of them, a driver, a master and two workers share a 2-core CI box
EXECUTOR_CONF = ["--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
                 "--conf", "spark.task.maxFailures=1"]
# --ship-env's archives, kept across test runs (keyed by the environment's contents, so a
# run with the same wheel and dependencies reuses the archive instead of packing 100 MB)
ENV_CACHE = Path(os.environ.get("KWINSPECT_TEST_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kwinspect-tests")
BARE_APP = "kwinspect-bare-workers"


def _bare_worker_python(driver_bin: Path, tmp: Path) -> str:
    """The system's /usr/bin/python3 when it is the driver's Python version (PySpark wants the
    same minor version on both sides), else a bare venv of the system python3."""
    want = subprocess.run([str(driver_bin / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout
    for exe in ("/usr/bin/python3",):
        if os.access(exe, os.X_OK) and subprocess.run(
                [exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                text=True).stdout == want:
            return exe
    bare = tmp / "bare-python"
    subprocess.run([str(driver_bin / "python"), "-m", "venv", "--without-pip", str(bare)], check=True)
    return str(bare / "bin" / "python")


@pytest.fixture(scope="module")
def driver(extra_venv):
    bin_dir = extra_venv("spark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the cluster test needs Java (a JDK 17+ on PATH or JAVA_HOME)")
    return bin_dir


@pytest.fixture(scope="module")
def cluster(driver, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    worker_python = _bare_worker_python(driver, tmp)
    # the precondition that makes the test mean something: the workers' Python lacks kwinspect's deps
    probe = subprocess.run([worker_python, "-c", "import pyarrow"], capture_output=True, text=True, cwd=tmp)
    assert probe.returncode != 0, f"{worker_python} has pyarrow: not a bare worker"
    site = subprocess.run([str(driver / "python"), "-c", "import pyspark, os; print(os.path.dirname("
                           "pyspark.__file__))"], capture_output=True, text=True, check=True).stdout.strip()
    c = start_cluster(Path(site), tmp, worker_python, workers=2, cores=1, memory="1g")
    try:
        yield c
    finally:
        c.stop()


def _packets(path: Path):
    with open(path, "rb") as f:
        r = dpkt.pcap.Reader(f)
        return r.datalink(), r.snaplen, [(ts, bytes(buf)) for ts, buf in r]


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> list[str]:
    """A capture rotated into four files mid-connection, a pcapng and a pcap: one capture."""
    d = tmp_path_factory.mktemp("rotated")
    linktype, snaplen, pkts = _packets(CAPTURES / ROTATED)
    cut = [len(pkts) * i // PIECES for i in range(PIECES + 1)]
    paths = []
    for k in range(PIECES):
        piece = d / f"{ROTATED}.rot{k:02d}.pcap"
        with open(piece, "wb") as f:
            w = dpkt.pcap.Writer(f, snaplen=snaplen, linktype=linktype)
            for ts, buf in pkts[cut[k]:cut[k + 1]]:
                w.writepkt(buf, ts=ts)
        paths.append(str(piece))
    linktype, _snaplen, pkts = _packets(CAPTURES / PCAPNG)
    with open(d / (PCAPNG + "ng"), "wb") as f:
        w = dpkt.pcapng.Writer(f, snaplen=262144, linktype=linktype)
        for ts, buf in pkts:
            w.writepkt(buf, ts=ts)
    paths.append(str(d / (PCAPNG + "ng")))
    shutil.copy(CAPTURES / OTHER, d / OTHER)
    paths.append(str(d / OTHER))
    return sorted(paths)


def _env(bin_dir: Path, cache: Path) -> dict[str, str]:
    # SPARK_LOCAL_IP: the driver listens on loopback too, like the cluster
    return clean_env(bin_dir, KWINSPECT_CACHE_DIR=str(cache), SPARK_LOCAL_IP="127.0.0.1")


def kwinspect(bin_dir: Path, *args, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "kwinspect"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env(bin_dir, ENV_CACHE), cwd=cwd)


@pytest.fixture(scope="module")
def bare_run(driver, cluster, tmp_path_factory):
    """`kwinspect pipeline` without --ship-env on the bare workers, started in the background
    with one core (cluster-wide), so it runs beside the --ship-env job instead of before it
    (the standalone master gives the --ship-env job the other worker's core, and this one's
    when it has failed). Yields (the process, its output directory)."""
    tmp = tmp_path_factory.mktemp("bare")
    proc = subprocess.Popen([str(driver / "kwinspect"), "pipeline", str(CAPTURES / OTHER), "-o", str(tmp / "out"),
                             "--master", cluster.url, *EXECUTOR_CONF, "--conf", "spark.cores.max=1",
                             "--conf", f"spark.app.name={BARE_APP}", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(driver, ENV_CACHE), cwd=tmp)
    try:
        yield proc, tmp / "out"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _completed(cluster, name: str) -> int:
    return sum(1 for a in cluster.status().get("completedapps", []) if a.get("name") == name)


def test_ship_env_tables_equal_single_process(driver, cluster, captures, bare_run, tmp_path):
    out = tmp_path / "out"
    apps = _completed(cluster, "kwinspect pipeline")
    res = kwinspect(driver, "pipeline", *captures, "-o", out, "--records", "--master", cluster.url,
                    "--ship-env", *EXECUTOR_CONF, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:] + cluster.log_tail(2000)
    # packed now, or by an earlier run of this same environment
    assert "--ship-env: packing" in res.stderr or "--ship-env: packed environment from the cache" in res.stderr
    # it ran on the cluster, whose executors unpacked the environment in their work dirs
    assert _completed(cluster, "kwinspect pipeline") == apps + 1
    assert glob.glob(str(cluster.workdir / "worker*" / "app-*" / "*" / "kwinspect_env" / "bin" / "python"))
    for table in ("exchanges", "records", "errors"):
        expected = tmp_path / f"{table}.parquet"
        single = kwinspect(driver, table, *captures, "-F", "parquet", "-o", expected, cwd=tmp_path)
        assert single.returncode == 0, single.stderr
        ok, message = compare(str(expected), str(out), table)
        assert ok, message

    # a second run packs nothing: the archive of this environment comes from the cache
    def packed() -> subprocess.CompletedProcess:
        return subprocess.run([str(driver / "python"), "-c", "from kwinspect.spark.shipenv import packed_env\n"
                               "print(packed_env(print))"], capture_output=True, text=True, timeout=300,
                              env=_env(driver, ENV_CACHE))

    first = packed()
    assert first.returncode == 0, first.stderr
    archive = Path(first.stdout.strip().splitlines()[-1])
    assert archive.parent == ENV_CACHE / "envs" and archive.name.endswith(".tar.gz"), archive
    inode = archive.stat().st_ino
    again = packed()
    assert again.returncode == 0, again.stderr
    assert "from the cache" in again.stdout and "packing" not in again.stdout, again.stdout
    assert again.stdout.strip().splitlines()[-1] == str(archive)
    assert archive.stat().st_ino == inode  # the same file, not packed again


def test_without_ship_env_the_bare_workers_fail(cluster, bare_run):
    """What a cluster without kwinspect's dependencies does today: the first task fails."""
    proc, out = bare_run
    _stdout, stderr = proc.communicate(timeout=1800)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'pyarrow'" in stderr, stderr[-3000:]
    assert not out.exists()
    assert _completed(cluster, BARE_APP) == 1  # it ran on the cluster (and ended)


def test_ship_env_refuses_a_python_outside_a_virtualenv(tmp_path):
    """Not a venv: one line that says what to do (no Spark needed to get there)."""
    code = ("import sys; from kwinspect.spark.shipenv import packed_env, ShipEnvError\n"
            "try:\n    packed_env()\nexcept ShipEnvError as e:\n    print(e)")
    base = getattr(sys, "_base_executable", sys.executable)
    res = subprocess.run([base, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert "not in one" in res.stdout and "python3 -m venv" in res.stdout, res.stdout + res.stderr
