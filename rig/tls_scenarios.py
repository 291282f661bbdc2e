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

import base64
import contextlib
import gc
import json
import os
import shutil
import ssl
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from rig.manifest import ClientInfo, Manifest, RecordTruth
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


@contextlib.contextmanager
def _tls_tansu(name: str, rig: Rig, topic: str | None) -> Iterator[tuple[Any, Any, str]]:
    """tansu behind rig.tlsproxy, with `topic` (1 partition, if given) made before the capture:
    yields (proxy, broker, CA certificate path)."""
    from rig.tansu import TansuBroker, free_port
    from rig.tlsproxy import TlsProxy, make_self_signed

    certdir = tempfile.mkdtemp(prefix="kwinspect-tls-")
    cert, key = make_self_signed(certdir)
    broker_port = free_port()
    try:
        with TlsProxy(("127.0.0.1", broker_port), cert, key) as proxy:
            tb = TansuBroker(broker_port, advertised_port=proxy.port,
                             log_path=os.path.join(rig.log_dir, f"{name}.log"))
            tb.start()
            try:
                if topic is not None:
                    create_tls_topic(proxy.port, cert, topic)
                yield proxy, tb, cert
            finally:
                tb.stop()
    finally:
        shutil.rmtree(certdir, ignore_errors=True)


def create_tls_topic(port: int, cert: str, topic: str) -> None:
    """`topic` with one partition, through the TLS port, before the capture starts."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "setup-admin",
                         "security.protocol": "SSL", "ssl.ca.location": cert,
                         "ssl.endpoint.identification.algorithm": "none"})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(15)
    del admin
    gc.collect()


def _write_key_logs(workdir: str, name: str, producer_keys: str, consumer_keys: str) -> None:
    """NAME.keys (every client's secrets) and NAME.some.keys (the producer's only)."""
    with open(os.path.join(workdir, f"{name}.keys"), "w") as f:
        f.write(producer_keys + consumer_keys)
    with open(os.path.join(workdir, f"{name}.some.keys"), "w") as f:
        f.write(producer_keys)


def _tls_keylog(name: str, version: ssl.TLSVersion, rig: Rig, workdir: str) -> Manifest:
    label = "TLS 1.3" if version == ssl.TLSVersion.TLSv1_3 else "TLS 1.2"
    topic = "tls-keylog-topic"
    logdir = tempfile.mkdtemp(prefix="kwinspect-keys-")
    keylogs = {role: os.path.join(logdir, f"{role}.keys") for role in ("producer", "consumer")}
    with _tls_tansu(name, rig, topic) as (proxy, tb, _cert):
        bootstrap = f"127.0.0.1:{proxy.port}"
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
    with open(keylogs["producer"]) as f, open(keylogs["consumer"]) as g:
        _write_key_logs(workdir, name, f.read(), g.read())
    shutil.rmtree(logdir, ignore_errors=True)
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


NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
# What the kafkajs producer offers: only ChaCha20-Poly1305, so the capture holds a real
# TLS 1.3 ChaCha20 session next to the consumer's default (AES-GCM) one.
KAFKAJS_PRODUCER_CIPHERS = "TLS_CHACHA20_POLY1305_SHA256"


def node_clients() -> str:
    """rig/node with its node_modules (kafkajs, pinned in package-lock.json), installed on
    first use with `npm ci`; raises FileNotFoundError without node and npm."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise FileNotFoundError("node and npm (Debian: nodejs, npm)")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "kafkajs")):
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=300)
    return node


