"""Kafka inside TLS: the Dissector decrypts with key material and decodes the plaintext
as it decodes plaintext TCP payload; without keys (or on failure) it says why."""

from __future__ import annotations

import ssl
import struct

import pytest

from kwinspect.capture.keylog import DSB_TLS_KEY_LOG, KeyLog
from kwinspect.dissect import DissectConfig
from kwinspect.model import ErrorRow, Exchange
from kwinspect.run.files import FileRun, dissect_files
from tests.capture import tls_oracle
from tests.helpers import pcapgen


def api_versions_request(corr: int, client_id: bytes = b"tls-test") -> bytes:
    body = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def api_versions_response(corr: int) -> bytes:
    body = struct.pack(">ihi", corr, 0, 2) + struct.pack(">hhh", 0, 0, 9) + struct.pack(">hhh", 18, 0, 3)
    return struct.pack(">i", len(body)) + body


EXCHANGES = [(api_versions_request(c), api_versions_response(c)) for c in (1, 2, 3)]
# several requests in one record, and a request cut across records
EXCHANGES.append((api_versions_request(4) + api_versions_request(5)[:7], b""))
EXCHANGES.append((api_versions_request(5)[7:], api_versions_response(4) + api_versions_response(5)))


@pytest.fixture(scope="module", params=[ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls12", "tls13"])
def session(request, tmp_path_factory) -> tls_oracle.Session:
    d = tmp_path_factory.mktemp("tls")
    return tls_oracle.run_session(str(d), version=request.param, exchanges=EXCHANGES)


def write(tmp_path, sess: tls_oracle.Session, name: str = "tls.pcap", *, mss: int = 700, pcapng: bool = False,
          secrets: bytes | None = None) -> str:
    msgs = [("c" if c else "s", d) for c, d in sess.wire]
    segs = pcapgen.conversation(("10.0.0.1", 40000), ("10.0.0.2", 9093), msgs, mss=mss)
    path = str(tmp_path / name)
    if pcapng:
        pcapgen.write_pcapng(path, segs, secrets=[(DSB_TLS_KEY_LOG, secrets)] if secrets else ())
    else:
        pcapgen.write_pcap(path, segs)
    return path


def keys_of(text: str) -> KeyLog:
    k = KeyLog()
    k.add_text(text)
    return k


def run(path: str, keys: KeyLog | None) -> tuple[list[Exchange], list[ErrorRow], FileRun]:
    fr = FileRun()
    events = list(dissect_files([path], DissectConfig(tls_keys=keys), run=fr))
    return ([e for e in events if isinstance(e, Exchange)], [e for e in events if isinstance(e, ErrorRow)], fr)


def test_decrypted_like_plaintext(tmp_path, session) -> None:
    path = write(tmp_path, session)
    exchanges, errors, fr = run(path, keys_of(session.keylog))
    assert [(e.api_key, e.api_version, e.correlation_id, e.status) for e in exchanges] == [
        (18, 0, c, "paired") for c in (1, 2, 3, 4, 5)]
    assert [e.kind for e in errors] == ["tls_decrypted"]
    info = next(iter(fr.dissector.connections.values()))
    assert info.kind == "kafka" and info.tls_decrypted and info.tls.endswith("(decrypted)")
    assert str(info.broker) == "10.0.0.2:9093"
    # every TLS byte accounted for
    for direction, sent in (("to_broker", True), ("to_client", False)):
        acc = info.tls_bytes[direction]
        assert sum(acc.values()) == sum(len(d) for c, d in session.wire if c == sent)
        assert acc["undecryptable"] == 0 and acc["application_data"] > 0
    assert fr.dissector.packet_accounting_error() is None


def test_same_rows_as_plaintext(tmp_path, session) -> None:
    exchanges, _errors, _fr = run(write(tmp_path, session, mss=100), keys_of(session.keylog))
    msgs = [("c", session.client_sent), ("s", session.server_sent)]
    # the same Kafka bytes in clear (sent at once: pairing does not depend on timing here)
    plain = pcapgen.conversation(("10.0.0.1", 40000), ("10.0.0.2", 9093), msgs)
    path = str(tmp_path / "plain.pcap")
    pcapgen.write_pcap(path, plain)
    plain_ex, _e, _f = run(path, None)

    def key(e: Exchange) -> tuple:
        return (e.api_key, e.api_version, e.correlation_id, e.client_id, e.status, e.stream)

    assert [key(e) for e in exchanges] == [key(e) for e in plain_ex]


def test_without_keys_the_row_says_so(tmp_path, session) -> None:
    exchanges, errors, fr = run(write(tmp_path, session), None)
    assert exchanges == []
    assert [(e.kind, e.message) for e in errors] == [
        ("tls_stream", "TLS handshake: the stream is encrypted and cannot be decoded (no key log given: --tls-keylog FILE decrypts it)")]
    assert next(iter(fr.dissector.connections.values())).kind == "tls"


def test_no_key_for_this_client_random(tmp_path, session) -> None:
    other = tls_oracle.run_session(str(tmp_path), version=ssl.TLSVersion.TLSv1_3, messages=1)
    exchanges, errors, fr = run(write(tmp_path, session), keys_of(other.keylog))
    assert exchanges == []
    assert len(errors) == 1 and errors[0].kind == "tls_stream"
    assert errors[0].message.startswith("TLS handshake: the stream is encrypted and cannot be decoded (TLS 1.")
    assert errors[0].message.endswith(": no key for this client random in the key log)")
    info = next(iter(fr.dissector.connections.values()))
    assert info.kind == "tls" and "not decrypted: no key for this client random" in info.tls


def test_keys_from_a_decryption_secrets_block(tmp_path, session) -> None:
    path = write(tmp_path, session, "dsb.pcapng", pcapng=True, secrets=session.keylog.encode())
    exchanges, errors, fr = run(path, None)
    assert [e.correlation_id for e in exchanges] == [1, 2, 3, 4, 5]
    assert fr.sources[0].stats.secrets_blocks == 1


def test_authentication_failure_is_an_error_row(tmp_path, session) -> None:
    wire = list(session.wire)
    # the server's last flight: flip a byte inside its last record
    last = max(i for i, (c, _d) in enumerate(wire) if not c)
    d = bytearray(wire[last][1])
    d[-3] ^= 0x55
    wire[last] = (False, bytes(d))
    bad = tls_oracle.Session(wire=wire, keylog=session.keylog)
    exchanges, errors, _fr = run(write(tmp_path, bad), keys_of(session.keylog))
    kinds = [e.kind for e in errors]
    assert "tls_decrypt_failed" in kinds
    row = errors[kinds.index("tls_decrypt_failed")]
    assert "server" in row.message and "not decrypted" in row.message
    assert [e.correlation_id for e in exchanges if e.status == "paired"] == [1, 2, 3]
