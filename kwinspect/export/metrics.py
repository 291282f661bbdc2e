"""`kwinspect live --metrics`: the stats series as a Prometheus/OpenMetrics endpoint.

The observations come from analyze/stats.SeriesObserver, the same that `kwinspect
stats` sums per interval, so a scrape's totals equal `kwinspect stats` (and
`kwinspect summary`) of the packets the same run wrote with ``-w``. Counters for
counts and sums (``_total``, base units: seconds, bytes), a histogram for latency
(the stats table's bucket bounds, in seconds), gauges for lag, and the capture's own
counters (packets, kernel drops) read at each scrape.

Labels are bounded twice: per dimension (the observer's caps, ``(other)`` past them)
and per metric (``MAX_SERIES``: past it, new label sets are counted in one series
whose labels are all ``(other)``), so a hostile capture cannot grow the registry.

prometheus_client is imported here only (the `live` extra).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import start_http_server

from kwinspect.analyze.stats import (
    DIMENSIONS,
    LATENCY_BUCKETS_MS,
    OTHER,
    SERIES,
    Observation,
    SeriesObserver,
)
from kwinspect.model import Exchange

METRICS_LABEL_CAP = 100  # distinct values per dimension (api, version, broker, client_id, topic, group)
MAX_SERIES = 10_000  # label sets per metric
# dimension -> Prometheus label name
LABELS = {"api_name": "api", "api_version": "version", "broker": "broker", "client_id": "client_id",
          "topic": "topic", "partition": "partition", "group_id": "group"}
_INDEX = {d: i for i, d in enumerate(DIMENSIONS)}

# series -> (metric name without _total, Prometheus type, scale to base units, help)
METRICS: dict[str, tuple[str, str, float, str]] = {
    "requests": ("kwinspect_requests", "counter", 1, "Kafka requests (exchanges) of any status"),
    "errors": ("kwinspect_request_errors", "counter", 1, "exchanges whose response carried a Kafka error code"),
    "unanswered": ("kwinspect_requests_unanswered", "counter", 1,
                   "requests never answered (connection or capture ended first)"),
    "latency": ("kwinspect_request_duration_seconds", "histogram", 1e-3,
                "request's last byte to response's first byte, paired exchanges, Fetch long polls left out"),
    "long_polls": ("kwinspect_fetch_long_polls", "counter", 1, "Fetches that waited for data and got none"),
    "long_poll_wait_ms": ("kwinspect_fetch_long_poll_wait_seconds", "counter", 1e-3, "time long polls waited"),
    "produced_records": ("kwinspect_produced_records", "counter", 1, "records in Produce requests"),
    "produced_bytes": ("kwinspect_produced_bytes", "counter", 1, "record-set bytes in Produce requests"),
    "fetched_records": ("kwinspect_fetched_records", "counter", 1, "records in Fetch responses"),
    "fetched_bytes": ("kwinspect_fetched_bytes", "counter", 1, "record-set bytes in Fetch responses"),
    "throttled": ("kwinspect_throttled_responses", "counter", 1, "responses with throttle_time_ms above 0"),
    "throttle_time_ms": ("kwinspect_throttle_seconds", "counter", 1e-3, "throttle time the brokers asked for"),
    "connections_opened": ("kwinspect_connections_opened", "counter", 1, "Kafka connections opened (SYN seen)"),
    "connections_closed": ("kwinspect_connections_closed", "counter", 1, "Kafka connections closed (FIN or RST)"),
    "connections_refused": ("kwinspect_connections_refused", "counter", 1,
                            "connection attempts a broker answered with RST"),
    "consumer_lag": ("kwinspect_consumer_lag_records", "gauge", 1,
                     "high watermark minus the group's committed offset"),
    "fetch_lag": ("kwinspect_fetch_lag_records", "gauge", 1,
                  "high watermark minus the fetch position of the client's last Fetch"),
}


def parse_listen(text: str) -> tuple[str, int]:
    """'9464', ':9464', '0.0.0.0:9464', '[::1]:9464', 'localhost:0' -> (host, port); the host
    defaults to 127.0.0.1 (metrics name topics and clients: exposing them is a choice)."""
    host, port = "127.0.0.1", text.strip()
    if port.startswith("["):
        end = port.find("]")
        if end < 0 or port[end + 1:end + 2] != ":":
            raise ValueError(f"not [HOST]:PORT: {text!r}")
        host, port = port[1:end], port[end + 2:]
    elif ":" in port:
        h, port = port.rsplit(":", 1)
        host = h or host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not a port: {text!r} (expected [HOST:]PORT, e.g. 9464 or 0.0.0.0:9464)")
    return host, int(port)


class _CaptureCollector:
    """The capture's counters, read when scraped (plain ints, written by the capture thread)."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self.read = read

    def collect(self) -> Any:
        values = self.read()
        for name, help_text in (("packets", "packets captured and decoded"),
                                ("dropped_packets", "packets the kernel dropped (receive buffer full)"),
                                ("received_packets", "packets the kernel's filter accepted")):
            family = CounterMetricFamily(f"kwinspect_capture_{name}", help_text)
            family.add_metric([], float(values.get(name, 0)))
            yield family


