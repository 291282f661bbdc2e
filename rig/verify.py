"""Compare what kwinspect decodes from a capture with the scenario's manifest.

Each `check_*` function returns a list of human-readable problems (empty
when all is well), so tests can assert on them one aspect at a time and print
everything that is wrong at once.  `tshark_requests` is an independent oracle
(Wireshark's Kafka dissector) for the requests a capture contains.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rig.manifest import Manifest, RecordTruth

# Anomalies that must never appear when decoding clean real traffic.
DECODER_ANOMALIES = {
    "decode_error", "trailing_bytes", "unknown_api_key", "unsupported_version", "crc_mismatch",
    "decompression_failed", "limit_exceeded", "tcp_gap", "tcp_overlap_conflict",
    "truncated_packet", "truncated_frame", "oversized_frame", "resync", "tls_stream", "not_kafka",
    "request_missing", "duplicate_correlation_id", "out_of_order_response",
}


@dataclass
class Decoded:
    exchanges: list[Any] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    produce_rows: list[Any] = field(default_factory=list)
    fetch_rows: list[Any] = field(default_factory=list)
    record_issues: list[Any] = field(default_factory=list)
    topic_names: dict[str, str] = field(default_factory=dict)


def _topic_names_from_metadata(exchanges: Iterable[Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for ex in exchanges:
        if ex.api_key != 3 or ex.response is None or not ex.response.body:
            continue
        for t in ex.response.body.get("topics") or []:
            tid, name = t.get("topic_id"), t.get("name")
            if tid and name and tid != "AAAAAAAAAAAAAAAAAAAAAA":
                names[tid] = name
    return names


def keylog_of(pcap: str) -> str | None:
    """The NSS key log shipped next to a TLS capture (NAME.keys for NAME.pcap), if any."""
    path = os.path.splitext(pcap)[0] + ".keys"
    return path if os.path.isfile(path) else None


def decode(pcap: str, ports: Iterable[int], keylog: str | None = None) -> Decoded:
    """Run kwinspect's pipeline on `pcap` (the public Python entry points); with the key
    log next to it (keylog_of) unless one is given."""
    from kwinspect.analyze.record_rows import records_from_fetch, records_from_produce
    from kwinspect.capture.keylog import KeyLog
    from kwinspect.dissect import DissectConfig
    from kwinspect.model import ErrorRow, Exchange
    from kwinspect.run.files import FileRun, dissect_files

    out = Decoded()
    run = FileRun()
    keylog = keylog or keylog_of(pcap)
    keys = None
    if keylog is not None:
        keys = KeyLog()
        keys.add_file(keylog)
    for ev in dissect_files([pcap], DissectConfig(kafka_ports=frozenset(ports), tls_keys=keys), run=run):
        if isinstance(ev, Exchange):
            out.exchanges.append(ev)
        elif isinstance(ev, ErrorRow):
            out.errors.append(ev)
    names = _topic_names_from_metadata(out.exchanges)
    shared = getattr(getattr(run, "dissector", None), "shared", None)
    names.update(getattr(shared, "topic_names", None) or {})
    out.topic_names = names
    for ex in out.exchanges:
        if ex.api_key == 0 and ex.request is not None:
            out.produce_rows += records_from_produce(
                ex.request.body, ex.response.body if ex.response is not None else None,
                correlation_id=ex.correlation_id, stream=ex.stream, topic_names=names,
                issues=out.record_issues)
        elif ex.api_key == 1 and ex.response is not None:
            out.fetch_rows += records_from_fetch(
                ex.response.body, correlation_id=ex.correlation_id, stream=ex.stream,
                topic_names=names, request_body=ex.request.body if ex.request else None,
                issues=out.record_issues)
    return out


# ---------------------------------------------------------------------------
# record identity helpers
# ---------------------------------------------------------------------------


def _hdrs(headers: Any) -> tuple:
    out = []
    for h in headers or []:
        out.append((h.get("key"), h.get("value"), h.get("value_encoding")))
    return tuple(out)


def row_identity(row: Any, *, offset: bool = True) -> tuple:
    return (row.topic, row.partition, row.offset if offset else None, row.key, row.key_encoding,
            row.value, row.value_encoding, _hdrs(row.headers))


def truth_identity(t: RecordTruth, *, offset: bool = True) -> tuple:
    return (t.topic, t.partition, t.offset if offset else None, t.key, t.key_encoding, t.value,
            t.value_encoding, _hdrs(t.headers))


def _short(ident: tuple) -> str:
    topic, part, off, key, _ke, value, _ve, hdrs = ident
    v = value if value is None or len(value) < 40 else value[:37] + "..."
    return f"{topic}[{part}]@{off} key={key!r} value={v!r} headers={list(hdrs)}"


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def check_apis(m: Manifest, d: Decoded) -> list[str]:
    seen = {ex.api_name for ex in d.exchanges}
    return [f"expected {api} exchanges, none decoded (decoded: {sorted(s for s in seen if s)})"
            for api in m.expected_apis if api not in seen]


def check_pairing(m: Manifest, d: Decoded) -> list[str]:
    """Every request paired, except what the manifest allows (acks=0, ...) and requests
    still in flight when a client closed its connection."""
    problems: list[str] = []
    # Requests after the last answered one on a connection: the client closed the
    # connection with them in flight (typically a long-poll Fetch and a Metadata).
    last_paired: dict[str, int] = {}
    for i, ex in enumerate(d.exchanges):
        if ex.status == "paired":
            last_paired[ex.stream] = i
    for i, ex in enumerate(d.exchanges):
        if ex.status == "paired":
            continue
        allowed = m.allowed_statuses.get(ex.api_name or "", [])
        if ex.status in allowed:
            continue
        if ex.status == "response_missing" and i > last_paired.get(ex.stream, -1):
            continue  # in flight when the client closed; check_against_tshark double-checks
        problems.append(f"{ex.api_name} v{ex.api_version} corr={ex.correlation_id} on "
                        f"{ex.stream}: status {ex.status}")
    if not d.exchanges:
        problems.append("no exchanges decoded at all")
    return problems


def check_errors(m: Manifest, d: Decoded) -> list[str]:
    problems: list[str] = []
    counts: collections.Counter[tuple[str | None, str | None]] = collections.Counter()
    for e in d.errors:
        if e.kind == "kafka_error":
            counts[(e.api_name, e.name)] += 1
    ex_counts: collections.Counter[tuple[str | None, str]] = collections.Counter()
    for ex in d.exchanges:
        for name in set(ex.error_names or []):
            ex_counts[(ex.api_name, name)] += 1
    for exp in m.expected_errors:
        n = max(counts[(exp.api, exp.error)], ex_counts[(exp.api, exp.error)])
        if n < exp.min_count:
            problems.append(f"expected {exp.api} {exp.error} at least {exp.min_count}x "
                            f"({exp.why}); found {n}. kafka errors decoded: {dict(counts)}")
    return problems


def check_anomalies(m: Manifest, d: Decoded) -> list[str]:
    """Clean real traffic must decode without decoder anomalies, except the broker
    quirks the manifest lists (allowed_anomalies)."""
    allowed = {(a["kind"], a.get("api")) for a in m.allowed_anomalies}
    request_missing_ok = any("request_missing" in v for v in m.allowed_statuses.values())
    problems = []
    for e in d.errors:
        if e.kind not in DECODER_ANOMALIES:
            continue
        if (e.kind, e.api_name) in allowed or (e.kind, None) in allowed:
            continue
        if e.kind == "request_missing" and request_missing_ok:
            continue
        problems.append(f"{e.kind} in {e.api_name} corr={e.correlation_id} path={e.path}: "
                        f"{e.message} ({e.stream})")
    expected = {a["kind"] for a in m.expected_anomalies}
    problems = [p for p in problems if p.split(" ", 1)[0] not in expected]
    seen = collections.Counter(e.kind for e in d.errors)
    for a in m.expected_anomalies:
        if not seen[a["kind"]]:
            problems.append(f"expected a {a['kind']} report ({a.get('why', '')}); "
                            f"anomalies reported: {dict(seen)}")
    for issue in d.record_issues:
        kind = getattr(issue, "kind", "")
        if kind in DECODER_ANOMALIES and not any(k == kind for k, _api in allowed):
            problems.append(f"record issue {kind} at {getattr(issue, 'path', None)}: "
                            f"{getattr(issue, 'message', '')}")
    return problems


def check_produced(m: Manifest, d: Decoded) -> list[str]:
    """Each record a producer sent is in a produce request, with the offset its delivery
    report gave, the timestamp it set and the codec it used; nothing invented."""
    problems: list[str] = []
    # librdkafka sends a batch uncompressed when compressing it would not make it
    # smaller (rdkafka_msgset_writer.c), whatever compression.type says: from those
    # producers the configured codec or none is right, anything else is not
    librdkafka_producers = {c.client_id for c in m.clients if c.library == "confluent-kafka"}
    by_ident = collections.defaultdict(list)
    by_ident_no_off = collections.defaultdict(list)
    for r in d.produce_rows:
        by_ident[row_identity(r)].append(r)
        by_ident_no_off[row_identity(r, offset=False)].append(r)
    for t in m.produced:
        if t.offset is not None and t.delivery_error is None:
            rows = by_ident.get(truth_identity(t), [])
            if not rows:
                cands = by_ident_no_off.get(truth_identity(t, offset=False), [])
                problems.append(f"produced {_short(truth_identity(t))} not decoded"
                                + (f" (same record decoded with offsets "
                                   f"{sorted({c.offset for c in cands}, key=str)})" if cands else ""))
                continue
        else:
            rows = by_ident_no_off.get(truth_identity(t, offset=False), [])
            if not rows:
                problems.append(f"produced {_short(truth_identity(t))} (no offset known: "
                                f"{t.delivery_error or 'acks=0'}) not in any produce request")
                continue
        row = rows[0]
        if t.timestamp_ms is not None and row.timestamp is not None:
            if round(row.timestamp * 1000) != t.timestamp_ms:
                problems.append(f"produced {_short(truth_identity(t))}: timestamp "
                                f"{row.timestamp} != {t.timestamp_ms} ms")
        if t.timestamp_ms is not None and row.timestamp is None and row.magic >= 1:
            problems.append(f"produced {_short(truth_identity(t))}: timestamp missing")
        if t.codec and row.compression != t.codec and not (
                row.compression == "none" and t.client_id in librdkafka_producers):
            problems.append(f"produced {_short(truth_identity(t))}: compression "
                            f"{row.compression} != {t.codec}")
        if t.transactional_id and not row.is_transactional:
            problems.append(f"produced {_short(truth_identity(t))}: not marked transactional")
        if row.crc_ok is False:
            problems.append(f"produced {_short(truth_identity(t))}: crc_ok is False")
    # Nothing decoded that no producer sent.
    known = {truth_identity(t, offset=False) for t in m.produced}
    for r in d.produce_rows:
        if row_identity(r, offset=False) not in known:
            problems.append(f"decoded a produced record no client sent: {_short(row_identity(r))}")
    # Offsets the broker assigned must be the ones the clients were told.
    told = {(t.topic, t.partition, t.offset): truth_identity(t) for t in m.produced
            if t.offset is not None}
    for r in d.produce_rows:
        if r.offset is None:
            continue
        want = told.get((r.topic, r.partition, r.offset))
        if want is not None and want != row_identity(r):
            problems.append(f"produce row at {r.topic}[{r.partition}]@{r.offset} is "
                            f"{_short(row_identity(r))}, the delivery report says "
                            f"{_short(want)}")
    return problems


def check_consumed(m: Manifest, d: Decoded) -> list[str]:
    """Each record a consumer returned is in a fetch response, and every fetched record
    equals what the clients know is stored at that offset."""
    problems: list[str] = []
    fetched = {row_identity(r) for r in d.fetch_rows if not r.is_control}
    for t in m.consumed:
        if truth_identity(t) not in fetched:
            problems.append(f"consumed {_short(truth_identity(t))} not in any fetch response")
    truth_at: dict[tuple, tuple] = {}
    for t in list(m.produced) + list(m.consumed):
        if t.offset is not None:
            truth_at[(t.topic, t.partition, t.offset)] = truth_identity(t)
    for r in d.fetch_rows:
        if r.is_control:
            continue
        want = truth_at.get((r.topic, r.partition, r.offset))
        if want is not None and want != row_identity(r):
            problems.append(f"fetched {_short(row_identity(r))} but the clients say "
                            f"{_short(want)}")
        if r.crc_ok is False:
            problems.append(f"fetched {_short(row_identity(r))}: crc_ok is False")
    return problems


def check_producer_state(m: Manifest, d: Decoded) -> list[str]:
    """Idempotent/transactional producers: producer id, epoch and gap-free sequences."""
    problems: list[str] = []
    idem_clients = {c.client_id for c in m.clients
                    if c.config.get("enable.idempotence") or c.config.get("transactional.id")}
    if not idem_clients:
        return problems
    idem_topics = {t.topic for t in m.produced if t.client_id in idem_clients}
    rows = [r for r in d.produce_rows if r.topic in idem_topics and r.offset is not None]
    if not rows:
        return ["no decoded produce records from the idempotent/transactional producer"]
    seqs: dict[tuple, list[int]] = collections.defaultdict(list)
    for r in rows:
        if r.producer_id is None or r.producer_id < 0:
            problems.append(f"{_short(row_identity(r))}: producer_id {r.producer_id}")
            continue
        if r.sequence is None:
            problems.append(f"{_short(row_identity(r))}: sequence missing")
            continue
        seqs[(r.producer_id, r.producer_epoch, r.topic, r.partition)].append(r.sequence)
    for key, lst in seqs.items():
        lst = sorted(set(lst))
        if lst != list(range(lst[0], lst[0] + len(lst))) or lst[0] != 0:
            problems.append(f"sequences for {key} are {lst}, expected 0..n without gaps")
    if m.transactional_ids:
        kinds = collections.Counter(r.control_type for r in d.fetch_rows if r.is_control)
        outcomes = {t.txn_outcome for t in m.produced if t.txn_outcome}
        for outcome, marker in (("committed", "commit"), ("aborted", "abort")):
            if outcome in outcomes and not any(marker in str(k).lower() for k in kinds):
                problems.append(f"no {marker} control record fetched (control types: {dict(kinds)})")
    return problems


def check_latency(m: Manifest, d: Decoded) -> list[str]:
    problems: list[str] = []
    for port, min_ms in m.min_latency_ms_by_port.items():
        exs = [ex for ex in d.exchanges if ex.status == "paired"
               and str(ex.broker).endswith(f":{port}") and ex.api_name != "ApiVersions"]
        if not exs:
            problems.append(f"no paired exchanges with the broker on port {port}")
            continue
        low = [ex for ex in exs if ex.latency_ms is None or ex.latency_ms < 0.9 * min_ms]
        if low:
            problems.append(f"{len(low)} exchanges with broker :{port} faster than the "
                            f"{min_ms} ms the mock adds, e.g. {low[0].api_name} "
                            f"{low[0].latency_ms} ms")
    return problems


CHECKS = {
    "apis": check_apis,
    "pairing": check_pairing,
    "errors": check_errors,
    "anomalies": check_anomalies,
    "produced": check_produced,
    "consumed": check_consumed,
    "producer_state": check_producer_state,
    "latency": check_latency,
}


# ---------------------------------------------------------------------------
# tshark: an oracle we did not write
# ---------------------------------------------------------------------------


def tshark_path() -> str | None:
    return shutil.which("tshark")


def _tshark_rows(pcap: str, ports: Iterable[int], tls_ports: Iterable[int] = (),
                 keylog: str | None = None) -> list[tuple[int, int, str, str, str]]:
    """(src port, dst port, request keys, response keys, correlation ids) per Kafka packet;
    with a key log, Kafka inside TLS on `tls_ports` too (`-o tls.keylog_file:`)."""
    exe = tshark_path()
    if exe is None:
        raise FileNotFoundError("tshark")
    cmd = [exe, "-n", "-r", pcap]
    for p in ports:
        cmd += ["-d", f"tcp.port=={p},kafka"]
    if keylog is not None:
        cmd += ["-o", f"tls.keylog_file:{keylog}"]
    for p in tls_ports:  # (secrets in a pcapng's Decryption Secrets Blocks need no key log file)
        cmd += ["-d", f"tls.port=={p},kafka"]
    cmd += ["-Y", "kafka", "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,",
            "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "kafka.request_key",
            "-e", "kafka.response_key", "-e", "kafka.correlation_id"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"tshark failed: {res.stderr.strip()[-500:]}")
    rows = []
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) < 5:
            continue
        rows.append((int(parts[0]), int(parts[1]), parts[2], parts[3], parts[4]))
    return rows


def tshark_requests(pcap: str, ports: Iterable[int], tls_ports: Iterable[int] = (),
                    keylog: str | None = None) -> collections.Counter[tuple[int, int]]:
    """(api_key, correlation_id) of every Kafka request Wireshark finds, counted."""
    out: collections.Counter[tuple[int, int]] = collections.Counter()
    for _sp, _dp, req, _resp, corr in _tshark_rows(pcap, ports, tls_ports, keylog):
        if not req:
            continue
        for k, c in zip(req.split(","), corr.split(","), strict=False):
            out[(int(k), int(c))] += 1
    return out


def tshark_responses(pcap: str, ports: Iterable[int], tls_ports: Iterable[int] = (),
                     keylog: str | None = None) -> set[tuple[int, int]]:
    """(client port, correlation id) of every response Wireshark finds (decoded or not)."""
    kafka_ports = set(ports) | set(tls_ports)
    out: set[tuple[int, int]] = set()
    for sp, dp, req, _resp, corr in _tshark_rows(pcap, ports, tls_ports, keylog):
        if req or sp not in kafka_ports:
            continue
        for c in corr.split(","):
            if c:
                out.add((dp, int(c)))
    return out


def check_against_tshark(m: Manifest, d: Decoded, pcap: str) -> list[str]:
    """kwinspect's requests == tshark's requests; the manifest's APIs are really there."""
    from kwinspect.protocol.apis import API_KEYS

    problems: list[str] = []
    plain = [p for p in m.kafka_ports if p not in set(m.tls_ports)]
    # with key material (NAME.keys, or secrets inside the pcapng, which tshark reads too),
    # Kafka inside TLS counts on both sides
    keylog = keylog_of(pcap)
    tls_ports = m.tls_ports if keylog or any(e.kind == "tls_decrypted" for e in d.errors) else []
    theirs = tshark_requests(pcap, plain, tls_ports, keylog)
    ours: collections.Counter[tuple[int, int]] = collections.Counter(
        (ex.api_key, ex.correlation_id) for ex in d.exchanges
        if ex.api_key is not None and ex.request is not None)
    # Raw SASL tokens after SaslHandshake v0 have no Kafka header; Wireshark does not
    # track that state and reads a PLAIN token ("user\0user\0password") as a request
    # with a made-up api key.  kwinspect shows them as SaslToken: leave those out.
    if any(ex.api_name == "SaslToken" for ex in d.exchanges):
        known = set(API_KEYS.values())
        theirs = collections.Counter({kc: n for kc, n in theirs.items() if kc[0] in known})
    keys = {k for k, _ in theirs}
    for api in m.expected_apis:
        if api == "SaslToken":
            continue  # not a Kafka api key; checked by check_apis on kwinspect's side
        if API_KEYS.get(api) not in keys:
            problems.append(f"tshark sees no {api} request (api keys seen: {sorted(keys)})")
    # Pairs of (api key, correlation id) over the whole file: every one tshark
    # found must be decoded by kwinspect, and nothing more.
    missing = theirs - ours
    extra = ours - theirs
    if missing:
        problems.append(f"requests tshark sees that kwinspect does not: {sorted(missing)[:10]}")
    if extra:
        problems.append(f"requests kwinspect decodes that tshark does not: {sorted(extra)[:10]}")
    # A request kwinspect calls unanswered must really have no response on its connection.
    responses = tshark_responses(pcap, plain, tls_ports, keylog)
    for ex in d.exchanges:
        if ex.status != "response_missing" or ex.correlation_id is None:
            continue
        client_port = int(str(ex.client).rsplit(":", 1)[1])
        if (client_port, ex.correlation_id) in responses:
            problems.append(f"{ex.api_name} corr={ex.correlation_id} on {ex.stream} is "
                            "response_missing, but tshark sees its response")
    return problems
