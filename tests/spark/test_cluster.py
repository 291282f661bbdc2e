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


def kwinspect(bin_dir: Path, *args, cache: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    # SPARK_LOCAL_IP: the driver listens on loopback too, like the cluster
    env = clean_env(bin_dir, KWINSPECT_CACHE_DIR=str(cache), SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run([str(bin_dir / "kwinspect"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cache.parent)


def test_without_ship_env_the_bare_workers_fail(driver, cluster, tmp_path):
    """What a cluster without kwinspect's dependencies does today: the first task fails."""
    res = kwinspect(driver, "pipeline", CAPTURES / OTHER, "-o", tmp_path / "out", "--master", cluster.url,
                    *EXECUTOR_CONF, cache=tmp_path / "cache")
    assert res.returncode != 0
    assert "ModuleNotFoundError: No module named 'pyarrow'" in res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_ship_env_tables_equal_single_process(driver, cluster, captures, tmp_path):
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    apps = cluster.completed_apps()
    res = kwinspect(driver, "pipeline", *captures, "-o", out, "--records", "--master", cluster.url,
                    "--ship-env", *EXECUTOR_CONF, cache=cache)
    assert res.returncode == 0, res.stderr[-4000:] + cluster.log_tail(2000)
    assert "--ship-env: packing" in res.stderr
    # it ran on the cluster, whose executors unpacked the environment in their work dirs
    assert cluster.completed_apps() == apps + 1
    assert glob.glob(str(cluster.workdir / "worker*" / "app-*" / "*" / "kwinspect_env" / "bin" / "python"))
    for table in ("exchanges", "records", "errors"):
        expected = tmp_path / f"{table}.parquet"
        single = kwinspect(driver, table, *captures, "-F", "parquet", "-o", expected, cache=cache)
        assert single.returncode == 0, single.stderr
        ok, message = compare(str(expected), str(out), table)
        assert ok, message

    # a second run packs nothing: the archive of this environment comes from the cache
    archives = sorted((cache / "envs").iterdir())
    assert len(archives) == 1 and archives[0].name.endswith(".tar.gz"), archives
    stamp = archives[0].stat().st_mtime_ns
    again = subprocess.run([str(driver / "python"), "-c", "from kwinspect.spark.shipenv import packed_env\n"
                            "print(packed_env(print))"], capture_output=True, text=True, timeout=120,
                           env=clean_env(driver, KWINSPECT_CACHE_DIR=str(cache)))
    assert again.returncode == 0, again.stderr
    assert "from the cache" in again.stdout and "packing" not in again.stdout, again.stdout
    assert again.stdout.strip().splitlines()[-1] == str(archives[0])
    assert sorted((cache / "envs").iterdir()) == archives and archives[0].stat().st_mtime_ns == stamp


def test_ship_env_refuses_a_python_outside_a_virtualenv(tmp_path):
    """Not a venv: one line that says what to do (no Spark needed to get there)."""
    code = ("import sys; from kwinspect.spark.shipenv import packed_env, ShipEnvError\n"
            "try:\n    packed_env()\nexcept ShipEnvError as e:\n    print(e)")
    base = getattr(sys, "_base_executable", sys.executable)
    res = subprocess.run([base, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert "not in one" in res.stdout and "python3 -m venv" in res.stdout, res.stdout + res.stderr
