"""Ground truth recorded while a scenario runs: what the clients did and saw.

A manifest sits next to its capture as `NAME.manifest.json`.  Bytes (keys,
values, header values) follow the `records` table's `--values auto` rule:
UTF-8 text when the bytes decode as UTF-8, else base64, and the matching
`*_encoding` field says which ("utf8" | "base64"; null for a null key/value).
That lets tests compare kwinspect's output with the manifest field by field.

Offsets of produced records are the ones the client's delivery reports
returned (null when the client could not know them, e.g. acks=0).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT_VERSION = 1
BYTES_ENCODING_RULE = (
    "key/value/header values: UTF-8 text when the bytes decode as UTF-8, else base64; "
    "*_encoding says which (utf8|base64), null for a null key/value"
)


def encode_bytes(data: bytes | str | None) -> tuple[str | None, str | None]:
    """(text, encoding) with the same rule as kwinspect's `--values auto`."""
    if data is None:
        return None, None
    if isinstance(data, str):
        return data, "utf8"
    try:
        return bytes(data).decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(bytes(data)).decode("ascii"), "base64"


def decode_bytes(text: str | None, encoding: str | None) -> bytes | None:
    if text is None:
        return None
    if encoding == "base64":
        return base64.b64decode(text)
    if encoding == "hex":
        return bytes.fromhex(text)
    return text.encode("utf-8")


def encode_headers(headers: Any) -> list[dict[str, Any]]:
    """Headers as a list of {key, value, value_encoding}, order kept."""
    out: list[dict[str, Any]] = []
    if not headers:
        return out
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        text, enc = encode_bytes(value)
        out.append({"key": key if isinstance(key, str) else bytes(key).decode("utf-8", "replace"),
                    "value": text, "value_encoding": enc})
    return out


@dataclass
class ClientInfo:
    """One client instance the scenario ran."""

    role: str  # producer | consumer | admin | ...
    library: str  # confluent-kafka | kafka-python
    version: str
    client_id: str
    config: dict[str, Any] = field(default_factory=dict)  # the non-default settings used
    librdkafka: str | None = None


@dataclass
class RecordTruth:
    """A record as the client produced (delivery report) or consumed it."""

    topic: str
    partition: int | None
    offset: int | None
    key: str | None
    key_encoding: str | None
    value: str | None
    value_encoding: str | None
    headers: list[dict[str, Any]] = field(default_factory=list)
    codec: str | None = None  # compression the producer was configured with
    # Produced: the CreateTime the client set on the record.  Consumed: the
    # record's timestamp as the consumer returned it (see timestamp_type).
    timestamp_ms: int | None = None
    timestamp_type: str | None = None  # "create_time" | "log_append_time"
    # Produced only: the timestamp in the delivery report (for the mock cluster
    # this is the produce response's log_append_time, a placeholder value).
    report_timestamp_ms: int | None = None
    client_id: str | None = None
    acks: str | None = None  # "0" | "1" | "all" for produced records
    transactional_id: str | None = None
    txn_outcome: str | None = None  # "committed" | "aborted" for transactional records
    group_id: str | None = None  # consumed records: the consumer's group (None: assign())
    delivery_error: str | None = None  # produced records the client saw fail

    @classmethod
    def make(cls, topic: str, partition: int | None, offset: int | None, key: Any, value: Any,
             headers: Any = None, **kw: Any) -> RecordTruth:
        k, ke = encode_bytes(key)
        v, ve = encode_bytes(value)
        if offset is not None and offset < 0:
            offset = None  # librdkafka's "invalid offset" (-1001) / kafka-python's -1
        return cls(topic=topic, partition=partition, offset=offset, key=k, key_encoding=ke,
                   value=v, value_encoding=ve, headers=encode_headers(headers), **kw)

    def identity(self) -> tuple:
        """What must match between produced, consumed and decoded records."""
        return (self.topic, self.partition, self.offset, self.key, self.key_encoding,
                self.value, self.value_encoding,
                tuple((h["key"], h["value"], h["value_encoding"]) for h in self.headers))


