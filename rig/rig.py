"""The rig: brokers shared by scenarios, unique names, and capture plumbing.

A `Rig` lazily starts one 3-broker librdkafka mock cluster and one tansu
broker and keeps them until `close()`.  Scenarios that change broker state
(injected errors, narrowed versions, added latency) ask for a private broker
instead.  Topic and group names are unique within a rig, so scenarios that
share a broker never see each other's data (the mock is slow to rejoin a
reused group id).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rig.mock_cluster import MockCluster, librdkafka_version
from rig.tansu import TansuBroker, tansu_version
from rig.tcpdump import Tcpdump, tcpdump_version


class Rig:
    def __init__(self, log_dir: str | None = None, *, netns_info: dict[str, Any] | None = None) -> None:
        self._mock: MockCluster | None = None
        self._tansu: TansuBroker | None = None
        self._private: list[Any] = []
        self._names: Counter[str] = Counter()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="kwinspect-rig-")
        # Set when this process runs inside a namespace made by netns.py.
        self.netns_info = netns_info

    # -- brokers -----------------------------------------------------------
    def mock(self) -> MockCluster:
        """The shared 3-broker mock cluster."""
        if self._mock is None:
            self._mock = MockCluster(3)
        return self._mock

    def tansu(self) -> TansuBroker:
        """The shared tansu broker."""
        if self._tansu is None:
            self._tansu = TansuBroker(log_path=os.path.join(self.log_dir, "tansu.log")).start()
        return self._tansu

    @contextlib.contextmanager
    def private_mock(self, brokers: int = 3) -> Iterator[MockCluster]:
        mc = MockCluster(brokers)
        self._private.append(mc)
        try:
            yield mc
        finally:
            mc.close()
            self._private.remove(mc)

    @contextlib.contextmanager
    def private_tansu(self, host: str = "127.0.0.1") -> Iterator[TansuBroker]:
        tb = TansuBroker(host=host, log_path=os.path.join(self.log_dir, "tansu-private.log"))
        tb.start()
        self._private.append(tb)
        try:
            yield tb
        finally:
            tb.stop()
            self._private.remove(tb)

    def close(self) -> None:
        for obj in list(self._private):
            with contextlib.suppress(Exception):
                obj.close()
        self._private.clear()
        if self._mock is not None:
            self._mock.close()
            self._mock = None
        if self._tansu is not None:
            self._tansu.stop()
            self._tansu = None

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names and captures -------------------------------------------------
    def name(self, base: str) -> str:
        """`base` the first time, then `base-2`, `base-3`, ...: unique within this rig."""
        self._names[base] += 1
        n = self._names[base]
        return base if n == 1 else f"{base}-{n}"

    def tcpdump(self, pcap: str, ports: list[int]) -> Tcpdump:
        return Tcpdump(pcap, ports)

    def environment(self) -> dict[str, Any]:
        import confluent_kafka
        import kafka

        env: dict[str, Any] = {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "confluent_kafka": (confluent_kafka.version() if isinstance(confluent_kafka.version(), str)
                                else confluent_kafka.version()[0]),
            "librdkafka": librdkafka_version(),
            "kafka_python": kafka.__version__,
            "tcpdump": tcpdump_version(),
        }
        if self._tansu is not None or any(isinstance(p, TansuBroker) for p in self._private):
            env["tansu"] = tansu_version()
        return env
