"""--ship-env: the running virtualenv, packed once, for the executors (PySpark's venv-pack way).

A cluster's executors run their own Python; kwinspect's native dependencies (pyarrow,
lz4, zstandard, crc32c, cryptography) are not on them.  PySpark's documented answer
is a packed environment in ``spark.archives`` (unpacked into each executor's working
directory) with ``PYSPARK_PYTHON`` pointing into it.  This module packs the virtualenv
the driver runs in with venv-pack and keeps the archive in a cache keyed by the
environment's installed distributions, so a second run does not pack again.

Left out of the archive: pyspark and py4j (executors import their own Spark's copies,
which Spark puts first on their PYTHONPATH; the jars are most of the environment's
size), pip and setuptools, test suites and C headers.  venv-pack does not copy the
interpreter: executors need the same Python (same minor version, same path) as the
driver's virtualenv was made from.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
from collections.abc import Callable

ALIAS = "kwinspect_env"  # the directory the archive is unpacked to on each executor
EXECUTOR_PYTHON = f"./{ALIAS}/bin/python"
_SITE = "lib/python*/site-packages/"
# what executors never import from the archive: the cluster's Spark brings pyspark and py4j
_EXCLUDE = tuple(_SITE + p for p in ("pyspark/*", "py4j/*", "pip/*", "setuptools/*", "*/tests/*",
                                     "pyarrow/include/*")) + ("*/__pycache__/*",)


class ShipEnvError(Exception):
    """The environment cannot be packed (not a virtualenv, editable installs, no venv-pack)."""


def cache_dir() -> str:
    base = os.environ.get("KWINSPECT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kwinspect")
    return os.path.join(base, "envs")


def _fingerprint(prefix: str) -> str:
    """Changes when a distribution is installed, removed or reinstalled in the environment."""
    h = hashlib.sha256(f"{prefix}\0{sys.version}".encode())
    for site in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        entries = glob.glob(os.path.join(site, "*.dist-info")) + glob.glob(os.path.join(site, "*.pth"))
        for path in sorted(entries):
            record = os.path.join(path, "RECORD") if os.path.isdir(path) else path
            try:
                st = os.stat(record)
            except OSError:
                continue
            h.update(f"{os.path.basename(path)}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    return h.hexdigest()


def packed_env(log: Callable[[str], None] | None = None) -> str:
    """The path of a venv-pack archive of the running virtualenv (packed now or cached)."""
    prefix = os.path.realpath(sys.prefix)
    if prefix == os.path.realpath(sys.base_prefix):
        raise ShipEnvError("--ship-env packs the virtualenv kwinspect runs in, and this Python "
                           f"({sys.executable}) is not in one; create one with `python3 -m venv`")
    try:
        import venv_pack
    except ImportError:
        raise ShipEnvError("--ship-env needs venv-pack (pip install 'kwinspect[spark]')") from None
    folder = cache_dir()
    tag = hashlib.sha256(prefix.encode()).hexdigest()[:10]
    path = os.path.join(folder, f"env-{tag}-{_fingerprint(prefix)[:16]}.tar.gz")
    if os.path.isfile(path):
        if log:
            log(f"--ship-env: packed environment from the cache ({os.path.getsize(path) / 1e6:.0f} MB)")
        return path
    os.makedirs(folder, exist_ok=True)
    if log:
        log(f"--ship-env: packing {prefix} (once; cached in {folder})")
    tmp = f"{path}.{os.getpid()}.tmp.tar.gz"
    try:
        venv_pack.pack(prefix, output=tmp, compress_level=1, force=True,
                       filters=[("exclude", p) for p in _EXCLUDE])
    except venv_pack.VenvPackException as exc:
        lines = str(exc).strip().splitlines()
        raise ShipEnvError(f"--ship-env cannot pack {prefix}: {' '.join(x.strip() for x in lines)}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    for old in glob.glob(os.path.join(folder, f"env-{tag}-*.tar.gz")):  # earlier states of this env
        if old != path and not old.endswith(".tmp.tar.gz"):
            try:
                os.remove(old)
            except OSError:
                pass
    return path
