"""`kwinspect live --tls-keylog FILE` against real TLS: kafka-python talks TLS (Python's
ssl, OpenSSL) to rig.tlsproxy in front of tansu and writes its secrets with
``SSLContext.keylog_filename`` into a key log that does not exist when the capture
starts: every connection's keys appear in it only as the client connects, so live
decryption depends on re-reading the key log as it grows.

Oracles: what the clients know (the records produced, with their offsets, and
consumed) is in the live records rows; the live exchanges equal the offline decode of
the pcap `-w` wrote with the complete key log; no secret of the key log appears in
any output, on stderr, or in the pcap.
"""

from __future__ import annotations

import json
import os
import ssl

import pytest

from tests.live.test_live_capture import PY, LiveProc, _as_set, needs_capture

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("live")]


def _rig_missing() -> str | None:
    from rig.tansu import tansu_path
    from rig.tlsproxy import openssl_path

    if tansu_path() is None:
        return "tansu is not installed (KWINSPECT_TANSU)"
    if openssl_path() is None:
        return "the openssl CLI is needed for the proxy's certificate"
    try:
        import kafka  # noqa: F401
    except ImportError:
        return "kafka-python is not installed"
    return None


def _client_context(version: ssl.TLSVersion, keylog: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = version
    ctx.keylog_filename = keylog
    return ctx


def _offline(table: str, files: list[str], ports: str, keylog: str) -> list[dict]:
    import subprocess

    res = subprocess.run([PY, "-m", "kwinspect.cli", table, *files, "-F", "jsonl", "-q", "--kafka-ports", ports,
                          "--tls-keylog", keylog], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


@needs_capture
@pytest.mark.skipif(_rig_missing() is not None, reason=_rig_missing() or "")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["tls13", "tls12"])
def test_live_decrypts_with_a_growing_key_log(tmp_path, version, caplog) -> None:
    from rig.manifest import Manifest
    from rig.scenarios import kp_consume, kp_produce, standard_items
    from rig.tansu import TansuBroker, free_port
    from rig.tls_scenarios import create_tls_topic
    from rig.tlsproxy import TlsProxy, make_self_signed

    work = str(tmp_path)
    cert, key = make_self_signed(work)
    keylog = os.path.join(work, "sslkeys.log")  # written by the clients as they connect
    broker_port = free_port()
    with TlsProxy(("127.0.0.1", broker_port), cert, key) as proxy:
        tb = TansuBroker(broker_port, advertised_port=proxy.port, log_path=os.path.join(work, "tansu.log"))
        tb.start()
        try:
            topic = "live-tls-topic"
            bootstrap = f"127.0.0.1:{proxy.port}"
            create_tls_topic(proxy.port, cert, topic)
            assert not os.path.exists(keylog)
            live = LiveProc(work, "tls", "-i", "lo", "--kafka-ports", str(proxy.port), "-t", "exchanges",
                            "-F", "jsonl", "--tls-keylog", keylog, "-w", os.path.join(work, "tls.pcap"),
                            "--also", f"records={os.path.join(work, 'records.jsonl')}",
                            "--also", f"errors={os.path.join(work, 'errors.jsonl')}")
            try:
                live.wait_listening()
                m = Manifest(scenario="live-tls", description="kwinspect live --tls-keylog test")
                items = standard_items(topic, 12)
                for it in items:
                    it["partition"] = 0
                extra = {"security_protocol": "SSL", "ssl_context": _client_context(version, keylog)}
                kp_produce(m, bootstrap, "live-tls-producer", items, extra=extra)
                kp_consume(m, bootstrap, "live-tls-consumer", expected=12, assign=[(topic, 0)], extra=extra)
                import time

                time.sleep(0.8)  # the last responses and FINs reach the socket
            finally:
                rc = live.interrupt()
        finally:
            tb.stop()
    err = live.stderr()
    assert rc == 0, err[-2000:]
    ports = str(proxy.port)
    live_ex = live.rows()
    live_rec = live.rows(os.path.join(work, "records.jsonl"))
    live_err = live.rows(os.path.join(work, "errors.jsonl"))

    # every TLS connection was decrypted live, none given up for want of its key
    kinds = [r["kind"] for r in live_err]
    assert "tls_decrypted" in kinds and "tls_stream" not in kinds and "tls_decrypt_failed" not in kinds, live_err
    apis = {r["api_name"] for r in live_ex}
    assert {"ApiVersions", "Metadata", "Produce", "Fetch"} <= apis, apis
    # Every exchange paired, but a Metadata refresh kafka-python itself cancelled (on a
    # loaded machine it closes a connection with one in flight; its own log says so): that
    # request has no answer on the wire, and the offline decode below agrees.
    unpaired = [r for r in live_ex if r["status"] != "paired"]
    cancelled = sum("Metadata refresh: failed Cancelled" in rec.getMessage() for rec in caplog.records)
    assert len(unpaired) <= cancelled, unpaired
    assert all(r["api_name"] == "Metadata" and r["status"] == "response_missing" for r in unpaired), unpaired

    # the same session offline, from the pcap -w wrote, with the complete key log
    pcap = os.path.join(work, "tls.pcap")
    assert _as_set(live_ex) == _as_set(_offline("exchanges", [pcap], ports, keylog))
    assert _as_set(live_rec) == _as_set(_offline("records", [pcap], ports, keylog))

    # the clients' own view: every produced record (offset, key, value) live, and consumed
    produced = {(r.offset, r.key, r.value) for r in m.produced}
    assert len(produced) == 12 and len(m.consumed) == 12
    seen_produce = {(r["offset"], r["key"], r["value"]) for r in live_rec if r["direction"] == "produce"}
    seen_fetch = {(r["offset"], r["key"], r["value"]) for r in live_rec if r["direction"] == "fetch"}
    assert produced <= seen_produce, (produced - seen_produce)
    assert {(r.offset, r.key, r.value) for r in m.consumed} <= seen_fetch

    # no secret anywhere: outputs, stderr, the pcap (classic pcap: no Decryption Secrets Block)
    with open(keylog) as f:
        secrets = [line.split()[2] for line in f if line.strip() and not line.startswith("#")]
    assert secrets
    texts = [err]
    for name in ("tls.stdout", "records.jsonl", "errors.jsonl"):
        with open(os.path.join(work, name)) as f:
            texts.append(f.read())
    with open(pcap, "rb") as f:
        raw = f.read()
    for s in secrets:
        assert all(s.lower() not in t.lower() for t in texts)
        assert bytes.fromhex(s) not in raw and s.encode() not in raw