class MetricsExporter:
    """Observations into a Prometheus registry; ``serve(host, port)`` starts the endpoint.

        exporter = MetricsExporter(capture=lambda: {"packets": ..., "dropped_packets": ...})
        exporter.serve("127.0.0.1", 9464)
        exporter.add(exchange, topic_names)      # from the capture loop
        exporter.add_connection(info)            # the dissector's on_close hook
        exporter.close()
    """

    def __init__(self, label_cap: int = METRICS_LABEL_CAP, kafka_ports: frozenset[int] = frozenset(),
                 capture: Callable[[], Mapping[str, int]] | None = None, max_series: int = MAX_SERIES) -> None:
        disable_created_metrics()  # no *_created series beside each counter: half the cardinality
        self.registry = CollectorRegistry()
        self.observer = SeriesObserver(label_cap)
        self.kafka_ports = kafka_ports
        self.max_series = max_series
        # label values -> the metric's child, per series (a dict lookup instead of .labels() each time)
        self._children: dict[str, dict[tuple, Any]] = {name: {} for name in METRICS}
        self.folded = 0  # observations counted under all-(other) labels (MAX_SERIES reached)
        self._metrics: dict[str, Any] = {}
        self._dims: dict[str, tuple[int, ...]] = {}
        for series, (name, kind, _scale, help_text) in METRICS.items():
            dims = SERIES[series].dims
            labels = [LABELS[d] for d in dims]
            self._dims[series] = tuple(_INDEX[d] for d in dims)
            if kind == "counter":
                self._metrics[series] = Counter(name, help_text, labels, registry=self.registry)
            elif kind == "gauge":
                self._metrics[series] = Gauge(name, help_text, labels, registry=self.registry)
            else:
                buckets = [b / 1000 for b in LATENCY_BUCKETS_MS] + [float("inf")]
                self._metrics[series] = Histogram(name, help_text, labels, buckets=buckets,
                                                  registry=self.registry)
        if capture is not None:
            self.registry.register(_CaptureCollector(capture))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Start the HTTP endpoint in a daemon thread; returns the (host, port) bound
        (port 0 picks a free one). OSError when the address cannot be bound."""
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        bound = self._server.server_address
        self.address = (host, int(bound[1]))
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _child(self, obs: Observation) -> Any:
        """The metric's child for the observation's label values (all ``(other)`` once the
        metric has MAX_SERIES label sets)."""
        children = self._children[obs.series]
        child = children.get(obs.dims)  # (keyed by the raw values: no strings made per observation)
        if child is not None:
            return child
        if len(children) >= self.max_series:
            self.folded += 1
            key: tuple = (OTHER,)
            values = tuple(OTHER for _ in self._dims[obs.series])
        else:
            key = obs.dims
            values = tuple("" if obs.dims[i] is None else str(obs.dims[i]) for i in self._dims[obs.series])
        child = children.get(key)
        if child is None:
            metric = self._metrics[obs.series]
            child = children[key] = metric.labels(*values) if values else metric
        return child

    def _take(self, observations: list[Observation]) -> None:
        for obs in observations:
            _name, kind, scale, _help = METRICS[obs.series]
            child = self._child(obs)
            if kind == "counter":
                if obs.value > 0:  # (prometheus_client refuses to decrease a counter)
                    child.inc(obs.value * scale)
            elif kind == "gauge":
                child.set(obs.value * scale)
            else:
                child.observe(obs.value * scale)

    def add(self, ev: Any, topic_names: Mapping[str, str] | None = None) -> None:
        if isinstance(ev, Exchange):
            self._take(self.observer.exchange(ev, topic_names))

    def add_connection(self, info: Any) -> None:
        self._take(self.observer.connection(info, self.kafka_ports))


__all__ = ["LABELS", "MAX_SERIES", "METRICS", "METRICS_LABEL_CAP", "MetricsExporter", "parse_listen"]
