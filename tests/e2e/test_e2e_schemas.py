"""End-to-end: confluent-kafka's Avro, Protobuf and JSON Schema serializers (mock://
registry) produce to the rig's mock cluster under tcpdump; `kwinspect records` with
the exported schemas (folder and registry export) shows every value the serializers
were given, on the fresh capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.schema_oracle import schema_problems

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]
ROOT = Path(__file__).resolve().parents[2]


def test_serializers_values_decoded_from_a_fresh_capture(rig, tmp_path):
    pytest.importorskip("confluent_kafka.schema_registry")
    from rig.schema_scenarios import NAME, confluent_mock_schemas

    m = confluent_mock_schemas(rig, str(tmp_path))
    assert len(m.schema_values) == len(m.produced) == 31
    for source in (f"{NAME}.schemas", f"{NAME}.registry.json"):
        proc = subprocess.run(
            [sys.executable, "-m", "kwinspect.cli", "records", "-q", str(tmp_path / m.pcap),
             "--schemas", str(tmp_path / source), "-F", "jsonl"],
            capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
        assert proc.returncode == 0, proc.stderr.decode()
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        problems = schema_problems(rows, m.schema_values)
        assert not problems, "\n".join(problems[:10])