def _kafkajs_version() -> str:
    with open(os.path.join(NODE_DIR, "node_modules", "kafkajs", "package.json")) as f:
        return json.load(f)["version"]


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def tansu_kafkajs_tls13_keylog(rig: Rig, workdir: str) -> Manifest:
    """kafkajs (Node's TLS, secrets from the sockets' 'keylog' event) over TLS 1.3: the
    producer offers only ChaCha20-Poly1305, the consumer Node's defaults."""
    name = "tansu-kafkajs-tls13-keylog"
    node = node_clients()
    topic = "kafkajs-tls-topic"
    logdir = tempfile.mkdtemp(prefix="kwinspect-keys-")
    items = standard_items(topic, 8)
    for it in items:
        it["partition"] = 0
        # kafkajs takes header values as Buffers and sends a null one as empty: record that.
        it["headers"] = [(k, b"" if v is None else v) for k, v in it["headers"]]
    spec = {
        "topic": topic, "group": "kafkajs-tls-group", "timeout_ms": 40000,
        "producer": {"client_id": "tls-kafkajs-producer", "ciphers": KAFKAJS_PRODUCER_CIPHERS,
                     "keylog": os.path.join(logdir, "producer.keys")},
        "consumer": {"client_id": "tls-kafkajs-consumer", "ciphers": None,
                     "keylog": os.path.join(logdir, "consumer.keys")},
        "items": [{"key": _b64(it["key"]), "value": _b64(it["value"]), "partition": 0,
                   "timestamp_ms": it["timestamp_ms"],
                   "headers": [{"key": k, "value": _b64(v)} for k, v in it["headers"]]}
                  for it in items],
    }
    with _tls_tansu(name, rig, topic) as (proxy, tb, _cert):
        spec["brokers"] = [f"127.0.0.1:{proxy.port}"]
        spec_path = os.path.join(logdir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        with recording(rig, workdir, name,
                       "TLS 1.3 from Node: a kafkajs producer writes 8 records (one send each, "
                       "offering only TLS_CHACHA20_POLY1305_SHA256) and a kafkajs group consumer "
                       "reads them back and commits, over real TLS (Node's OpenSSL) to a "
                       "TLS-terminating proxy (rig.tlsproxy) in front of tansu; each client logs its "
                       "secrets from its sockets' 'keylog' event. Only the proxy port is captured. "
                       f"{name}.keys holds every client's secrets, {name}.some.keys only the "
                       "producer's.",
                       _ProxyOnly(tb, proxy)) as m:
            m.add_topic(topic, 1, "CreateTopics (before the capture)")
            m.tls_ports = [proxy.port]
            run = subprocess.run([node, os.path.join(NODE_DIR, "kafkajs_tls.js"), spec_path],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                raise RuntimeError(f"kafkajs clients failed: {run.stderr[-2000:]}")
            version = _kafkajs_version()
            for role in ("producer", "consumer"):
                conf = {"ssl": "tls.connect(rejectUnauthorized=false)",
                        "socketFactory": "tls.connect plus socket.on('keylog')"}
                if spec[role]["ciphers"]:
                    conf["ciphers"] = spec[role]["ciphers"]
                if role == "consumer":
                    conf["groupId"] = spec["group"]
                m.clients.append(ClientInfo(role, "kafkajs", version, spec[role]["client_id"], conf))
            m.group_ids.append(spec["group"])
            for line in run.stdout.splitlines():
                got = json.loads(line)
                if got["role"] == "produced":
                    it = items[len(m.produced)]
                    m.produced.append(RecordTruth.make(
                        got["topic"], got["partition"], got["offset"], it["key"], it["value"],
                        it["headers"], codec="none", timestamp_ms=it["timestamp_ms"],
                        timestamp_type="create_time", client_id=spec["producer"]["client_id"],
                        acks="all"))
                else:
                    m.consumed.append(RecordTruth.make(
                        got["topic"], got["partition"], got["offset"],
                        None if got["key"] is None else base64.b64decode(got["key"]),
                        None if got["value"] is None else base64.b64decode(got["value"]),
                        [(h["key"], None if h["value"] is None else base64.b64decode(h["value"]))
                         for h in got["headers"]],
                        timestamp_ms=got["timestamp_ms"], timestamp_type="create_time",
                        client_id=spec["consumer"]["client_id"], group_id=spec["group"]))
            m.expect_apis("ApiVersions", "Metadata", "Produce", "Fetch", "FindCoordinator",
                          "JoinGroup", "SyncGroup", "OffsetCommit")
            m.notes.append(f"Decode with --tls-keylog captures/{name}.keys; without it every "
                           "connection is a tls_stream row (TLS, not decoded).")
    with open(spec["producer"]["keylog"]) as f, open(spec["consumer"]["keylog"]) as g:
        _write_key_logs(workdir, name, f.read(), g.read())
    shutil.rmtree(logdir, ignore_errors=True)
    return m


def _api_versions_v0(correlation_id: int, client_id: bytes) -> bytes:
    """An ApiVersions v0 request, size-prefixed: header v1 and an empty body."""
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def tansu_openssl_keyupdate(rig: Rig, workdir: str) -> Manifest:
    """TLS 1.3 KeyUpdate on the wire: `openssl s_client` sends a Kafka ApiVersions request,
    then a KeyUpdate that asks the peer to update too ('K': both directions change keys),
    a second request, a KeyUpdate for its own direction only ('k'), a third request."""
    name = "tansu-openssl-keyupdate"
    exe = shutil.which("openssl")
    if exe is None:
        raise FileNotFoundError("openssl")
    version = subprocess.run([exe, "version"], capture_output=True, text=True,
                             check=True).stdout.split()[1]
    logdir = tempfile.mkdtemp(prefix="kwinspect-keys-")
    keylog = os.path.join(logdir, "s_client.keys")
    client_id = b"openssl-keyupdate"
    with _tls_tansu(name, rig, None) as (proxy, tb, _cert):
        with recording(rig, workdir, name,
                       "TLS 1.3 key updates from a real TLS stack: openssl s_client (-keylogfile) "
                       "connects to a TLS-terminating proxy (rig.tlsproxy, Python ssl) in front of "
                       "tansu and sends three Kafka ApiVersions v0 requests: one before any key "
                       "update, one after a KeyUpdate with update_requested (the proxy answers with "
                       "its own KeyUpdate, so both directions change keys), one after a second "
                       "KeyUpdate from the client alone. Only the proxy port is captured; "
                       f"{name}.keys holds the client's secrets (the *_TRAFFIC_SECRET_0 lines are "
                       "enough: the later keys are derived from them).",
                       _ProxyOnly(tb, proxy)) as m:
            m.tls_ports = [proxy.port]
            m.clients.append(ClientInfo("client", "openssl s_client", version, client_id.decode(),
                                        {"args": "-tls1_3 -keylogfile FILE -no_ign_eof",
                                         "stdin": "ApiVersions v0, 'K', ApiVersions v0, 'k', "
                                                  "ApiVersions v0"}))
            p = subprocess.Popen([exe, "s_client", "-connect", f"127.0.0.1:{proxy.port}",
                                  "-tls1_3", "-keylogfile", keylog, "-no_ign_eof"],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            assert p.stdin is not None and p.stderr is not None
            time.sleep(1.0)  # the handshake
            # s_client treats a read that starts with K or k as a command: each one must
            # arrive as its own read, hence the pauses.
            for chunk in (_api_versions_v0(1, client_id), b"K\n", _api_versions_v0(2, client_id),
                          b"k\n", _api_versions_v0(3, client_id)):
                p.stdin.write(chunk)
                p.stdin.flush()
                time.sleep(0.7)
            p.stdin.close()
            p.wait(15)
            said = p.stderr.read().decode(errors="replace")
            if said.count("KEYUPDATE") != 2:
                raise RuntimeError(f"openssl s_client did not send two key updates: {said[-500:]}")
            m.expect_apis("ApiVersions")
            m.notes.append(f"Decode with --tls-keylog captures/{name}.keys: three ApiVersions "
                           "exchanges, correlation ids 1-3, the second and third after key updates.")
    with open(keylog) as f:
        keys = f.read()
    with open(os.path.join(workdir, f"{name}.keys"), "w") as f:
        f.write(keys)
    shutil.rmtree(logdir, ignore_errors=True)
    return m


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
    "tansu-kafkajs-tls13-keylog": tansu_kafkajs_tls13_keylog,
    "tansu-openssl-keyupdate": tansu_openssl_keyupdate,
}
