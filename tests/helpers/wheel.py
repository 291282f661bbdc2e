"""Build kwinspect's wheel the way a release would, and fresh venvs that install it.

The wheel is built (`pip wheel . --no-deps`) from a clean copy of the repository (a
stale build/ in the work tree could leak old files into it).  Without setuptools>=77
in this interpreter (pyproject's build requirement) the build runs with build
isolation, which needs the package index.  Anything that needs the index and cannot
reach it skips, as the rest of the suite does offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS_MIN = 77  # [build-system] requires in pyproject.toml
# Not needed to build, and large or machine-made: left out of the copy.
_SKIP = {".git", ".venv", "build", "dist", "captures", "bench/data", "bench/out",
         "spark-warehouse", "metastore_db"}
# What pip prints when it cannot reach the package index.
OFFLINE = ("Could not find a version that satisfies", "No matching distribution found",
           "Failed to establish a new connection", "Network is unreachable",
           "Temporary failure in name resolution", "Could not fetch URL")
PIP_QUIET = ["--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30"]


def setuptools_new_enough() -> bool:
    try:
        major = version("setuptools").split(".")[0]
    except PackageNotFoundError:
        return False
    return major.isdigit() and int(major) >= SETUPTOOLS_MIN


def copy_ignore(folder: str, names: list[str]) -> set[str]:
    rel = Path(folder).relative_to(ROOT)
    return {n for n in names
            if (rel / n).as_posix() in _SKIP or n == "__pycache__" or n.endswith((".egg-info", "_cache"))
            or n == ".hypothesis"}


def _skip_if_offline(res: subprocess.CompletedProcess, what: str) -> None:
    text = res.stdout + res.stderr
    if res.returncode != 0 and ("No module named pip" in text or any(s in text for s in OFFLINE)):
        pytest.skip(f"{what} needs the package index, which cannot be reached:\n{text[-2000:]}")


def build_wheel(tmp: Path) -> Path:
    """kwinspect-*.whl built from a clean copy of the repository into tmp/out."""
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(ROOT, src, ignore=copy_ignore)
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(out), *PIP_QUIET]
    if setuptools_new_enough():
        cmd.append("--no-build-isolation")
    try:
        # the compiled core without the build directory's (temporary) path in it: the same
        # sources make the same wheel, so a cache keyed by contents (--ship-env's) hits
        cflags = f"{os.environ.get('CFLAGS', '')} -ffile-prefix-map={src}=kwinspect".strip()
        res = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PIP_NO_INPUT": "1", "CFLAGS": cflags})
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot build a wheel here: {exc}")
    _skip_if_offline(res, "building the wheel")
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    wheels = sorted(out.glob("kwinspect-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def system_python() -> str:
    """The system's python3 (what a user's `python3 -m venv` uses), not this test venv's."""
    exe = shutil.which("python3", path=os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep)
        if not (Path(p) / "activate").exists()))  # skip an activated venv's bin/
    return exe or sys.executable


def venv_with(wheel: Path, extra: str | None, dest: Path) -> Path:
    """A fresh `python3 -m venv` at dest with the wheel (and only `extra`) installed; its bin/."""
    res = subprocess.run([system_python(), "-m", "venv", str(dest)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    bin_dir = dest / "bin"
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    # PYTHONPATH and a virtualenv of ours must not leak into the new environment
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    # --no-compile: byte-compiling every installed module (pyspark's thousands) is half of
    # the install's CPU; a user's first run compiles only what it imports
    res = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile", spec, *PIP_QUIET],
                         capture_output=True, text=True, timeout=900, env=env)
    _skip_if_offline(res, f"installing kwinspect[{extra}]")
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return bin_dir


def clean_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment to run a tool of a test venv in: its bin/ first, nothing of ours."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                        "SPARK_HOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env.update(extra)
    return env
