"""The committed schema tables are exactly what the generator makes from upstream's JSON."""

import json
import re

import pytest

from codegen import schema as build
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.protocol.schema.index import APIS

JSON_ROOT = build.DEFAULT_JSON_ROOT
needs_json = pytest.mark.skipif(
    not JSON_ROOT.is_dir(), reason=f"upstream message definitions not found at {JSON_ROOT}"
)


@needs_json
def test_regenerating_gives_the_committed_files(tmp_path):
    assert build.main(["--out", str(tmp_path)]) == 0
    committed = build.SCHEMA_DIR
    generated = sorted(p.name for p in tmp_path.glob("*.py"))
    assert generated, "generator wrote nothing"
    assert "api_keys.py" in generated
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


def test_the_check_mode_covers_api_keys(tmp_path):
    """--check reports a stale or missing api_keys.py like any other generated module."""
    if not JSON_ROOT.is_dir():
        pytest.skip(f"upstream message definitions not found at {JSON_ROOT}")
    assert build.main(["--out", str(tmp_path)]) == 0
    assert build.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "api_keys.py").write_text((tmp_path / "api_keys.py").read_text().replace("= 18", "= 81"))
    assert build.main(["--out", str(tmp_path), "--check"]) == 1
    (tmp_path / "api_keys.py").unlink()
    assert build.main(["--out", str(tmp_path), "--check"]) == 1


def test_api_keys_enum_names_every_api_in_upper_snake_case():
    assert [int(k) for k in ApiKey] == sorted(APIS)
    for key in ApiKey:
        assert key.name == build.snake_case(APIS[key][0]).upper()
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SASL_HANDSHAKE, ApiKey.API_VERSIONS) == (0, 1, 17, 18)
    assert ApiKey.DESCRIBE_CLUSTER == 60 and ApiKey.CONSUMER_GROUP_HEARTBEAT == 68
    assert ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS == 90
