"""The committed schema tables are exactly what the generator makes from upstream's JSON."""

import json
import re
from pathlib import Path

import pytest

from kwinspect.protocol.schema import build
from kwinspect.protocol.schema.index import APIS

JSON_ROOT = build.DEFAULT_JSON_ROOT
needs_json = pytest.mark.skipif(
    not JSON_ROOT.is_dir(), reason=f"upstream message definitions not found at {JSON_ROOT}"
)


@needs_json
def test_regenerating_gives_the_committed_files(tmp_path):
    assert build.main(["--out", str(tmp_path)]) == 0
    committed = Path(build.__file__).parent
    generated = sorted(p.name for p in tmp_path.glob("*.py"))
    assert generated, "generator wrote nothing"
    for name in generated:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"{name} is stale: run make schema"
    # and no stale module is left behind in the package
    assert sorted(p.name for p in committed.glob("api_*.py")) == [n for n in generated if n.startswith("api_")]


def _upstream_versions():
    """(api key -> set of versions) read straight from the JSON, independent of the generator."""
    seen: dict[int, set[int]] = {}
    for path in JSON_ROOT.glob("*/*Request.json"):
        doc = json.loads(re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.M))
        if doc.get("type") != "request":
            continue
        spec = doc["validVersions"]
        if spec == "none":  # an api upstream has withdrawn in that release
            continue
        lo, _, hi = spec.partition("-")
        seen.setdefault(doc["apiKey"], set()).update(range(int(lo), int(hi or lo) + 1))
    return seen


@needs_json
def test_every_api_key_and_version_upstream_defines_is_covered():
    upstream = _upstream_versions()
    assert set(upstream) == set(range(91))
    for key, versions in upstream.items():
        name, lo, hi = APIS[key]
        assert (lo, hi) == (min(versions), max(versions)), name


def test_coverage_named_in_the_issue():
    expected = {0: ("Produce", 0, 13), 1: ("Fetch", 0, 18), 3: ("Metadata", 0, 13),
                2: ("ListOffsets", 0, 11), 4: ("LeaderAndIsr", 0, 7)}
    for key, row in expected.items():
        assert APIS[key] == row


def test_snake_case_follows_the_contract():
    assert build.snake_case("TopicData") == "topic_data"
    assert build.snake_case("ThrottleTimeMs") == "throttle_time_ms"
    assert build.snake_case("ClusterId") == "cluster_id"
    assert build.snake_case("leaderEpoch") == "leader_epoch"
