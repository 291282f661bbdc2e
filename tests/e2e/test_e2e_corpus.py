"""The committed captures/ corpus: provenance is complete and kwinspect's decode of
each file matches its manifest (no brokers needed, so these run everywhere)."""

from __future__ import annotations

import copy
import glob
import os
import re
from functools import cache

import pytest

from rig import verify
from rig.manifest import Manifest

CAPTURES = os.path.join(os.path.dirname(__file__), "..", "..", "captures")
MANIFESTS = sorted(glob.glob(os.path.join(CAPTURES, "*.manifest.json")))
IDS = [os.path.basename(p).removesuffix(".manifest.json") for p in MANIFESTS]
DEMO = "confluent-mock-produce-consume.pcap"


@cache
def _load(path: str) -> tuple[Manifest, str, verify.Decoded]:
    m = Manifest.read(path)
    pcap = m.pcap_path(path)
    return m, pcap, verify.decode(pcap, m.kafka_ports)


def _report(problems: list[str]) -> str:
    return "\n".join(problems[:15]) + (f"\n... {len(problems) - 15} more" if len(problems) > 15 else "")


def test_every_capture_has_provenance():
    assert MANIFESTS, "captures/ holds no manifests"
    with open(os.path.join(CAPTURES, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    pcaps = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CAPTURES, "*.pcap*")))
    assert DEMO in pcaps, "the demo capture (Makefile DEMO_CAPTURE) is missing"
    for pcap in pcaps:
        name = re.sub(r"\.pcap(ng)?(\.gz)?$", "", pcap)
        assert os.path.exists(os.path.join(CAPTURES, f"{name}.manifest.json")), \
            f"{pcap} has no manifest"
        assert f"### {pcap}" in readme, f"{pcap} has no entry in captures/README.md"
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(CAPTURES, "*")))
    assert total < 8 * 1024 * 1024, f"captures/ is {total} bytes; keep the corpus a few MB"


@pytest.mark.parametrize("path", MANIFESTS, ids=IDS)
def test_manifest_is_self_consistent(path):
    m = Manifest.read(path)
    assert m.scenario and m.description and m.kafka_ports and m.clients
    assert m.capture.get("stats", {}).get("dropped_by_kernel") == 0
    for r in m.produced + m.consumed:
        assert r.key_encoding in (None, "utf8", "base64")
        assert r.value_encoding in (None, "utf8", "base64")
    # What a consumer got is what a producer was told is stored there.
    told = {(t.topic, t.partition, t.offset): verify.truth_identity(t)
            for t in m.produced if t.offset is not None}
    for c in m.consumed:
        want = told.get((c.topic, c.partition, c.offset))
        if want is not None:
            assert want == verify.truth_identity(c)


@pytest.mark.parametrize("check", list(verify.CHECKS))
@pytest.mark.parametrize("path", MANIFESTS, ids=IDS)
def test_corpus_decode_matches_manifest(path, check):
    m, _pcap, d = _load(path)
    problems = verify.CHECKS[check](m, d)
    assert not problems, f"{m.scenario}/{check}:\n{_report(problems)}"


@pytest.mark.parametrize("path", MANIFESTS, ids=IDS)
def test_corpus_tshark_oracle(path):
    if verify.tshark_path() is None:
        pytest.skip("tshark not installed")
    m, pcap, d = _load(path)
    problems = verify.check_against_tshark(m, d, pcap)
    assert not problems, f"{m.scenario}/tshark:\n{_report(problems)}"


def test_checks_catch_a_broken_decode():
    """The comparison is not vacuous: a wrong value, offset or header is reported."""
    m, _pcap, d = _load(os.path.join(CAPTURES, DEMO.replace(".pcap", ".manifest.json")))
    assert not verify.check_produced(m, d)
    assert not verify.check_consumed(m, d)
    for mutate in ("value", "offset", "headers"):
        bad = copy.copy(d)
        bad.produce_rows = [copy.copy(r) for r in d.produce_rows]
        bad.fetch_rows = [copy.copy(r) for r in d.fetch_rows]
        row = bad.produce_rows[3]
        frow = bad.fetch_rows[3]
        if mutate == "value":
            row.value = (row.value or "") + "x"
            frow.value = (frow.value or "") + "x"
        elif mutate == "offset":
            row.offset = (row.offset or 0) + 1
            frow.offset = (frow.offset or 0) + 1000
        else:
            row.headers = list(row.headers) + [{"key": "k", "value": "v", "value_encoding": "utf8"}]
            frow.headers = []
        assert verify.check_produced(m, bad), f"check_produced missed a broken {mutate}"
        if mutate != "headers" or d.fetch_rows[3].headers:
            assert verify.check_consumed(m, bad), f"check_consumed missed a broken {mutate}"
    dropped = copy.copy(d)
    dropped.exchanges = [ex for ex in d.exchanges if ex.api_name != "JoinGroup"]
    assert verify.check_apis(m, dropped)
    dropped.errors = []
    dropped.exchanges = []
    assert verify.check_errors(m, dropped)
