"""Throttling, connection churn, requests lost with their connection, latency outliers.

Kinds:
- ``authentication_failed`` (error): SaslHandshake or SaslAuthenticate answered with an error
  (UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED, ...).
- ``capture_gaps`` (info): the capture lost bytes (tcp_gap, truncated frames/packets): some
  findings may be artifacts of the capture, not of the traffic.
- ``throttled`` (info; warning from ``THROTTLE_WARN_COUNT`` throttled responses or
  ``THROTTLE_WARN_TOTAL_MS`` of throttle time): responses with throttle_time_ms > 0, per
  client and api (quotas).
- ``connection_churn`` (warning): ``CHURN_COUNT`` or more new connections from one client to
  one broker within ``CHURN_WINDOW_S`` seconds.
- ``request_lost`` (warning): a request was in flight when its connection ended, and the same
  client sent the same api again to the same broker on a connection opened after it, within
  ``LOST_RETRY_WINDOW_S`` (the
  connection broke under the request). Without such a retry the client was simply closing
  (``unanswered_at_close``, info). Fetch long-polls are skipped: a consumer closing mid-poll
  is routine. When the capture shows the client's own FIN or RST came first, the client
  abandoned the request itself (librdkafka drops a bootstrap connection right after
  sending on it, then asks again elsewhere): ``unanswered_at_close`` (info) too.
- ``broker_unavailable`` (warning): a broker refused connection attempts (the client's SYN
  answered by RST: nothing listening, or a broker shutting down) or closed connections itself
  (its FIN/RST first) that the client then had to reopen to the same broker within
  ``LOST_RETRY_WINDOW_S`` of the connection's last traffic (so not an idle timeout). A
  connection whose authentication failed is left to ``authentication_failed``.
- ``latency_outlier`` (warning): exchanges far slower than their api's own distribution:
  above median + ``OUTLIER_MAD_K`` x 1.4826 x MAD (a robust z-score; p99-based rules are not
  used because the outliers inflate p99 themselves), and above ``OUTLIER_MIN_MS``; needs
  ``OUTLIER_MIN_COUNT`` exchanges of the api. Fetch counts only the time beyond its max_wait_ms;
  JoinGroup/SyncGroup (waits by design) are not judged.
- ``slow_broker`` (warning): for one api, a broker's median latency is at least
  ``SLOW_BROKER_FACTOR`` times the median of the other brokers and at least
  ``SLOW_BROKER_MIN_MS``, with ``SLOW_BROKER_MIN_COUNT`` exchanges on each side.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from statistics import median
from typing import Any

from kwinspect.analyze.diagnose.core import (
    ERROR,
    INFO,
    WARNING,
    Evidence,
    Finding,
    FindingTable,
    Window,
    client_label,
    evidence_of,
    ts_of,
)
from kwinspect.model import STATUS_PAIRED, STATUS_RESPONSE_MISSING, Exchange, plural
from kwinspect.protocol.schema.api_keys import ApiKey

FETCH = int(ApiKey.FETCH)
JOIN_GROUP = int(ApiKey.JOIN_GROUP)
SYNC_GROUP = int(ApiKey.SYNC_GROUP)
SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
SASL_AUTHENTICATE = int(ApiKey.SASL_AUTHENTICATE)
NOT_JUDGED_FOR_LATENCY = {JOIN_GROUP, SYNC_GROUP}

CAPTURE_LOSS_KINDS = {"tcp_gap", "truncated_frame", "truncated_packet", "snaplen_truncated"}
THROTTLE_WARN_COUNT = 3
THROTTLE_WARN_TOTAL_MS = 1000
CHURN_COUNT = 10
CHURN_WINDOW_S = 60.0
LOST_RETRY_WINDOW_S = 30.0
OUTLIER_MIN_COUNT = 20
OUTLIER_MAD_K = 10.0
OUTLIER_MIN_MS = 100.0
OUTLIER_KEEP = 50  # slowest exchanges remembered per api
SLOW_BROKER_FACTOR = 5.0
SLOW_BROKER_MIN_MS = 50.0
SLOW_BROKER_MIN_COUNT = 5
SAMPLE_SIZE = 20_000  # latencies kept per api/broker (reservoir sample) for medians
MAX_KEYS = 100_000


class _Reservoir:
    __slots__ = ("values", "seen", "rng")

    def __init__(self) -> None:
        self.values: list[float] = []
        self.seen = 0
        self.rng = random.Random(0)  # deterministic: same capture, same findings

    def add(self, v: float) -> None:
        self.seen += 1
        if len(self.values) < SAMPLE_SIZE:
            self.values.append(v)
        else:
            j = self.rng.randrange(self.seen)
            if j < SAMPLE_SIZE:
                self.values[j] = v


class ConnectionAnalyzer(FindingTable):
    def __init__(self) -> None:
        self.findings: dict[tuple, Finding] = {}
        self.throttle: dict[tuple[str, str], list[Any]] = {}  # (client, api) -> [count, total, max, evidence]
        self.streams: OrderedDict[str, float | None] = OrderedDict()  # stream -> its first exchange's ts
        self.churn: dict[tuple[str, str], Window] = {}
        self.unanswered: list[tuple[Exchange, Evidence]] = []
        self.last_by_client_api: dict[tuple[str, str, int], list[tuple[float, str]]] = {}
        self.lat: dict[str, _Reservoir] = {}
        self.lat_broker: dict[tuple[str, str], _Reservoir] = {}
        self.slowest: dict[str, list[tuple[float, int, Evidence, float]]] = {}
        self.ended: dict[str, str] = {}  # stream -> how the connection ended (fin, rst, idle, end)
        self.closed_by: dict[str, str] = {}  # stream -> "client" | "broker": whose FIN/RST came first
        self.auth_failed: set[str] = set()  # streams whose SASL handshake/authentication failed
        # (client host, broker, first_ts, last_ts, stream, refused) of every connection attempt the
        # caller reported (Diagnoser.connections_ended), for broker_unavailable
        self.attempts: list[tuple[str, str, float, float, str, bool]] = []
        self._n = 0

    def on_exchange(self, ex: Exchange) -> None:
        # (the Evidence is made where it is kept: most exchanges need none, and a frozen
        # dataclass costs ~1 us to make)
        ts = ts_of(ex)
        client = client_label(ex)
        self._n += 1
        # connections
        if ex.stream not in self.streams:
            if len(self.streams) >= MAX_KEYS:
                self.streams.popitem(last=False)
            host = ex.client.rsplit(":", 1)[0] if ex.client else ""
            self.streams[ex.stream] = ts
            ckey = (f"{client}@{host}", ex.broker)
            w = self.churn.get(ckey)
            if w is None and len(self.churn) < MAX_KEYS:
                w = self.churn[ckey] = Window(CHURN_WINDOW_S)
            if w is not None:
                n = w.add(ts)
                if n >= CHURN_COUNT:
                    f = self._add(("connection_churn", client, host, ex.broker), WARNING, "",
                                  "The client keeps opening new connections to this broker. Each costs a TCP "
                                  "(and TLS/SASL) handshake and ApiVersions; causes: connections closed by the "
                                  "broker (idle timeout, errors, max connections), client crash loops, or a "
                                  "client created per message.", evidence_of(ex), client_id=ex.client_id,
                                  client_host=host,
                                  broker=ex.broker)
                    f.title = f"{client}: connection churn to {ex.broker} ({w.best} new connections within " \
                              f"{CHURN_WINDOW_S:.0f} s)"
                    f.count = w.best
        # retries on other connections (for request_lost)
        if ex.api_key is not None and ts is not None:
            lkey = (client, ex.broker, ex.api_key)
            lst = self.last_by_client_api.get(lkey)
            if lst is None and len(self.last_by_client_api) < MAX_KEYS:
                lst = self.last_by_client_api[lkey] = []
            if lst is not None:
                if not lst or lst[-1][1] != ex.stream:  # one entry per run of the same connection
                    lst.append((ts, ex.stream))
                if len(lst) > 64:
                    del lst[:32]
        # authentication
        if ex.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and ex.error_names:
            err = ex.error_names[0]
            if len(self.auth_failed) < MAX_KEYS:
                self.auth_failed.add(ex.stream)
            self._add(("authentication_failed", client, ex.broker, err), ERROR,
                      f"{client}: {ex.api_name} to {ex.broker} failed with {err}",
                      "The client cannot authenticate, so it gets no further than the handshake and keeps "
                      "reconnecting. UNSUPPORTED_SASL_MECHANISM: the broker does not enable the client's "
                      "sasl.mechanism (the response lists the ones it does); SASL_AUTHENTICATION_FAILED: wrong "
                      "credentials or unknown user.", evidence_of(ex), client_id=ex.client_id, broker=ex.broker,
                      error=err)
        # throttling
        if ex.throttle_time_ms and ex.throttle_time_ms > 0:
            t = self.throttle.setdefault((client, ex.api_name or "?"), [0, 0, 0, []])
            t[0] += 1
            t[1] += ex.throttle_time_ms
            t[2] = max(t[2], ex.throttle_time_ms)
            if len(t[3]) < 20:
                t[3].append(evidence_of(ex))
        # unanswered requests
        if ex.status == STATUS_RESPONSE_MISSING and ex.api_key != FETCH and len(self.unanswered) < MAX_KEYS:
            self.unanswered.append((ex, evidence_of(ex)))
        # latency
        if ex.status == STATUS_PAIRED and ex.latency_ms is not None and ex.api_key not in NOT_JUDGED_FOR_LATENCY:
            value = ex.latency_ms
            if ex.api_key == FETCH:
                req = ex.request.body if ex.request is not None else None
                wait = (req or {}).get("max_wait_ms")
                value = max(0.0, value - wait) if isinstance(wait, int) and wait > 0 else value
            api = ex.api_name or "?"
            res = self.lat.get(api)
            if res is None:
                res = self.lat[api] = _Reservoir()
            res.add(value)
            key = (api, ex.broker)
            res = self.lat_broker.get(key)
            if res is None and len(self.lat_broker) < MAX_KEYS:
                res = self.lat_broker[key] = _Reservoir()
            if res is not None:
                res.add(value)
            heap = self.slowest.setdefault(api, [])
            if len(heap) < OUTLIER_KEEP:
                heapq.heappush(heap, (value, self._n, evidence_of(ex), ex.latency_ms))
            elif value > heap[0][0]:
                heapq.heapreplace(heap, (value, self._n, evidence_of(ex), ex.latency_ms))

    def on_error(self, err) -> None:
        if err.kind in CAPTURE_LOSS_KINDS:
            f = self._add(("capture_gaps",), INFO, "", "The capture itself lost bytes (packets dropped by the "
                          "capturing host, snap length, or a capture that started or stopped mid-connection). "
                          "Findings about missing requests, unanswered requests or sequence gaps on these "
                          "connections may be artifacts of the capture; `kwinspect errors` lists where.",
                          Evidence(err.stream, err.correlation_id, err.api_name, err.ts))
            kinds = f.key.setdefault("kinds", [])
            if err.kind not in kinds:
                kinds.append(err.kind)
            f.title = f"the capture has {plural(f.count, 'gap or cut frame', 'gaps or cut frames')}: some findings may be artifacts"

    def results(self) -> list[Finding]:
        out = list(self.findings.values())
        for (client, api), (count, total, mx, evs) in self.throttle.items():
            sev = WARNING if count >= THROTTLE_WARN_COUNT or total >= THROTTLE_WARN_TOTAL_MS else INFO
            f = Finding("throttled", sev,
                        f"{client}: {plural(count, api + ' response')} throttled, {total} ms in total (max {mx} ms)",
                        "The broker applied a quota (produce/fetch byte rate or request rate) and told the "
                        "client to back off (throttle_time_ms). Raise the client's quota or spread the load.",
                        key={"client_id": client, "api_name": api, "throttled": count, "total_ms": total,
                             "max_ms": mx})
            for ev in evs:
                f.add(ev)
            f.count = count
            out.append(f)
        lost: dict[tuple, Finding] = {}
        for ex, ev in self.unanswered:
            client = client_label(ex)
            t0 = ev.ts or 0.0
            # a retry on a connection opened after the request was sent: a reconnect, not a connection
            # the client already had (librdkafka keeps a bootstrap and a broker connection to one broker)
            retried = any(s != ex.stream and t0 < ts <= t0 + LOST_RETRY_WINDOW_S
                          and (self.streams.get(s) or 0.0) >= t0
                          for ts, s in self.last_by_client_api.get((client, ex.broker, ex.api_key), []))
            abandoned = retried and self.closed_by.get(ex.stream) == "client"
            kind = "request_lost" if retried and not abandoned else "unanswered_at_close"
            how = self.ended.get(ex.stream)
            key = (kind, client, ex.api_name, abandoned)
            f = lost.get(key)
            if f is None:
                if abandoned:
                    f = Finding(kind, INFO, f"{client}: {ex.api_name} request(s) abandoned when the client closed "
                                "the connection, then sent again on another connection",
                                "The client's own FIN or RST ended the connection with these requests in "
                                "flight, and it asked again elsewhere (librdkafka, for one, closes a bootstrap "
                                "connection as soon as it knows the cluster). Nothing was lost by the broker "
                                "or the network.",
                                key={"client_id": ex.client_id, "api_name": ex.api_name})
                elif retried:
                    f = Finding(kind, WARNING,
                                f"{client}: {ex.api_name} request(s) lost when the connection ended, then retried "
                                "on a new connection",
                                "The connection closed (broker restart, broker-side close on error, network "
                                "reset, idle timeout) with these requests in flight; the client reconnected and "
                                "sent them again. Requests that change state (Produce without idempotence, "
                                "commits) may have been applied twice.",
                                key={"client_id": ex.client_id, "api_name": ex.api_name})
                else:
                    f = Finding(kind, INFO, f"{client}: {ex.api_name} request(s) unanswered when the connection "
                                "or capture ended",
                                "In flight when the client closed the connection or the capture stopped; not "
                                "retried elsewhere, so most likely an orderly shutdown.",
                                key={"client_id": ex.client_id, "api_name": ex.api_name})
                lost[key] = f
            f.add(ev)
            if how:
                ends = f.key.setdefault("connection_ended", [])
                if how not in ends:
                    ends.append(how)
                if how == "rst" and kind == "request_lost" and "reset" not in f.title:
                    f.title += " (connection reset)"
        out.extend(lost.values())
        out.extend(self._broker_unavailable())
        out.extend(self._latency())
        return out

    def _broker_unavailable(self) -> list[Finding]:
        """Refused connection attempts and broker-side closes the client had to recover from."""
        by_broker: dict[str, list[tuple[str, float, str]]] = {}  # broker -> [(how, ts, stream)]
        starts: dict[tuple[str, str], list[float]] = {}  # (client host, broker) -> connection start times
        for host, broker, first, _last, _stream, _refused in self.attempts:
            starts.setdefault((host, broker), []).append(first)
        for host, broker, first, last, stream, refused in self.attempts:
            if refused:
                by_broker.setdefault(broker, []).append(("refused", first, stream))
            elif self.closed_by.get(stream) == "broker" and stream not in self.auth_failed:
                # the client needed the broker again soon after: not an idle timeout or a shutdown
                if any(last < t <= last + LOST_RETRY_WINDOW_S for t in starts.get((host, broker), ())):
                    by_broker.setdefault(broker, []).append(("closed", last, stream))
        out = []
        for broker, items in by_broker.items():
            refused = sum(1 for how, *_ in items if how == "refused")
            closed = len(items) - refused
            parts = ([f"closed {closed} connection(s) the client had to reopen"] if closed else []) + \
                    ([f"refused {refused} connection attempt(s)"] if refused else [])
            f = Finding("broker_unavailable", WARNING, f"broker {broker} {' and '.join(parts)}",
                        "The broker dropped connections (its FIN or RST came first) while clients still "
                        "needed it, and/or answered new connections' SYN with RST (nothing listening: the "
                        "broker is down, restarting, or the port is wrong). Clients see disconnects and "
                        "retries; check the broker's log and health around these times.",
                        key={"broker": broker, "closed": closed, "refused": refused})
            for how, ts, stream in sorted(items, key=lambda x: x[1]):
                f.add(Evidence(stream, None, f"(connection {how})", ts))
            out.append(f)
        return out

    def _latency(self) -> list[Finding]:
        out = []
        for api, res in self.lat.items():
            vals = res.values
            if res.seen < OUTLIER_MIN_COUNT:
                continue
            med = median(vals)
            mad = median(abs(v - med) for v in vals)
            limit = max(med + OUTLIER_MAD_K * 1.4826 * mad, OUTLIER_MIN_MS)
            slow = sorted((x for x in self.slowest.get(api, []) if x[0] > limit), key=lambda x: x[1])
            if not slow:
                continue
            f = Finding("latency_outlier", WARNING,
                        f"{len(slow)} {api} exchange(s) far slower than usual "
                        f"(>{limit:.1f} ms; median {med:.2f} ms)",
                        f"Rule: latency > max(median + {OUTLIER_MAD_K:g} x 1.4826 x MAD, {OUTLIER_MIN_MS:g} ms) "
                        f"over {res.seen} {api} exchanges. Slowest: {max(x[3] for x in slow):.1f} ms. Look at "
                        "the broker (GC, disk, request queue), the network, or a quota; compare with other "
                        "brokers (`kwinspect latency --by broker`).",
                        key={"api_name": api, "median_ms": round(med, 3), "mad_ms": round(mad, 3),
                             "limit_ms": round(limit, 3), "exchanges": res.seen})
            for x in slow:
                f.add(x[2])
            out.append(f)
        by_api: dict[str, dict[str, _Reservoir]] = {}
        for (api, broker), res in self.lat_broker.items():
            by_api.setdefault(api, {})[broker] = res
        for api, brokers in by_api.items():
            if len(brokers) < 2:
                continue
            for broker, res in brokers.items():
                others = [v for b, r in brokers.items() if b != broker for v in r.values]
                if res.seen < SLOW_BROKER_MIN_COUNT or len(others) < SLOW_BROKER_MIN_COUNT:
                    continue
                mine, theirs = median(res.values), median(others)
                if mine >= SLOW_BROKER_MIN_MS and mine >= SLOW_BROKER_FACTOR * max(theirs, 0.001):
                    f = Finding("slow_broker", WARNING,
                                f"{broker} answers {api} slowly: median {mine:.1f} ms vs {theirs:.2f} ms on the "
                                "other brokers",
                                "One broker is consistently slower for the same api: overloaded, a slow disk, "
                                "GC, or a longer network path to it.",
                                key={"broker": broker, "api_name": api, "median_ms": round(mine, 3),
                                     "others_median_ms": round(theirs, 3)})
                    slow = sorted((x for x in self.slowest.get(api, [])), key=lambda x: -x[0])[:5]
                    for x in slow:
                        if x[2].stream and x[2].stream.endswith(broker):
                            f.add(x[2])
                    f.count = res.seen
                    out.append(f)
        return out
