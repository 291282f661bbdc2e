"""The TLS record layer and key schedules (kwinspect.capture.tls) against RFC 8448's
TLS 1.3 trace and real OpenSSL sessions with their key logs."""

from __future__ import annotations

import ssl
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kwinspect.capture import tls
from kwinspect.capture.keylog import DSB_TLS_KEY_LOG, KeyLog
from tests.capture import tls_oracle
from tests.capture import tls_vectors as v


def keylog(text: str) -> KeyLog:
    k = KeyLog()
    k.add_text(text)
    return k


def run(session: tls.TlsSession, trace, chunk: int | None = None) -> tuple[bytes, bytes]:
    got = [bytearray(), bytearray()]
    for from_client, data in trace:
        pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
        for piece in pieces:
            for plain in session.feed(from_client, piece):
                got[from_client] += plain
    return bytes(got[1]), bytes(got[0])


def test_rfc8448_traffic_keys() -> None:
    suite = tls.SUITES[0x1301]
    assert tls.tls13_traffic_keys(v.S_HS, suite) == (v.S_HS_KEY, v.S_HS_IV)
    assert tls.tls13_traffic_keys(v.S_AP, suite) == (v.S_AP_KEY, v.S_AP_IV)
    assert tls.tls13_traffic_keys(v.C_HS, suite) == (v.C_HS_KEY, v.C_HS_IV)


@pytest.mark.parametrize("chunk", [None, 1, 7, 100])
def test_rfc8448_trace_decrypts(chunk: int | None) -> None:
    s = tls.TlsSession(keylog(v.keylog_text()))
    client, server = run(s, v.TRACE, chunk)
    assert client == v.APP_PAYLOAD and server == v.APP_PAYLOAD
    assert s.failure is None and s.pop_issues() == []
    assert s.describe() == "TLS 1.3, TLS_AES_128_GCM_SHA256"
    for from_client in (True, False):
        acc = s.accounting(from_client)
        sent = sum(len(d) for c, d in v.TRACE if c == from_client)
        assert sum(acc.values()) == sent and acc["undecryptable"] == 0 and acc["buffered"] == 0
        assert acc["alert"] == 24 and acc["application_data"] == 72


def test_rfc8448_several_records_in_one_segment() -> None:
    s = tls.TlsSession(keylog(v.keylog_text()))
    server = b"".join(d for c, d in v.TRACE if not c)
    client = [d for c, d in v.TRACE if c]
    trace = [(True, client[0]), (False, server[:-100]), (True, b"".join(client[1:])), (False, server[-100:])]
    assert run(s, trace) == (v.APP_PAYLOAD, v.APP_PAYLOAD)


def test_no_key_for_this_client_random() -> None:
    other = v.keylog_text().replace(v.CLIENT_RANDOM.hex(), "11" * 32)
    s = tls.TlsSession(keylog(other))
    assert run(s, v.TRACE) == (b"", b"")
    assert s.failure == "no key for this client random in the key log"
    acc = s.accounting(False)
    assert acc["undecryptable"] > 0 and sum(acc.values()) == sum(len(d) for c, d in v.TRACE if not c)


def test_handshake_not_captured() -> None:
    s = tls.TlsSession(keylog(v.keylog_text()))
    assert run(s, v.TRACE[2:]) == (b"", b"")
    assert s.failure is not None and s.failure.startswith("handshake not captured")


def test_unsupported_cipher_suite() -> None:
    sh = bytearray(v.SERVER_HELLO_REC)
    i = sh.index(b"\x13\x01\x00\x00\x2e")
    sh[i:i + 2] = b"\x13\x05"  # TLS_AES_128_CCM_8_SHA256
    s = tls.TlsSession(keylog(v.keylog_text()))
    run(s, [(True, v.CLIENT_HELLO_REC), (False, bytes(sh))])
    assert s.failure == "unsupported cipher suite 0x1305"


def test_authentication_failure_is_an_issue() -> None:
    bad = bytearray(v.CLIENT_APP_REC)
    bad[20] ^= 1
    trace = [(c, bytes(bad) if d == v.CLIENT_APP_REC else d) for c, d in v.TRACE]
    s = tls.TlsSession(keylog(v.keylog_text()))
    client, server = run(s, trace)
    assert client == b"" and server == v.APP_PAYLOAD
    issues = s.pop_issues()
    assert len(issues) == 1 and "authentication tag mismatch" in issues[0] and "client" in issues[0]
    assert s.accounting(True)["undecryptable"] == len(bad) + len(v.CLIENT_ALERT_REC)


def _seal(secret: bytes, seq: int, inner: bytes, inner_type: int) -> bytes:
    key, iv = tls.tls13_traffic_keys(secret, tls.SUITES[0x1301])
    plain = inner + bytes([inner_type]) + b"\0" * 3  # with padding
    header = struct.pack(">BHH", 23, 0x0303, len(plain) + 16)
    nonce = (int.from_bytes(iv, "big") ^ seq).to_bytes(12, "big")
    return header + AESGCM(key).encrypt(nonce, plain, header)


