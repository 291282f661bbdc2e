"""The wheel ships the product only: kwinspect/, never the rig, the generator, tests or bench.

Builds the wheel the way a release would (tests/helpers/wheel.py: `pip wheel . --no-deps`
from a clean copy of the repository) and reads its file list; skipped when the build
needs the package index and it cannot be reached.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.helpers.wheel import ROOT, build_wheel


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
