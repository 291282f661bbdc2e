"""Kafka over TLS with the clients' key logs (issue #19): kafka-python talks real TLS
(Python's ssl, OpenSSL) to rig.tlsproxy in front of tansu, and writes its secrets with
``SSLContext.keylog_filename``, as SSLKEYLOGFILE would.

Only the proxy's port is captured, so every Kafka exchange in the file is inside TLS.
Next to ``NAME.pcap`` and its manifest:

- ``NAME.keys``: the NSS key log of every client (what ``--tls-keylog`` reads);
- ``NAME.some.keys``: the producer's secrets only (its connections decrypt, the
  consumer's stay "TLS, not decoded" with the reason);
- ``tansu-tls13-dsb.pcap`` (pcapng despite the name, so the golden pins take it): the
  TLS 1.3 capture with its key log injected as a Decryption Secrets Block by
  ``editcap --inject-secrets`` (written by the rig itself when editcap is absent).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import ssl
import struct
import subprocess
import tempfile
from typing import Any

from rig.manifest import Manifest
from rig.rig import Rig
from rig.scenarios import _ProxiedBroker, kp_consume, kp_produce, recording, standard_items


class _ProxyOnly(_ProxiedBroker):
    """Only the TLS port is captured: every exchange of the file is inside TLS."""

    def describe(self) -> dict:
        d = super().describe()
        d["ports"] = [self.proxy.port]
        d["broker_port"] = self.tb.port
        return d


def _client_context(version: ssl.TLSVersion, keylog: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the proxy's certificate is a throw-away self-signed one
    ctx.maximum_version = version
    ctx.keylog_filename = keylog
    return ctx


def _tls_keylog(name: str, version: ssl.TLSVersion, rig: Rig, workdir: str) -> Manifest:
    from rig.tansu import TansuBroker, free_port
    from rig.tlsproxy import TlsProxy, make_self_signed

    certdir = tempfile.mkdtemp(prefix="kwinspect-tls-")
    cert, key = make_self_signed(certdir)
    broker_port = free_port()
    label = "TLS 1.3" if version == ssl.TLSVersion.TLSv1_3 else "TLS 1.2"
    keylogs = {role: os.path.join(certdir, f"{role}.keys") for role in ("producer", "consumer")}
    with TlsProxy(("127.0.0.1", broker_port), cert, key) as proxy:
        tb = TansuBroker(broker_port, advertised_port=proxy.port,
                         log_path=os.path.join(rig.log_dir, f"{name}.log"))
        tb.start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            topic = "tls-keylog-topic"
            bootstrap = f"127.0.0.1:{proxy.port}"
            admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "setup-admin",
                                 "security.protocol": "SSL", "ssl.ca.location": cert,
                                 "ssl.endpoint.identification.algorithm": "none"})
            for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                fut.result(15)
            del admin
            gc.collect()
            with recording(rig, workdir, name,
                           f"{label} with key logs: a kafka-python producer writes 8 records and a "
                           "kafka-python consumer (assign()) reads them back over real TLS (Python ssl) "
                           "to a TLS-terminating proxy (rig.tlsproxy) in front of tansu; the clients log "
                           "their secrets with SSLContext.keylog_filename. Only the proxy port is "
                           f"captured. {name}.keys holds every client's secrets, {name}.some.keys "
                           "only the producer's.",
                           _ProxyOnly(tb, proxy)) as m:
                m.add_topic(topic, 1, "CreateTopics (before the capture)")
                m.tls_ports = [proxy.port]
                items = standard_items(topic, 8)
                for it in items:
                    it["partition"] = 0
                common: dict[str, Any] = {"security_protocol": "SSL"}
                kp_produce(m, bootstrap, "tls-kp-producer", items,
                           extra={**common, "ssl_context": _client_context(version, keylogs["producer"])})
                kp_consume(m, bootstrap, "tls-kp-consumer", expected=8, assign=[(topic, 0)],
                           extra={**common, "ssl_context": _client_context(version, keylogs["consumer"])})
                for c in m.clients:  # an SSLContext is no manifest value
                    c.config["ssl_context"] = f"ssl.SSLContext(maximum_version={label}, keylog_filename=...)"
                m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch")
                m.notes.append(f"Decode with --tls-keylog captures/{name}.keys; without it every "
                               "connection is a tls_stream row (TLS, not decoded).")
        finally:
            tb.stop()
    with open(keylogs["producer"]) as f:
        producer_keys = f.read()
    with open(keylogs["consumer"]) as f:
        consumer_keys = f.read()
    with open(os.path.join(workdir, f"{name}.keys"), "w") as f:
        f.write(producer_keys + consumer_keys)
    with open(os.path.join(workdir, f"{name}.some.keys"), "w") as f:
        f.write(producer_keys)
    shutil.rmtree(certdir, ignore_errors=True)
    return m


def tansu_tls13_keylog(rig: Rig, workdir: str) -> Manifest:
    """kafka-python over TLS 1.3 to a proxy in front of tansu, with the clients' key logs."""
    m = _tls_keylog("tansu-tls13-keylog", ssl.TLSVersion.TLSv1_3, rig, workdir)
    _inject_secrets(os.path.join(workdir, "tansu-tls13-keylog.pcap"),
                    os.path.join(workdir, "tansu-tls13-keylog.keys"),
                    os.path.join(workdir, "tansu-tls13-dsb.pcap"))
    write_dsb_manifest(workdir)
    return m