@dataclass
class ExpectedError:
    """A Kafka error code the broker must return in the capture (or an anomaly kind)."""

    api: str  # API name, e.g. "Produce", "ApiVersions", "Metadata"
    error: str  # Kafka error name, e.g. "UNKNOWN_TOPIC_OR_PARTITION"
    code: int | None = None
    min_count: int = 1
    why: str = ""


@dataclass
class Manifest:
    scenario: str
    description: str
    pcap: str = ""  # file name, relative to the manifest
    format_version: int = FORMAT_VERSION
    bytes_encoding: str = BYTES_ENCODING_RULE
    broker: dict[str, Any] = field(default_factory=dict)
    kafka_ports: list[int] = field(default_factory=list)
    clients: list[ClientInfo] = field(default_factory=list)
    topics: list[dict[str, Any]] = field(default_factory=list)  # {name, partitions, created_by}
    produced: list[RecordTruth] = field(default_factory=list)
    consumed: list[RecordTruth] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    transactional_ids: list[str] = field(default_factory=list)
    expected_apis: list[str] = field(default_factory=list)  # API names that must appear
    expected_errors: list[ExpectedError] = field(default_factory=list)
    # API name -> statuses other than "paired" that are legitimate here, with why.
    allowed_statuses: dict[str, list[str]] = field(default_factory=dict)
    # Anomalies kwinspect is right to report because the broker sends odd bytes:
    # [{kind, api, why}].  Anything else of verify.DECODER_ANOMALIES fails the tests.
    allowed_anomalies: list[dict[str, Any]] = field(default_factory=list)
    # Anomalies that must be reported (e.g. tls_stream for a TLS connection): [{kind, why}].
    expected_anomalies: list[dict[str, Any]] = field(default_factory=list)
    # Ports whose connections are TLS (not decodable; tshark is not told they are Kafka).
    tls_ports: list[int] = field(default_factory=list)
    # broker port -> minimum latency (ms) the mock broker was told to add.
    min_latency_ms_by_port: dict[str, float] = field(default_factory=dict)
    capture: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)
    admin: list[dict[str, Any]] = field(default_factory=list)  # admin calls and their outcomes
    # Schema Registry scenarios: per produced record, the schema ids and the values the
    # serializers were given (the oracle for decoded keys/values), or the problem made on purpose
    schema_values: list[dict[str, Any]] = field(default_factory=list)

    # -- building helpers --------------------------------------------------
    def add_topic(self, name: str, partitions: int, created_by: str) -> None:
        self.topics.append({"name": name, "partitions": partitions, "created_by": created_by})

    def expect_error(self, api: str, error: str, code: int | None = None, *, min_count: int = 1,
                     why: str = "") -> None:
        self.expected_errors.append(ExpectedError(api, error, code, min_count, why))

    def expect_apis(self, *names: str) -> None:
        for n in names:
            if n not in self.expected_apis:
                self.expected_apis.append(n)

    def allow_anomaly(self, kind: str, api: str | None, why: str) -> None:
        self.allowed_anomalies.append({"kind": kind, "api": api, "why": why})

    def allow_status(self, api: str, status: str) -> None:
        lst = self.allowed_statuses.setdefault(api, [])
        if status not in lst:
            lst.append(status)

    # -- (de)serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    def write(self, path: str | os.PathLike[str]) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
        os.replace(tmp, path)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        d = dict(d)
        d["clients"] = [ClientInfo(**c) for c in d.get("clients", [])]
        d["produced"] = [RecordTruth(**r) for r in d.get("produced", [])]
        d["consumed"] = [RecordTruth(**r) for r in d.get("consumed", [])]
        d["expected_errors"] = [ExpectedError(**e) for e in d.get("expected_errors", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Manifest:
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))

    def pcap_path(self, manifest_path: str | os.PathLike[str]) -> str:
        return os.path.join(os.path.dirname(os.fspath(manifest_path)), self.pcap)
