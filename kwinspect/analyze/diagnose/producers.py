"""Producers: idempotent sequences, retries, producer errors and transactions.

Kinds:
- ``sequence_gap`` (warning): for one (producer id, epoch, topic, partition) the batches seen
  leave a hole in the sequence numbers (records the broker never got, or a capture that missed
  requests).
- ``sequence_overlap`` (warning): a batch starts inside the previous batch's sequence range
  but at a different base (a re-batched retry: the broker will answer DUPLICATE/OUT_OF_ORDER).
- ``produce_retry`` (info): the same batch (same producer id/epoch/partition/base sequence,
  or for non-idempotent producers the same CRC and record count) sent again after its first
  attempt failed or went unanswered.
- ``duplicate_batch`` (warning): the same batch sent again after the broker had acknowledged
  it: without idempotence the records are written twice.
- ``out_of_order_sequence`` (error) / ``duplicate_sequence`` (warning): the broker answered
  OUT_OF_ORDER_SEQUENCE_NUMBER (45) / DUPLICATE_SEQUENCE_NUMBER (46).
- ``producer_fenced`` (error): INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, UNKNOWN_PRODUCER_ID,
  INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE, TRANSACTIONAL_ID_AUTHORIZATION_FAILED in
  produce or transaction responses.
- ``transaction_open`` (warning): a transaction was begun (AddPartitionsToTxn/AddOffsetsToTxn
  succeeded, or transactional records were produced) and no EndTxn followed in the capture.
- ``transaction_aborted`` (info): EndTxn with committed=false.
- ``end_txn_failed`` (warning): EndTxn answered with an error.
"""

from __future__ import annotations

from collections import OrderedDict

from kwinspect.analyze.diagnose.core import (
    ERROR,
    INFO,
    WARNING,
    Evidence,
    Finding,
    FindingTable,
    as_int,
    as_list,
    as_str,
    client_label,
    evidence_of,
    name_of,
    ts_of,
)
from kwinspect.model import STATUS_PAIRED, Exchange, plural
from kwinspect.protocol.errors import error_name
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE = int(ApiKey.PRODUCE)
INIT_PRODUCER_ID = int(ApiKey.INIT_PRODUCER_ID)
ADD_PARTITIONS_TO_TXN = int(ApiKey.ADD_PARTITIONS_TO_TXN)
ADD_OFFSETS_TO_TXN = int(ApiKey.ADD_OFFSETS_TO_TXN)
END_TXN = int(ApiKey.END_TXN)
TXN_OFFSET_COMMIT = int(ApiKey.TXN_OFFSET_COMMIT)
OUT_OF_ORDER_SEQUENCE_NUMBER, DUPLICATE_SEQUENCE_NUMBER = 45, 46
FENCING_ERRORS = {47: "INVALID_PRODUCER_EPOCH", 90: "PRODUCER_FENCED", 59: "UNKNOWN_PRODUCER_ID",
                  49: "INVALID_PRODUCER_ID_MAPPING", 48: "INVALID_TXN_STATE",
                  53: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}
SEQ_MAX = 2**31  # sequences wrap from 2^31 - 1 to 0

# Bounded state: batches remembered per partition key, keys remembered overall.
MAX_BATCHES_PER_KEY = 512
MAX_KEYS = 50_000
MAX_TRANSACTIONS = 50_000


class _Batch:
    __slots__ = ("base", "count", "ev", "outcome")

    def __init__(self, base: int, count: int, ev: Evidence, outcome: int | None) -> None:
        self.base, self.count, self.ev, self.outcome = base, count, ev, outcome  # outcome: error code / None


class _Txn:
    __slots__ = ("tid", "open_since", "evidence", "client", "last_ts", "pid", "epoch")

    def __init__(self, tid: str) -> None:
        self.tid = tid
        self.open_since: float | None = None
        self.evidence: list[Evidence] = []
        self.client = ""
        self.last_ts: float | None = None
        self.pid = self.epoch = None


def _partition_outcomes(ex: Exchange, topic_names: dict[str, str]) -> dict[tuple[str | None, int], int]:
    out: dict[tuple[str | None, int], int] = {}
    body = ex.response.body if ex.response is not None and ex.status == STATUS_PAIRED else None
    for t in as_list((body or {}).get("responses")):
        if not isinstance(t, dict):
            continue
        name = name_of(t, topic_names)
        for p in as_list(t.get("partition_responses")):
            if isinstance(p, dict) and isinstance(p.get("index"), int):
                out[(name, p["index"])] = as_int(p.get("error_code", 0))
    return out


