"""Version negotiation: versions outside what the broker advertised, UNSUPPORTED_VERSION, old versions.

Kinds:
- ``version_not_advertised`` (error): a request used a version outside the range the
  broker advertised in ApiVersions on that connection (or, when the connection did no
  ApiVersions, on another connection to the same broker).
- ``unsupported_version`` (error): a response carried UNSUPPORTED_VERSION (35) for an
  api other than ApiVersions.
- ``apiversions_fallback`` (info): ApiVersions vN answered with UNSUPPORTED_VERSION and the
  client retried with a lower version that succeeded (the normal KIP-511 dance); warning
  (``apiversions_failed``) when no ApiVersions succeeded afterwards on that connection;
  info when that was the only such connection of the client to that broker and the
  client's own FIN or RST closed it (a client shutting down between the rejection and
  its retry, seen in rig runs under load).
- ``old_version`` (info): a client used an api version at least ``OLD_VERSION_GAP`` below
  the highest the broker advertised.
"""

from __future__ import annotations

from typing import Any

from kwinspect.analyze.diagnose.core import (
    ERROR,
    INFO,
    WARNING,
    Evidence,
    Finding,
    FindingTable,
    as_list,
    client_label,
    evidence_of,
    range_text,
)
from kwinspect.model import Exchange
from kwinspect.protocol.apis import api_name
from kwinspect.protocol.schema.api_keys import ApiKey

API_VERSIONS = int(ApiKey.API_VERSIONS)
UNSUPPORTED_VERSION = 35
# A client this many versions below the broker's highest is "stuck on an old version".
OLD_VERSION_GAP = 3
# Bounded state: connections and brokers remembered.
MAX_STREAMS = 100_000
# Distinct advertised-version maps kept to be shared: every connection to a broker gets
# the same ~60 ranges, and a map per connection (by_stream) was ~3 KB each.
MAX_RANGE_MAPS = 1_000


# ApiVersions key lists remembered (one per length) with the ranges read from them.
MAX_LISTS_READ = 64


def _read_ranges(api_keys: list | tuple) -> dict[int, tuple[int, int]]:
    """api key -> (min, max version) of an ApiVersions response's entries that hold ints."""
    ranges = {}
    for k in api_keys:
        if type(k) is dict or isinstance(k, dict):
            # as_int's test written out: ~60 entries on every connection (plain ints first:
            # `type(x) is int` leaves out bool as the isinstance pair below does)
            key, lo, hi = k.get("api_key"), k.get("min_version"), k.get("max_version")
            if type(key) is int and type(lo) is int and type(hi) is int:
                ranges[key] = (lo, hi)
            elif (isinstance(key, int) and isinstance(lo, int) and isinstance(hi, int)
                    and not isinstance(key, bool) and not isinstance(lo, bool) and not isinstance(hi, bool)):
                ranges[key] = (lo, hi)
    return ranges


def _copied(api_keys: list | tuple) -> list:
    """The entries as they are now (a later change to the decoded body cannot change them)."""
    return [dict(k) if isinstance(k, dict) else k for k in api_keys]


