"""The wheel ships the product only: kwinspect/, never the rig, the generator, tests or bench.

Builds the wheel the way a release would (tests/helpers/wheel.py: `pip wheel . --no-deps`
from a clean copy of the repository) and reads its file list; skipped when the build
needs the package index and it cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.wheel import OFFLINE, ROOT, build_wheel, copy_ignore, setuptools_new_enough


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_holds_kwinspect_and_its_metadata_only(wheel):
    tops = {name.split("/")[0] for name in _names(wheel)}
    dist_info = {t for t in tops if t.startswith("kwinspect-") and t.endswith(".dist-info")}
    assert len(dist_info) == 1 and tops == {"kwinspect"} | dist_info, sorted(tops)


def test_no_rig_generator_tests_or_bench_in_the_wheel(wheel):
    names = _names(wheel)
    for prefix in ("rig/", "codegen/", "tests/", "bench/", "kwinspect/testing/"):
        assert not [n for n in names if n.startswith(prefix)], prefix
    assert "kwinspect/protocol/schema/build.py" not in names


def test_the_wheel_has_every_module_of_the_product(wheel):
    names = set(_names(wheel))
    assert "kwinspect/protocol/schema/api_keys.py" in names
    assert "kwinspect/protocol/schema/index.py" in names
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kwinspect").rglob("*.py")
              if "__pycache__" not in p.parts}
    assert source <= names, sorted(source - names)


def test_the_wheel_carries_the_compiled_core_and_not_its_c_source(wheel):
    names = _names(wheel)
    from kwinspect.core import EXTENSIONS

    for module in (name.removeprefix("kwinspect.").replace(".", "/") for name in EXTENSIONS):
        assert [n for n in names if re.fullmatch(rf"kwinspect/{module}\.cpython-.*\.so", n)], (module, names)
    assert not [n for n in names if n.endswith((".c", ".h"))]


def test_without_a_compiler_the_install_succeeds_and_the_python_core_runs(tmp_path):
    """CC=/bin/false: setup.py warns, the wheel has no extension, and the installed package
    runs on its pure-Python core with the same output."""
    src, out, site = tmp_path / "src", tmp_path / "out", tmp_path / "site"
    shutil.copytree(ROOT, src, ignore=copy_ignore)
    for stale in src.rglob("*.so"):
        stale.unlink()
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false", "PIP_NO_INPUT": "1"}
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(out), "-v",
           "--disable-pip-version-check", "--no-input", "--retries", "0", "--timeout", "15"]
    if setuptools_new_enough():
        cmd.append("--no-build-isolation")
    res = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=600, env=env)
    text = res.stdout + res.stderr
    if res.returncode != 0 and any(s in text for s in OFFLINE):
        pytest.skip(f"cannot build a wheel offline:\n{text[-2000:]}")
    assert res.returncode == 0, text[-4000:]
    assert "could not be built" in text and "pure-Python core" in text
    (wheel,) = out.glob("kwinspect-*.whl")
    assert not [n for n in _names(wheel) if n.endswith(".so")]
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel),
                    "--disable-pip-version-check", "-q"], check=True, capture_output=True, timeout=300)
    run_env = {k: v for k, v in os.environ.items() if k != "KWINSPECT_PURE"}
    run_env["PYTHONPATH"] = str(site)
    version = subprocess.run([sys.executable, "-m", "kwinspect", "--version"], capture_output=True, text=True,
                             env=run_env, cwd=tmp_path, timeout=60, check=True).stdout
    assert "core: python (the compiled extension is not built" in version
    capture = ROOT / "captures" / "confluent-mock-produce-consume.pcap"
    installed = subprocess.run([sys.executable, "-m", "kwinspect", "exchanges", "-F", "jsonl", str(capture)],
                               capture_output=True, env=run_env, cwd=tmp_path, timeout=300, check=True).stdout
    here = subprocess.run([sys.executable, "-m", "kwinspect", "exchanges", "-F", "jsonl", str(capture)],
                          capture_output=True, env={**run_env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          timeout=300, check=True).stdout
    assert installed and installed == here
