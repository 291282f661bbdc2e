"""librdkafka's mock cluster, driven through ctypes.

The confluent-kafka wheel bundles librdkafka, and librdkafka contains a small
in-process Kafka "cluster" (rdkafka_mock.h) used by its own test-suite.  Its
brokers are real TCP listeners on 127.0.0.1 with random ports, so real clients
(confluent-kafka, kafka-python, kcat) can talk to them and tcpdump can capture
the traffic.  Everything runs inside this Python process (librdkafka threads).

Known quirks (see DESIGN.md section 4): ApiVersions only up to v2, no
CreateTopics/ListGroups/DescribeGroups, acks=0 produce requests are still
answered, roughly 5 MB kept per partition, rejoining a reused group id is slow
(use fresh group ids), and `set_controller_id` is needed or admin calls wait
forever for a controller.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from collections.abc import Iterable

# rd_kafka_type_t
_RD_KAFKA_PRODUCER = 0

# Error codes used by scenarios (rd_kafka_resp_err_t == Kafka error codes for >= 0).
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
NOT_COORDINATOR = 16
COORDINATOR_LOAD_IN_PROGRESS = 14
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
TRANSPORT = -195  # RD_KAFKA_RESP_ERR__TRANSPORT: the mock broker drops the connection

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def librdkafka_path() -> str:
    """Path of the librdkafka shared object bundled in the confluent-kafka wheel."""
    import confluent_kafka  # the wheel we depend on; its .so is what cimpl links

    pkg_dir = os.path.dirname(confluent_kafka.__file__)
    site = os.path.dirname(pkg_dir)
    patterns = [
        os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*"),
        os.path.join(pkg_dir, ".libs", "librdkafka*.so*"),
        os.path.join(pkg_dir, "librdkafka*.so*"),
        os.path.join(site, "confluent_kafka.libs", "librdkafka*.dylib"),
    ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError(
        "librdkafka not found next to confluent_kafka; is the confluent-kafka wheel installed?"
    )


def _load() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        # Import cimpl first so the dynamic loader has the very same copy mapped.
        import confluent_kafka  # noqa: F401

        lib = ctypes.CDLL(librdkafka_path())
        vp, cp, i16, i32, i64 = (
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64,
        )
        sigs = {
            "rd_kafka_conf_new": (vp, []),
            "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
            "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
            "rd_kafka_destroy": (None, [vp]),
            "rd_kafka_version_str": (cp, []),
            "rd_kafka_err2name": (cp, [ctypes.c_int]),
            "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
            "rd_kafka_mock_cluster_destroy": (None, [vp]),
            "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
            "rd_kafka_mock_set_controller_id": (ctypes.c_int, [vp, i32]),
            "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
            "rd_kafka_mock_topic_set_error": (None, [vp, cp, ctypes.c_int]),
            "rd_kafka_mock_push_request_errors_array": (
                None, [vp, i16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
            ),
            "rd_kafka_mock_clear_request_errors": (None, [vp, i16]),
            "rd_kafka_mock_broker_set_rtt": (ctypes.c_int, [vp, i32, ctypes.c_int]),
            "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, i32]),
            "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, i32]),
            "rd_kafka_mock_set_apiversion": (ctypes.c_int, [vp, i16, i16, i16]),
            "rd_kafka_mock_partition_set_leader": (ctypes.c_int, [vp, cp, i32, i32]),
            "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [vp, i32]),
            "rd_kafka_mock_coordinator_set": (ctypes.c_int, [vp, cp, cp, i32]),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        del i64
        _lib = lib
        return lib


def librdkafka_version() -> str:
    return _load().rd_kafka_version_str().decode()


class MockCluster:
    """A librdkafka mock cluster with `brokers` brokers on 127.0.0.1.

    Use as a context manager, or call `close()`; closing twice is harmless.
    Broker ids are 1..brokers.
    """

    kind = "librdkafka-mock"

    def __init__(self, brokers: int = 3, *, initial_rebalance_delay_ms: int = 0) -> None:
        self._lib = _load()
        self._rk: int | None = None
        self._mc: int | None = None
        self.broker_count = brokers
        err = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle only does book-keeping; keep it quiet and unconnected.
        for key, value in (("log_level", "3"),):
            self._lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), err, len(err))
        rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, err, len(err))
        if not rk:
            raise RuntimeError(f"rd_kafka_new failed: {err.value.decode(errors='replace')}")
        self._rk = rk
        mc = self._lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            self._lib.rd_kafka_destroy(rk)
            self._rk = None
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self._mc = mc
        # Without a controller, admin requests wait for one forever.
        self._lib.rd_kafka_mock_set_controller_id(mc, 1)
        # The mock delays the first join of a group by 3 s by default; scenarios
        # want the join/sync exchange, not the wait.
        self._lib.rd_kafka_mock_group_initial_rebalance_delay_ms(mc, initial_rebalance_delay_ms)
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(mc).decode()
        self.ports: list[int] = [int(hp.rsplit(":", 1)[1]) for hp in self.bootstrap_servers.split(",")]
        self.host = self.bootstrap_servers.split(",")[0].rsplit(":", 1)[0]

    # -- lifecycle ---------------------------------------------------------
    def close(self) -> None:
        if self._mc:
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def _handle(self) -> int:
        if not self._mc:
            raise RuntimeError("mock cluster is closed")
        return self._mc

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self._lib.rd_kafka_err2name(rc).decode()
            raise RuntimeError(f"{what} failed: {name} ({rc})")

    # -- configuration -----------------------------------------------------
    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1) -> None:
        rc = self._lib.rd_kafka_mock_topic_create(
            self._handle(), topic.encode(), partitions, replication_factor
        )
        self._check(rc, f"rd_kafka_mock_topic_create({topic})")

    def set_topic_error(self, topic: str, err: int) -> None:
        self._lib.rd_kafka_mock_topic_set_error(self._handle(), topic.encode(), err)

    def push_request_errors(self, api_key: int, errors: Iterable[int]) -> None:
        """The next len(errors) requests of `api_key` (to any broker) fail with these codes."""
        errs = list(errors)
        arr = (ctypes.c_int * len(errs))(*errs)
        self._lib.rd_kafka_mock_push_request_errors_array(self._handle(), api_key, len(errs), arr)

    def clear_request_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of `broker_id` (-1: all brokers) by rtt_ms."""
        self._check(self._lib.rd_kafka_mock_broker_set_rtt(self._handle(), broker_id, rtt_ms),
                    "rd_kafka_mock_broker_set_rtt")

    def set_down(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._handle(), broker_id),
                    "rd_kafka_mock_broker_set_down")

    def set_up(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._handle(), broker_id),
                    "rd_kafka_mock_broker_set_up")

    def set_apiversion(self, api_key: int, min_version: int, max_version: int) -> None:
        """Narrow the advertised version range of `api_key` (-1, -1 disables it)."""
        self._check(
            self._lib.rd_kafka_mock_set_apiversion(self._handle(), api_key, min_version, max_version),
            "rd_kafka_mock_set_apiversion",
        )

    def set_partition_leader(self, topic: str, partition: int, broker_id: int) -> None:
        self._check(
            self._lib.rd_kafka_mock_partition_set_leader(
                self._handle(), topic.encode(), partition, broker_id
            ),
            "rd_kafka_mock_partition_set_leader",
        )

    def set_coordinator(self, key_type: str, key: str, broker_id: int) -> None:
        """key_type is "group" or "transaction"."""
        self._check(
            self._lib.rd_kafka_mock_coordinator_set(
                self._handle(), key_type.encode(), key.encode(), broker_id
            ),
            "rd_kafka_mock_coordinator_set",
        )

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "software": f"librdkafka {librdkafka_version()} mock cluster",
            "brokers": self.broker_count,
            "host": self.host,
            "ports": list(self.ports),
            "bootstrap_servers": self.bootstrap_servers,
        }
