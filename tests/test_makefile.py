"""`make demo` installs kwinspect alone; `make test` the dev set, whichever ran first.

`make -n` (dry run) with VENV pointed at a scratch directory: nothing is built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def _dry_run(target: str, venv: Path) -> str:
    return subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"], capture_output=True,
                          text=True, check=True, timeout=60).stdout


def _fake_venv(venv: Path, *stamps: str) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    for stamp in stamps:
        (venv / stamp).touch()  # newer than pyproject.toml


def test_demo_on_a_fresh_clone_installs_kwinspect_without_the_dev_set(tmp_path):
    out = _dry_run("demo", tmp_path / "venv")
    assert "-m venv" in out and "pip install -q -e .\n" in out
    assert "[dev]" not in out and "kwinspect summary" in out


def test_test_on_a_fresh_clone_installs_the_dev_set(tmp_path):
    out = _dry_run("test", tmp_path / "venv")
    assert "-m venv" in out and "pip install -q -e '.[dev]'" in out and "pytest" in out


def test_test_after_demo_still_installs_the_dev_set(tmp_path):
    venv = tmp_path / "venv"
    _fake_venv(venv, ".demo-stamp")
    out = _dry_run("test", venv)
    assert "-m venv" not in out and "pip install -q -e '.[dev]'" in out


def test_demo_after_test_installs_nothing(tmp_path):
    venv = tmp_path / "venv"
    _fake_venv(venv, ".demo-stamp", ".dev-stamp")
    out = _dry_run("demo", venv)
    assert "pip install" not in out and "kwinspect summary" in out


def test_jq_is_a_sysdep():
    assert "jq:jq" in (ROOT / "Makefile").read_text()


def test_java_is_a_sysdep():
    """Spark (tests/spark, the standalone cluster test among them) needs a JRE in CI."""
    assert "java:default-jre-headless" in (ROOT / "Makefile").read_text()


def test_license_is_an_spdx_string():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_a_changed_c_source_is_compiled_by_the_next_demo(tmp_path):
    venv = tmp_path / "venv"
    _fake_venv(venv, ".demo-stamp", ".dev-stamp")
    source = ROOT / "kwinspect" / "capture" / "_cpackets.c"
    older = source.stat().st_mtime - 60  # the install happened before the source changed
    for stamp in (".demo-stamp", ".dev-stamp"):
        os.utime(venv / stamp, (older, older))
    out = _dry_run("demo", venv)
    assert "pip install -q -e .\n" in out


def test_fuzz_asan_builds_with_asan_runs_the_c_targets_and_restores_the_build(tmp_path):
    venv = tmp_path / "venv"
    _fake_venv(venv, ".demo-stamp", ".dev-stamp")
    out = _dry_run("fuzz-asan", venv)
    asan_build, run, restore = out.index("-fsanitize=address"), out.index("bench/fuzz.py"), out.rindex(
        "build_ext --inplace --force")
    assert asan_build < run < restore
    assert "--targets pcap,dissect,core" in out and "halt_on_error=0" in out and "report" in out
