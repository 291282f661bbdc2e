"""--ship-env: the running virtualenv, packed once, for the executors (PySpark's venv-pack way).

A cluster's executors run their own Python; kwinspect's native dependencies (pyarrow,
lz4, zstandard, crc32c, cryptography) are not on them.  PySpark's documented answer
is a packed environment in ``spark.archives`` (unpacked into each executor's working
directory) with ``PYSPARK_PYTHON`` pointing into it.  This module packs the virtualenv
the driver runs in with venv-pack and keeps the archive in a cache keyed by the
environment's contents (its installed files' hashes), so a second run, or another
virtualenv with the same installs, does not pack again.

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
import time
from collections.abc import Callable

ALIAS = "kwinspect_env"  # the directory the archive is unpacked to on each executor
EXECUTOR_PYTHON = f"./{ALIAS}/bin/python"
UNUSED_DAYS = 14  # a cached archive not used for this long is deleted when another is packed
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


def _fingerprint() -> str:
    """The environment's contents: the Python it runs on and every installed file's hash
    (the distributions' RECORD files), so two virtualenvs with the same installs share an
    archive, and an install, upgrade or removal makes a new one. Left out: what lies
    outside site-packages (console scripts, whose shebangs name the virtualenv's path,
    rewritten by venv-pack anyway) and pip's note of where a wheel came from."""
    h = hashlib.sha256(f"{sys.version}\0{os.path.realpath(sys._base_executable)}".encode())  # noqa: SLF001
    for site in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        entries = glob.glob(os.path.join(site, "*.dist-info")) + glob.glob(os.path.join(site, "*.pth"))
        for path in sorted(entries, key=os.path.basename):
            h.update(f"{os.path.basename(path)}\0".encode())
            try:
                if not os.path.isdir(path):
                    with open(path, "rb") as f:
                        h.update(f.read())
                    continue
                with open(os.path.join(path, "RECORD"), encoding="utf-8", errors="replace") as f:
                    lines = sorted(f.read().splitlines())
            except OSError:
                continue
            for line in lines:
                name = line.split(",", 1)[0]
                if name.startswith("../") or name.endswith(("direct_url.json", "/RECORD")):
                    continue
                h.update(f"{line}\n".encode())
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
    path = os.path.join(folder, f"env-{_fingerprint()[:24]}.tar.gz")
    if os.path.isfile(path):
        if log:
            log(f"--ship-env: packed environment from the cache ({os.path.getsize(path) / 1e6:.0f} MB)")
        os.utime(path)  # recently used: kept by the clean-up below
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
    # archives of environments not used for a while (an upgrade leaves the old one behind)
    for old in glob.glob(os.path.join(folder, "env-*.tar.gz")):
        try:
            if old != path and os.path.getmtime(old) < time.time() - UNUSED_DAYS * 86400:
                os.remove(old)
        except OSError:
            pass
    return path
