"""The check that decoded records table rows show what confluent-kafka's serializers were
given (a schemas scenario's manifest, ``schema_values``): shared by the tests on the
shipped capture and the end-to-end run of the scenario."""

from __future__ import annotations

import json
from typing import Any

ENCODINGS = {"avro": "avro", "protobuf": "protobuf", "json": "json_schema"}


def schema_problems(rows: list[dict], schema_values: list[dict[str, Any]],
                    raw: str = "auto") -> list[str]:
    """What differs between the rows (`records -F jsonl` with schemas) and the oracle:
    every framed record, produced and fetched, decodes to the value the serializer was
    given; the records framed badly on purpose stay raw (an id that does not resolve
    is not shown). ``raw``: the --values mode (plain keys are compared in text modes)."""
    got: dict[tuple, list[dict]] = {}
    for r in rows:
        got.setdefault((r["topic"], r["partition"], r["offset"]), []).append(r)
    problems: list[str] = []
    for truth in schema_values:
        seen = got.get((truth["topic"], truth["partition"], truth["offset"]), [])
        if sorted(r["direction"] for r in seen) != ["fetch", "produce"]:
            problems.append(f"{truth['topic']}@{truth['offset']}: rows {seen}")
            continue
        for r in seen:
            where = f"{r['direction']} {truth['topic']}@{truth['offset']}"
            if "problem" in truth:
                known = truth["problem"] != "schema_unknown"
                want_id = truth.get("value_schema_id") if known else None
                if r["value_encoding"] not in ("utf8", "base64", "hex") or r["value_schema_id"] != want_id:
                    problems.append(f"{where}: framed badly, yet {r['value_encoding']} id {r['value_schema_id']}")
                continue
            want = (truth["value_schema_id"], truth["value_format"], ENCODINGS[truth["value_format"]])
            if (r["value_schema_id"], r["value_format"], r["value_encoding"]) != want:
                problems.append(f"{where}: {r['value_schema_id']} {r['value_format']} "
                                f"{r['value_encoding']}, expected {want}")
            elif json.loads(r["value"]) != truth["value"]:
                problems.append(f"{where}: value {r['value']} != {truth['value']}")
            if truth["key_format"] == "avro":
                if ((r["key_schema_id"], r["key_encoding"]) != (truth["key_schema_id"], "avro")
                        or json.loads(r["key"]) != truth["key"]):
                    problems.append(f"{where}: key {r['key']} ({r['key_encoding']}) != {truth['key']}")
            elif r["key_schema_id"] is not None or (raw in ("auto", "utf8") and r["key"] != truth["key"]):
                problems.append(f"{where}: plain key {r['key']!r} != {truth['key']!r}")
    return problems