class ProducerAnalyzer(FindingTable):
    def __init__(self, topic_names: dict[str, str]) -> None:
        self.topic_names = topic_names
        self.batches: OrderedDict[tuple, OrderedDict[int, _Batch]] = OrderedDict()  # key -> base seq -> batch
        self.plain: OrderedDict[tuple, _Batch] = OrderedDict()  # non-idempotent: (topic, part, crc, count, ts)
        self.findings: dict[tuple, Finding] = {}
        self.txns: OrderedDict[str, _Txn] = OrderedDict()
        self.retry_requests: dict[tuple, set[tuple]] = {}  # produce_retry key -> (stream, correlation id)

    # -- events ------------------------------------------------------------------------
    def on_exchange(self, ex: Exchange) -> None:
        k = ex.api_key
        if k == PRODUCE:
            self._produce(ex)
        elif k in (INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT):
            self._txn(ex)
        if k in (PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT):
            for code in set(ex.error_codes):
                if code == OUT_OF_ORDER_SEQUENCE_NUMBER:
                    self._add(("out_of_order_sequence", client_label(ex)), ERROR,
                              f"broker answered OUT_OF_ORDER_SEQUENCE_NUMBER to {client_label(ex)}",
                              "The broker saw a sequence number that does not follow the last one it stored for "
                              "this producer and partition: batches were lost or reordered (e.g. retries with "
                              "max.in.flight > 5, or a producer restarted without a new epoch). Idempotence "
                              "guarantees are broken for these batches.", ex, client_id=ex.client_id)
                elif code == DUPLICATE_SEQUENCE_NUMBER:
                    self._add(("duplicate_sequence", client_label(ex)), WARNING,
                              f"broker answered DUPLICATE_SEQUENCE_NUMBER to {client_label(ex)}",
                              "A retried batch was already written; the broker dropped the duplicate. Usually "
                              "harmless, but it shows retries after a lost response.", ex, client_id=ex.client_id)
                elif code in FENCING_ERRORS:
                    self._add(("producer_fenced", client_label(ex), code), ERROR,
                              f"{ex.api_name}: {FENCING_ERRORS[code]} for {client_label(ex)}",
                              "The broker rejected this producer's identity or transaction state: another "
                              "instance with the same transactional.id fenced it, its producer id expired, or it "
                              "used the transaction API out of order. The producer must be recreated.",
                              ex, client_id=ex.client_id, error=FENCING_ERRORS[code])

    def _produce(self, ex: Exchange) -> None:
        body = ex.request.body if ex.request is not None else None
        if not body:
            return
        outcomes = _partition_outcomes(ex, self.topic_names)
        ev = evidence_of(ex)
        tid = as_str(body.get("transactional_id"))
        for t in as_list(body.get("topic_data")):
            if not isinstance(t, dict):
                continue
            topic = name_of(t, self.topic_names)
            for p in as_list(t.get("partition_data")):
                if not isinstance(p, dict):
                    continue
                part, rs = as_int(p.get("index")), p.get("records")
                if not hasattr(rs, "batches"):
                    continue
                if ex.status == STATUS_PAIRED:
                    outcome = outcomes.get((topic, part), 0)
                else:
                    outcome = None  # unanswered (or acks=0)
                for b in rs.batches:
                    if getattr(b, "is_control", False):
                        continue
                    if tid and getattr(b, "is_transactional", False):
                        self._txn_begin(tid, ex, "transactional records produced")
                    pid = getattr(b, "producer_id", -1)
                    count = getattr(b, "record_count", None) or 0
                    if pid is not None and pid >= 0 and getattr(b, "base_sequence", -1) >= 0:
                        self._idempotent((pid, b.producer_epoch, topic, part), b.base_sequence, count, ev,
                                         outcome, ex)
                    else:
                        self._plain((topic, part, b.crc, count, getattr(b, "base_timestamp", None)), ev,
                                    outcome, ex, count)

    def _idempotent(self, key: tuple, base: int, count: int, ev: Evidence, outcome: int | None, ex: Exchange) -> None:
        seen = self.batches.get(key)
        if seen is None:
            if len(self.batches) >= MAX_KEYS:
                self.batches.popitem(last=False)
            seen = self.batches[key] = OrderedDict()
        else:
            self.batches.move_to_end(key)
        prior = seen.get(base)
        if prior is not None:
            self._retry(prior, ev, ex, key_fields={"producer_id": key[0], "producer_epoch": key[1], "topic": key[2],
                                                   "partition": key[3], "base_sequence": base})
            if outcome == 0:
                prior.outcome = 0
            return
        last = next(reversed(seen.values()), None) if seen else None
        if last is not None and last.base < base < last.base + last.count:
            f = self._add(("sequence_overlap",) + key, WARNING,
                          f"batch for {key[2]}[{key[3]}] starts at sequence {base}, inside the previous batch "
                          f"({last.base}-{last.base + last.count - 1})",
                          f"Producer id {key[0]} epoch {key[1]}: a batch re-sent with different boundaries. "
                          "The broker can only de-duplicate whole batches, so expect OUT_OF_ORDER or "
                          "DUPLICATE_SEQUENCE_NUMBER answers.", last.ev, producer_id=key[0],
                          producer_epoch=key[1], topic=key[2], partition=key[3])
            f.add(ev)
        seen[base] = _Batch(base, count, ev, outcome)
        if len(seen) > MAX_BATCHES_PER_KEY:
            seen.popitem(last=False)

    def _plain(self, key: tuple, ev: Evidence, outcome: int | None, ex: Exchange, count: int) -> None:
        prior = self.plain.get(key)
        if prior is not None:
            self._retry(prior, ev, ex, key_fields={"topic": key[0], "partition": key[1], "crc": key[2],
                                                   "record_count": count}, idempotent=False)
            if outcome == 0:
                prior.outcome = 0
            return
        if len(self.plain) >= MAX_KEYS * 4:
            self.plain.popitem(last=False)
        self.plain[key] = _Batch(0, count, ev, outcome)

    def _retry(self, prior: _Batch, ev: Evidence, ex: Exchange, key_fields: dict, idempotent: bool = True) -> None:
        topic, part = key_fields["topic"], key_fields["partition"]
        if prior.outcome == 0 and not idempotent:
            f = self._add(("duplicate_batch", topic, part, client_label(ex)), WARNING,
                          f"{client_label(ex)} re-sent a batch to {topic}[{part}] the broker had already "
                          "acknowledged: records written twice",
                          "A producer without idempotence retried a batch whose first attempt succeeded "
                          "(its response was slow or lost). The log now holds the records twice. Enable "
                          "enable.idempotence to let the broker drop such duplicates.", prior.ev,
                          client_id=ex.client_id, **key_fields)
            f.add(ev)
            return
        what = ("acknowledged" if prior.outcome == 0 else
                "unanswered" if prior.outcome is None else f"answered {error_name(prior.outcome)}")
        key = ("produce_retry", topic, part, client_label(ex))
        f = self.findings.get(key)
        if f is None:  # the first attempt is evidence (and an attempt) once, not once per retry
            f = self._add(key, INFO, f"{client_label(ex)} retried batches to {topic}[{part}]",
                          f"The same batch was sent more than once (first attempt {what}). Retries follow "
                          "retriable errors, timeouts and reconnects; an idempotent producer's duplicates "
                          "are dropped by the broker. Count: Produce requests involved (first attempts "
                          "and retries).", prior.ev, client_id=ex.client_id, topic=topic, partition=part)
            self.retry_requests[key] = {(prior.ev.stream, prior.ev.correlation_id)}
        seen = self.retry_requests[key]
        # one attempt per request: a request carrying several retried batches counts once
        for attempt in (prior.ev, ev):
            rid = (attempt.stream, attempt.correlation_id)
            if rid not in seen and len(seen) < MAX_KEYS:
                seen.add(rid)
                f.add(attempt)

    # -- transactions ----------------------------------------------------------------------
    def _get_txn(self, tid: str) -> _Txn:
        t = self.txns.get(tid)
        if t is None:
            if len(self.txns) >= MAX_TRANSACTIONS:
                self.txns.popitem(last=False)
            t = self.txns[tid] = _Txn(tid)
        return t

    def _txn_begin(self, tid: str, ex: Exchange, why: str) -> None:
        t = self._get_txn(tid)
        t.client = client_label(ex)
        t.last_ts = ts_of(ex)
        if t.open_since is None:
            t.open_since = ts_of(ex)
            t.evidence = []
        if len(t.evidence) < 10:
            t.evidence.append(evidence_of(ex))

    def _txn(self, ex: Exchange) -> None:
        req = ex.request.body if ex.request is not None else None
        resp = ex.response.body if ex.response is not None else None
        if not isinstance(req, dict) or not req:
            return
        if not isinstance(resp, dict):
            resp = None
        ok = ex.status == STATUS_PAIRED and not ex.error_codes
        if ex.api_key == ADD_PARTITIONS_TO_TXN:
            tids = [req.get("v3_and_below_transactional_id") or req.get("transactional_id")]
            tids += [x.get("transactional_id") for x in as_list(req.get("transactions")) if isinstance(x, dict)]
            for tid in tids:
                if isinstance(tid, str) and tid and ok:
                    self._txn_begin(tid, ex, "AddPartitionsToTxn")
        elif ex.api_key in (ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT):
            tid = as_str(req.get("transactional_id"))
            if tid and ok:
                self._txn_begin(tid, ex, ex.api_name or "")
        elif ex.api_key == END_TXN:
            tid = as_str(req.get("transactional_id"))
            if not tid:
                return
            t = self._get_txn(tid)
            committed = req.get("committed")
            if ex.status == STATUS_PAIRED and resp is not None and as_int(resp.get("error_code", 0)):
                self._add(("end_txn_failed", tid, resp["error_code"]), WARNING,
                          f"EndTxn for transactional id {tid!r} failed: {error_name(resp['error_code'])}",
                          "The transaction could not be completed; the producer will have to abort or is "
                          "fenced. Its records stay invisible to read_committed consumers until the "
                          "transaction times out.", ex, transactional_id=tid, client_id=ex.client_id,
                          error=error_name(resp["error_code"]))
                return
            if ex.status != STATUS_PAIRED:
                return  # unanswered: the transaction is still open as far as the capture knows
            if committed is False:
                self._add(("transaction_aborted", tid), INFO, f"transaction {tid!r} aborted",
                          "EndTxn(committed=false): the producer aborted; its records are skipped by "
                          "read_committed consumers. Expected when the application aborts on purpose; "
                          "otherwise look for the error that made it abort.", ex, transactional_id=tid,
                          client_id=ex.client_id)
            t.open_since = None
            t.evidence = []
        elif ex.api_key == INIT_PRODUCER_ID:
            tid = as_str(req.get("transactional_id"))
            if tid and resp and resp.get("error_code") == 0:
                t = self._get_txn(tid)
                t.pid, t.epoch = resp.get("producer_id"), resp.get("producer_epoch")
                t.open_since = None  # a new epoch aborts whatever the previous one left open
                t.evidence = []

    def results(self, capture_end: float | None = None) -> list[Finding]:
        out = list(self.findings.values())
        for key, by_base in self.batches.items():
            pid, epoch, topic, part = key
            seen = sorted(by_base.values(), key=lambda b: b.base)
            for a, b in zip(seen, seen[1:], strict=False):
                end = a.base + a.count
                if b.base > end and not (a.base > SEQ_MAX - 2**20 and b.base < 2**20):
                    f = Finding("sequence_gap", WARNING,
                                f"sequence gap for {topic}[{part}]: {end}..{b.base - 1} never sent "
                                f"(producer id {pid}, epoch {epoch})",
                                f"Batches with sequences {a.base}-{end - 1} and {b.base}-{b.base + b.count - 1} were "
                                f"seen, but no batch covering {plural(b.base - end, 'sequence')} in between. Either the "
                                "capture missed requests (another interface, dropped packets) or the producer "
                                "lost batches; the broker answers OUT_OF_ORDER_SEQUENCE_NUMBER to such gaps.",
                                key={"producer_id": pid, "producer_epoch": epoch, "topic": topic, "partition": part,
                                     "missing_from": end, "missing_to": b.base - 1})
                    f.add(a.ev)
                    f.add(b.ev)
                    out.append(f)
        for t in self.txns.values():
            if t.open_since is None:
                continue
            f = Finding("transaction_open", WARNING,
                        f"transaction {t.tid!r} begun and never ended in the capture",
                        f"Client {t.client} added partitions/offsets to transaction {t.tid!r} but sent no EndTxn "
                        "afterwards. If the capture covers the producer's whole life, the producer died or hung "
                        "mid-transaction: read_committed consumers stall on these partitions until the "
                        "transaction times out (transaction.timeout.ms) and the coordinator aborts it.",
                        key={"transactional_id": t.tid, "client_id": t.client, "producer_id": t.pid})
            for ev in t.evidence:
                f.add(ev)
            f.last_ts = max(f.last_ts or 0, t.last_ts or 0) or f.last_ts
            out.append(f)
        return out