def test_key_update() -> None:
    # after the trace's application record (client seq 1 on its application keys), the
    # client sends a KeyUpdate, then data under the next secret from sequence 0
    suite = tls.SUITES[0x1301]
    ku = _seal(v.C_AP, 1, b"\x18\x00\x00\x01\x00", 22)
    nxt = tls.tls13_next_secret(v.C_AP, suite)
    after = _seal(nxt, 0, b"after the update", 23)
    after2 = _seal(tls.tls13_next_secret(nxt, suite), 0, b"and again", 23)
    ku2 = _seal(nxt, 1, b"\x18\x00\x00\x01\x01", 22)
    trace = v.TRACE[:7] + [(True, ku), (True, after), (True, ku2), (True, after2)]
    s = tls.TlsSession(keylog(v.keylog_text()))
    client, server = run(s, trace)
    assert client == v.APP_PAYLOAD + b"after the update" + b"and again"
    assert s.pop_issues() == []


def test_keylog_parsing_and_repr() -> None:
    k = KeyLog()
    text = v.keylog_text() + "# comment\nRSA abcd 1234\nCLIENT_RANDOM zz 00\n\n"
    assert k.add_text(text) == 4
    assert k.ignored_lines == 2
    assert k.get("SERVER_TRAFFIC_SECRET_0", v.CLIENT_RANDOM) == v.S_AP
    assert v.S_AP.hex() not in repr(k) and repr(k) == "KeyLog(4 secrets)"
    k2 = KeyLog()
    assert k2.add_dsb(DSB_TLS_KEY_LOG, v.keylog_text().encode()) == 4
    assert k2.add_dsb(0x12345678, b"whatever") == 0


# -- OpenSSL as the oracle -------------------------------------------------------------

TLS12_SUITES = ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-CHACHA20-POLY1305",
                "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA384", "AES128-GCM-SHA256"]


def check(sess: tls_oracle.Session, chunk: int | None = None) -> tls.TlsSession:
    s = tls.TlsSession(keylog(sess.keylog))
    client, server = run(s, sess.wire, chunk)
    assert s.failure is None, s.failure
    assert s.pop_issues() == []
    assert client == sess.client_sent and server == sess.server_sent
    for from_client in (True, False):
        acc = s.accounting(from_client)
        assert sum(acc.values()) == sum(len(d) for c, d in sess.wire if c == from_client)
        assert acc["undecryptable"] == 0
    return s


@pytest.mark.parametrize("suite", TLS12_SUITES)
def test_openssl_tls12(tmp_path, suite: str) -> None:
    sess = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_2, ciphers=suite)
    assert sess.cipher == suite and sess.version == "TLSv1.2"
    s = check(sess)
    assert s.version == 0x0303


def test_openssl_tls12_cbc_mac_then_encrypt(tmp_path) -> None:
    sess = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-RSA-AES128-SHA256",
                                  etm=False)
    s = check(sess, chunk=500)
    assert not s.etm


def test_openssl_tls13(tmp_path) -> None:
    sess = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_3, size=40_000)
    s = check(sess, chunk=1448)
    assert s.version == 0x0304 and s.suite is not None and s.suite.name == sess.cipher


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_openssl_mtls(tmp_path, version) -> None:
    check(tls_oracle.run_session(str(tmp_path), version=version, mtls=True))


def test_openssl_tls12_resumption(tmp_path) -> None:
    first = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_2,
                                   ciphers="ECDHE-RSA-AES128-GCM-SHA256")
    again = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_2,
                                   ciphers="ECDHE-RSA-AES128-GCM-SHA256", session=first.session,
                                   contexts=first.contexts)
    # an abbreviated handshake: the server's ChangeCipherSpec and Finished come first
    assert any(not c and d[:1] == b"\x14" for c, d in again.wire) or len(again.wire) < len(first.wire)
    check(again)


def test_no_secret_in_messages(tmp_path) -> None:
    sess = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_3)
    wire = list(sess.wire)
    # corrupt the last client record: an issue, whose text holds no secret
    last = max(i for i, (c, _d) in enumerate(wire) if c)
    d = bytearray(wire[last][1])
    d[-1] ^= 0xFF
    wire[last] = (True, bytes(d))
    s = tls.TlsSession(keylog(sess.keylog))
    run(s, wire)
    texts = " ".join(s.pop_issues()) + (s.failure or "") + repr(s.keys)
    secrets = [line.split()[2] for line in sess.keylog.splitlines() if line and not line.startswith("#")]
    assert len(secrets) == 5
    for secret in secrets:
        assert secret not in texts.lower()