def write_dsb_manifest(workdir: str) -> None:
    """tansu-tls13-dsb's manifest: the same traffic as tansu-tls13-keylog's."""
    with open(os.path.join(workdir, "tansu-tls13-keylog.manifest.json")) as f:
        d = json.load(f)
    d["scenario"] = "tansu-tls13-dsb"
    d["pcap"] = "tansu-tls13-dsb.pcap"
    d["description"] = ("tansu-tls13-keylog.pcap as pcapng with tansu-tls13-keylog.keys injected as a "
                        "Decryption Secrets Block (editcap --inject-secrets tls,KEYS); no key log file "
                        "is needed to decode it. " + d["description"])
    d["notes"] = [n for n in d.get("notes", []) if "--tls-keylog" not in n] + [
        "The key material is inside the file: decoded without --tls-keylog, as Wireshark does."]
    with open(os.path.join(workdir, "tansu-tls13-dsb.manifest.json"), "w") as f:
        json.dump(d, f, indent=1)
        f.write("\n")


def tansu_tls12_keylog(rig: Rig, workdir: str) -> Manifest:
    """kafka-python over TLS 1.2 to a proxy in front of tansu, with the clients' key logs."""
    return _tls_keylog("tansu-tls12-keylog", ssl.TLSVersion.TLSv1_2, rig, workdir)


def _inject_secrets(pcap: str, keys: str, out: str) -> None:
    """The capture as pcapng with the key log in a Decryption Secrets Block."""
    editcap = shutil.which("editcap")
    if editcap is not None:
        subprocess.run([editcap, "-F", "pcapng", "--inject-secrets", f"tls,{keys}", pcap, out],
                       check=True, capture_output=True, timeout=60)
        return
    import dpkt

    with open(pcap, "rb") as f, open(keys, "rb") as k, open(out, "wb") as o:
        reader = dpkt.pcap.Reader(f)
        w = dpkt.pcapng.Writer(o, linktype=reader.datalink())
        data = k.read()
        pad = (-len(data)) % 4
        blen = 20 + len(data) + pad
        o.write(struct.pack("<IIII", 0x0A, blen, 0x544C534B, len(data)) + data + b"\0" * pad
                + struct.pack("<I", blen))
        for ts, buf in reader:
            w.writepkt(buf, ts=ts)


SCENARIOS = {
    "tansu-tls13-keylog": tansu_tls13_keylog,
    "tansu-tls12-keylog": tansu_tls12_keylog,
}