class NegotiationAnalyzer(FindingTable):
    def __init__(self) -> None:
        self.by_stream: dict[str, dict[int, tuple[int, int]]] = {}
        self.by_broker: dict[str, dict[int, tuple[int, int]]] = {}
        self.fallbacks: dict[str, list[Any]] = {}  # stream -> [ (evidence, asked version, broker range) ]
        self.closed_by: dict[str, str] = {}  # stream -> "client" | "broker" (the Diagnoser shares its own)
        self.fallback_ok: dict[str, int] = {}  # stream -> version that then succeeded
        self.findings: dict[tuple, Finding] = {}
        self.used: dict[tuple[str, str, int], tuple[int, Evidence]] = {}  # (client, broker, api) -> max version
        self.broker_max: dict[tuple[str, int], int] = {}
        self.negotiated: set[tuple[str, str]] = set()  # (client, broker) with a successful ApiVersions
        self._range_maps: dict[tuple, dict[int, tuple[int, int]]] = {}  # its items -> the one shared map
        self._fallback_ranges: dict[tuple[int, int], tuple[int, int]] = {}  # equal ranges kept once
        self._lists_read: dict[int, tuple[list, dict[int, tuple[int, int]]]] = {}  # length -> (entries, ranges)

    def on_exchange(self, ex: Exchange) -> None:
        if ex.api_key is None or ex.api_version is None or ex.request is None:
            return
        body = ex.response.body if ex.response is not None else None
        if ex.api_key == API_VERSIONS:
            self._api_versions(ex, body)
            return
        rng_map = self.by_stream.get(ex.stream) or self.by_broker.get(ex.broker)
        name = ex.api_name or f"api key {ex.api_key} (unknown)"
        if rng_map is not None:
            rng = rng_map.get(ex.api_key)
            if rng is None or not rng[0] <= ex.api_version <= rng[1]:
                where = "on this connection" if ex.stream in self.by_stream else "on other connections"
                self._add(("version_not_advertised", client_label(ex), ex.broker, ex.api_key, ex.api_version),
                          ERROR, f"{name} v{ex.api_version} sent, but the broker advertised "
                          + (f"{name} {range_text(rng)}" if rng else "no version of it"),
                          f"Client {client_label(ex)} sent {name} v{ex.api_version} to {ex.broker}, whose "
                          f"ApiVersions response ({where}) advertised {range_text(rng)}. The client ignored or "
                          "never asked for the broker's ranges (e.g. a pinned api_version setting); brokers may "
                          "close the connection or answer UNSUPPORTED_VERSION.",
                          ex, client_id=ex.client_id, broker=ex.broker, api_name=ex.api_name,
                          api_version=ex.api_version, advertised=list(rng) if rng else None)
            else:
                k = (client_label(ex), ex.broker, ex.api_key)
                prev = self.used.get(k)
                if prev is None or prev[0] < ex.api_version:
                    if prev is not None or len(self.used) < MAX_STREAMS:
                        self.used[k] = (ex.api_version, evidence_of(ex))
                self.broker_max[(ex.broker, ex.api_key)] = rng[1]
        if UNSUPPORTED_VERSION in ex.error_codes:
            rng = (rng_map or {}).get(ex.api_key)
            inside = rng is not None and rng[0] <= ex.api_version <= rng[1]
            why = ("The version is inside the advertised range, so the broker rejects something the request "
                   "carries (for example a message format or compression it does not accept at this version)."
                   if inside else "Upgrade the client or the broker, or let the client negotiate versions.")
            self._add(("unsupported_version", client_label(ex), ex.broker, ex.api_key, ex.api_version),
                      ERROR, f"{name} v{ex.api_version} rejected with UNSUPPORTED_VERSION "
                      f"(broker advertised {range_text(rng) if rng_map is not None else 'unknown'})",
                      f"Client {client_label(ex)} -> {ex.broker}: {name} v{ex.api_version}; broker range "
                      f"{range_text(rng) if rng_map is not None else 'unknown (no ApiVersions seen)'}. " + why,
                      ex, client_id=ex.client_id, broker=ex.broker, api_name=ex.api_name,
                      api_version=ex.api_version, advertised=list(rng) if rng else None)

    def _api_versions(self, ex: Exchange, body: dict | None) -> None:
        if not isinstance(body, dict) or not body:
            return
        code = body.get("error_code")
        api_keys = as_list(body.get("api_keys"))
        # Every connection to a broker is given the same list (as equal copies): a list equal
        # to one already read has the same ranges, found by one comparison in C instead of a
        # walk over its ~60 entries (one list kept per length: the full list and the short
        # one of an UNSUPPORTED_VERSION answer).
        cached = self._lists_read.get(len(api_keys))
        if cached is not None and cached[0] == api_keys:
            ranges = cached[1]
        else:
            ranges = _read_ranges(api_keys)
            if ranges:
                # the maps are only read: connections given the same ranges share one
                shared = self._range_maps.get(items := tuple(ranges.items()))
                if shared is not None:
                    ranges = shared
                elif len(self._range_maps) < MAX_RANGE_MAPS:
                    self._range_maps[items] = ranges
            if cached is not None or len(self._lists_read) < MAX_LISTS_READ:
                self._lists_read[len(api_keys)] = (_copied(api_keys), ranges)
        if code == 0 and ranges:
            if len(self.by_stream) < MAX_STREAMS:
                self.by_stream[ex.stream] = ranges
            self.by_broker[ex.broker] = ranges
            if ex.stream in self.fallbacks:
                self.fallback_ok[ex.stream] = ex.api_version
            self.negotiated.add((client_label(ex), ex.broker))
        elif code == UNSUPPORTED_VERSION and len(self.fallbacks) < MAX_STREAMS:
            brange = ranges.get(API_VERSIONS)
            if brange is not None:  # a (min, max) per connection, nearly always one of a few: kept once
                shared = self._fallback_ranges.get(brange)
                if shared is not None:
                    brange = shared
                elif len(self._fallback_ranges) < MAX_RANGE_MAPS:
                    self._fallback_ranges[brange] = brange
            self.fallbacks.setdefault(ex.stream, []).append((evidence_of(ex), ex.api_version, brange,
                                                            client_label(ex), ex.broker))

    def results(self) -> list[Finding]:
        out = list(self.findings.values())
        # ApiVersions fallbacks: one finding per (asked version, version that worked)
        groups: dict[tuple, Finding] = {}
        failed_streams: dict[tuple, set[str]] = {}  # (client, broker) -> streams that never negotiated
        for stream, items in self.fallbacks.items():
            if self.fallback_ok.get(stream) is None:
                for _ev, _asked, _brange, client, broker in items:
                    if (client, broker) not in self.negotiated:
                        failed_streams.setdefault((client, broker), set()).add(stream)
        for stream, items in self.fallbacks.items():
            ok = self.fallback_ok.get(stream)
            for ev, asked, brange, client, broker in items:
                failed = ok is None and (client, broker) not in self.negotiated
                closed = (failed and self.closed_by.get(stream) == "client"
                          and len(failed_streams.get((client, broker), ())) == 1)
                k = (asked, ok, failed) if not failed else (asked, client, broker, closed)
                f = groups.get(k)
                if f is None:
                    if closed:
                        f = Finding("apiversions_failed", INFO,
                                    f"{client}: ApiVersions v{asked} answered UNSUPPORTED_VERSION, then the client "
                                    f"closed its connection to {broker} before retrying",
                                    f"Client {client} closed the connection itself right after the rejection and "
                                    "did not try again: most likely it was shutting down. Repeated, this would be "
                                    "a warning.",
                                    key={"client_id": client, "broker": broker, "asked": asked})
                    elif ok is not None or not failed:
                        f = Finding("apiversions_fallback", INFO,
                                    f"ApiVersions v{asked} answered UNSUPPORTED_VERSION; clients fell back to a "
                                    "lower version (normal negotiation)",
                                    f"Clients asked for ApiVersions v{asked}; the broker supports ApiVersions "
                                    f"{range_text(brange) if brange else '(range not decodable)'} and the clients "
                                    "retried with a lower version, which succeeded. This is the normal KIP-511 "
                                    "fallback, costing one round trip per connection.",
                                    key={"asked": asked, "used": ok, "clients": [], "brokers": []})
                    else:
                        f = Finding("apiversions_failed", WARNING,
                                    f"{client}: ApiVersions v{asked} answered UNSUPPORTED_VERSION and no ApiVersions "
                                    f"with {broker} ever succeeded",
                                    f"Client {client} never completed version negotiation with {broker}: it gave "
                                    "up, or the broker also rejected the lower versions.",
                                    key={"client_id": client, "broker": broker, "asked": asked})
                    groups[k] = f
                for name, value in (("clients", client), ("brokers", broker)):
                    lst = f.key.get(name)
                    if isinstance(lst, list) and value not in lst and len(lst) < 50:
                        lst.append(value)
                f.add(ev)
        out.extend(groups.values())
        old: dict[tuple, Finding] = {}
        for k, (ver, ev) in self.used.items():
            client, broker, api_key = k
            top = self.broker_max.get((broker, api_key))
            if top is None or top - ver < OLD_VERSION_GAP:
                continue
            name = api_name(api_key)
            f = old.get((client, api_key))
            if f is None:
                f = old[(client, api_key)] = Finding(
                    "old_version", INFO, f"{client} uses {name} v{ver}; the broker supports up to v{top}",
                    f"The highest {name} version client {client} used is {top - ver} versions below the "
                    "broker's maximum: an old client library or a pinned protocol version. Newer versions "
                    "bring fixes and features (e.g. idempotence, topic ids).",
                    key={"client_id": client, "api_name": name, "api_version": ver, "broker_max": top,
                         "brokers": []})
                out.append(f)
            if broker not in f.key["brokers"]:
                f.key["brokers"].append(broker)
            f.add(ev)
        return out
