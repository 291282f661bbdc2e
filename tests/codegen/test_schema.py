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
        # franz-go's definitions add versions the JSON snapshot lacks (ShareFetch v1-2...)
        assert lo == min(versions) and hi >= max(versions), name


FRANZ_ROOT = build.DEFAULT_FRANZ_ROOT
needs_franz = pytest.mark.skipif(not FRANZ_ROOT.is_dir(), reason=f"franz-go definitions not found at {FRANZ_ROOT}")


def _franz_max_versions():
    """api key -> max version, read straight from franz-go's definition headers."""
    out = {}
    for path in FRANZ_ROOT.iterdir():
        for m in re.finditer(r"^\w+Request => key (\d+), max version (\d+)", path.read_text(), re.M):
            out[int(m.group(1))] = int(m.group(2))
    return out


@needs_franz
def test_every_version_franz_go_defines_is_covered():
    franz = _franz_max_versions()
    assert set(franz) == set(range(93))
    assert set(APIS) == set(franz)
    for key, hi in franz.items():
        assert APIS[key][2] >= hi, APIS[key]
    assert APIS[91] == ("AlterShareGroupOffsets", 0, 0)
    assert APIS[92] == ("DeleteShareGroupOffsets", 0, 0)
    assert APIS[78] == ("ShareFetch", 0, 2)
    assert APIS[63] == ("BrokerHeartbeat", 0, 2)  # v2 from codegen/supplement


@needs_json
@needs_franz
def test_a_disagreement_between_the_sources_fails_loudly(tmp_path, monkeypatch):
    """Change one field's type in a copy of franz-go's definitions: the generator stops
    and names the message, version and field path."""
    copy = tmp_path / "defs"
    copy.mkdir()
    for path in FRANZ_ROOT.iterdir():
        (copy / path.name).write_text(path.read_text())
    text = (copy / "12_heartbeat").read_text()
    (copy / "12_heartbeat").write_text(text.replace("Generation: int32", "Generation: int64", 1))
    with pytest.raises(SystemExit) as err:
        build.main(["--franz-go", str(copy), "--out", str(tmp_path / "out")])
    message = str(err.value)
    assert "Heartbeat v0 request" in message
    assert "generation_id" in message


@needs_json
@needs_franz
def test_the_summary_says_what_came_from_where(tmp_path, capsys):
    assert build.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "schema sources:" in out
    assert "from franz-go (the JSON lacks them):" in out and "91: request v0" in out
    assert "SUPERSEDED" in out and "codegen/supplement" in out


def test_franz_names_become_kafka_names():
    assert build.kafka_name("MaxWaitMillis") == "max_wait_ms"
    assert build.kafka_name("TopicIDs") == "topic_ids"
    assert build.kafka_name("GroupID") == "group_id"
    assert build.kafka_name("ThrottleMillis") == "throttle_time_ms"
    assert build.kafka_name("AcquisitionLockTimeoutMillis") == "acquisition_lock_timeout_ms"


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
