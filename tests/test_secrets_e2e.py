"""Secrets never reach any output unless --no-redact, end to end through the CLI.

Captures are built with pcapgen from frames kio encodes (an encoder we did not
write): SASL/PLAIN as a raw token after SaslHandshake v0 and inside
SaslAuthenticate, SCRAM client-final proofs and server signatures (both ways),
OAUTHBEARER tokens, and the HMACs of Create/Renew/Expire/DescribeDelegationToken.
The real tansu-sasl-rejected capture (a real librdkafka SCRAM-SHA-512 exchange)
is checked too.  Every output is searched for each secret as text, hex and
base64: exchanges/records/errors as jsonl, csv, parquet and table, decode,
summary as table and json.  With --no-redact the secrets must show up in the
decode output, so the search is known to find them.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re

import pyarrow.parquet as pq
import pytest
from helpers.pcapgen import conversation, write_pcap
from kio.schema.create_delegation_token.v3 import request as cdt_req
from kio.schema.create_delegation_token.v3 import response as cdt_resp
from kio.schema.describe_delegation_token.v3 import request as ddt_req
from kio.schema.describe_delegation_token.v3 import response as ddt_resp
from kio.schema.errors import ErrorCode
from kio.schema.expire_delegation_token.v2 import request as edt_req
from kio.schema.expire_delegation_token.v2 import response as edt_resp
from kio.schema.renew_delegation_token.v2 import request as rdt_req
from kio.schema.renew_delegation_token.v2 import response as rdt_resp
from kio.schema.sasl_authenticate.v2 import request as sa_req
from kio.schema.sasl_authenticate.v2 import response as sa_resp
from kio.schema.sasl_handshake.v0 import request as sh0_req
from kio.schema.sasl_handshake.v0 import response as sh0_resp
from kio.schema.sasl_handshake.v1 import request as sh1_req
from kio.schema.sasl_handshake.v1 import response as sh1_resp
from kio.static.primitive import i32Timedelta, i64, i64Timedelta
from stream.kio_frames import request_frame, response_frame

from kwinspect.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_SASL = os.path.join(ROOT, "captures", "tansu-sasl-rejected.pcap")

# (secret text that must not appear, the whole wire value that carries it)
PLAIN_V0 = b"\x00alice\x00PLAIN-v0-pw-s3cret"
PLAIN_AUTH = b"\x00bob\x00PLAIN-auth-pw-s3cret"
SCRAM_FINAL = b"c=biws,r=nonceABCserverXYZ,p=U0NSQU1wcm9vZnMzY3JldA=="
SCRAM_SERVER_FINAL = b"v=U0VSVkVSc2lnbmF0dXJlczNjcmV0"
SCRAM_RAW_FINAL = b"c=biws,r=rawnonce,p=UkFXc2NyYW1wcm9vZnMzY3JldA=="
OAUTH = b"n,,\x01auth=Bearer eyJhbGciOi.OAUTH-T0KEN-s3cret.sig\x01\x01"
# crafted (issue: redact by what the bytes are, not by what the handshake announced)
MISMATCH_PLAIN = b"\x00eve\x00MISMATCH-pw-s3cret"  # PLAIN token after a SCRAM handshake
MISMATCH_RAW = b"\x00frank\x00RAW-MISMATCH-pw-s3cret"  # the same as a raw v0 token
OAUTH_TAB = b"n,,\x01auth=Bearer\tTAB-T0KEN-s3cret\x01\x01"  # a tab, not a space, after the scheme
TAG_SECRET = b"UNKNOWN-TAG-s3cret"  # in unknown tagged fields of a SaslAuthenticate header and body
HMACS = {name: f"{name}-HMAC-s3cret".encode()
         for name in ("CREATE", "RENEW", "EXPIRE", "DESCRIBE", "ORPHAN", "GARBLED")}

SECRETS: list[tuple[str, bytes]] = [
    ("PLAIN-v0-pw-s3cret", PLAIN_V0),
    ("PLAIN-auth-pw-s3cret", PLAIN_AUTH),
    ("U0NSQU1wcm9vZnMzY3JldA==", SCRAM_FINAL),
    ("U0VSVkVSc2lnbmF0dXJlczNjcmV0", SCRAM_SERVER_FINAL),
    ("UkFXc2NyYW1wcm9vZnMzY3JldA==", SCRAM_RAW_FINAL),
    ("OAUTH-T0KEN-s3cret", OAUTH),
    ("MISMATCH-pw-s3cret", MISMATCH_PLAIN),
    ("RAW-MISMATCH-pw-s3cret", MISMATCH_RAW),
    ("TAB-T0KEN-s3cret", OAUTH_TAB),
    ("UNKNOWN-TAG-s3cret", TAG_SECRET),
] + [(v.decode(), v) for v in HMACS.values()]

TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
THROTTLE = i32Timedelta.parse(dt.timedelta(0))


def _handshake(version: int, mechanism: str, cid: int) -> list[tuple[str, bytes]]:
    req, resp = (sh0_req, sh0_resp) if version == 0 else (sh1_req, sh1_resp)
    return [("c", request_frame(req.SaslHandshakeRequest(mechanism=mechanism), cid)),
            ("s", response_frame(resp.SaslHandshakeResponse(error_code=ErrorCode(0),
                                                            mechanisms=(mechanism,)), cid))]


def _auth(cid: int, client: bytes, server: bytes) -> list[tuple[str, bytes]]:
    return [("c", request_frame(sa_req.SaslAuthenticateRequest(auth_bytes=client), cid)),
            ("s", response_frame(sa_resp.SaslAuthenticateResponse(
                error_code=ErrorCode(0), error_message=None, auth_bytes=server,
                session_lifetime=i64Timedelta.parse(dt.timedelta(0))), cid))]


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _auth_with_unknown_tags(cid: int) -> bytes:
    """SaslAuthenticate v2 with the secret in unknown tagged fields of header and body, by hand
    (no encoder writes tags its schema lacks): header v2 = key, version, cid, client id, tags."""
    tag = _uvarint(1) + _uvarint(7) + _uvarint(len(TAG_SECRET)) + TAG_SECRET
    header = (36).to_bytes(2, "big") + (2).to_bytes(2, "big") + cid.to_bytes(4, "big") + \
        (3).to_bytes(2, "big") + b"cli" + tag
    token = b"n,,n=gina,r=tagnonce"
    body = _uvarint(len(token) + 1) + token + tag
    return header + body


def _raw(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _sized(messages: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(who, _raw(frame)) for who, frame in messages]


def _connections() -> list[list[tuple[str, bytes]]]:
    conns = []
    # 1. SaslHandshake v0 + raw PLAIN token (no Kafka header), empty server token
    conns.append(_sized(_handshake(0, "PLAIN", 1)) + [("c", _raw(PLAIN_V0)), ("s", _raw(b""))])
    # 2. SaslHandshake v1 + SaslAuthenticate with PLAIN
    conns.append(_sized(_handshake(1, "PLAIN", 1) + _auth(2, PLAIN_AUTH, b"")))
    # 3. SCRAM through SaslAuthenticate: client-first, server-first, client-final (proof), server-final
    conns.append(_sized(_handshake(1, "SCRAM-SHA-256", 1)
                        + _auth(2, b"n,,n=carol,r=nonceABC", b"r=nonceABCserverXYZ,s=c2FsdA==,i=4096")
                        + _auth(3, SCRAM_FINAL, SCRAM_SERVER_FINAL)))
    # 4. SCRAM as raw tokens after SaslHandshake v0
    conns.append(_sized(_handshake(0, "SCRAM-SHA-512", 1))
                 + [("c", _raw(b"n,,n=dave,r=rawnonce")), ("s", _raw(b"r=rawnonceS,s=c2FsdA==,i=4096")),
                    ("c", _raw(SCRAM_RAW_FINAL)), ("s", _raw(b"v=cmF3c2VydmVyc2ln"))])
    # 5. OAUTHBEARER
    conns.append(_sized(_handshake(1, "OAUTHBEARER", 1) + _auth(2, OAUTH, b"")))
    # 5b. crafted: a PLAIN token after a SCRAM handshake, in SaslAuthenticate and as a raw v0 token;
    # OAUTHBEARER with a tab after the scheme; unknown tags in SaslAuthenticate header and body
    conns.append(_sized(_handshake(1, "SCRAM-SHA-256", 1) + _auth(2, MISMATCH_PLAIN, b"")))
    conns.append(_sized(_handshake(0, "SCRAM-SHA-512", 1)) + [("c", _raw(MISMATCH_RAW)), ("s", _raw(b""))])
    conns.append(_sized(_handshake(1, "OAUTHBEARER", 1) + _auth(2, OAUTH_TAB, b"")))
    conns.append(_sized(_handshake(1, "SCRAM-SHA-256", 1))
                 + [("c", _raw(_auth_with_unknown_tags(2))), ("s", _raw(response_frame(
                     sa_resp.SaslAuthenticateResponse(error_code=ErrorCode(0), error_message=None,
                                                      auth_bytes=b"r=tagnonceS,s=c2FsdA==,i=4096",
                                                      session_lifetime=i64Timedelta.parse(dt.timedelta(0))),
                     2)))])
    # 6. delegation tokens
    create = cdt_req.CreateDelegationTokenRequest(
        owner_principal_type=None, owner_principal_name=None, renewers=(),
        max_lifetime=i64Timedelta.parse(dt.timedelta(hours=1)))
    created = cdt_resp.CreateDelegationTokenResponse(
        error_code=ErrorCode(0), principal_type="User", principal_name="alice",
        token_requester_principal_type="User", token_requester_principal_name="alice",
        issue_timestamp=TS, expiry_timestamp=TS, max_timestamp=TS, token_id="tok-1",
        hmac=HMACS["CREATE"], throttle_time=THROTTLE)
    renew = rdt_req.RenewDelegationTokenRequest(
        hmac=HMACS["RENEW"], renew_period=i64Timedelta.parse(dt.timedelta(hours=1)))
    renewed = rdt_resp.RenewDelegationTokenResponse(error_code=ErrorCode(0), expiry_timestamp=TS,
                                                    throttle_time=THROTTLE)
    expire = edt_req.ExpireDelegationTokenRequest(
        hmac=HMACS["EXPIRE"], expiry_time_period=i64Timedelta.parse(dt.timedelta(hours=1)))
    expired = edt_resp.ExpireDelegationTokenResponse(error_code=ErrorCode(0), expiry_timestamp=TS,
                                                     throttle_time=THROTTLE)
    describe = ddt_req.DescribeDelegationTokenRequest(owners=None)
    described = ddt_resp.DescribeDelegationTokenResponse(
        error_code=ErrorCode(0), throttle_time=THROTTLE, tokens=(ddt_resp.DescribedDelegationToken(
            principal_type="User", principal_name="alice", token_requester_principal_type="User",
            token_requester_principal_name="alice", issue_timestamp=i64(0), expiry_timestamp=i64(0),
            max_timestamp=i64(0), token_id="tok-1", hmac=HMACS["DESCRIBE"], renewers=()),))
    # responses whose requests the capture lacks: one decodes as the only api this
    # connection used that fits, the other does not decode at all (its raw body would show)
    orphan = response_frame(cdt_resp.CreateDelegationTokenResponse(
        error_code=ErrorCode(0), principal_type="User", principal_name="alice",
        token_requester_principal_type="User", token_requester_principal_name="alice",
        issue_timestamp=TS, expiry_timestamp=TS, max_timestamp=TS, token_id="tok-2",
        hmac=HMACS["ORPHAN"], throttle_time=THROTTLE), 9)
    garbled = response_frame(cdt_resp.CreateDelegationTokenResponse(
        error_code=ErrorCode(0), principal_type="User", principal_name="alice",
        token_requester_principal_type="User", token_requester_principal_name="alice",
        issue_timestamp=TS, expiry_timestamp=TS, max_timestamp=TS, token_id="tok-3",
        hmac=HMACS["GARBLED"], throttle_time=THROTTLE), 10)
    garbled = garbled[:4] + b"\x01\x02" + garbled[6:]  # a body no api/version explains
    conns.append(_sized([("c", request_frame(create, 1)), ("s", response_frame(created, 1)),
                         ("c", request_frame(renew, 2)), ("s", response_frame(renewed, 2)),
                         ("c", request_frame(expire, 3)), ("s", response_frame(expired, 3)),
                         ("c", request_frame(describe, 4)), ("s", response_frame(described, 4)),
                         ("s", orphan), ("s", garbled)]))
    return conns


@pytest.fixture(scope="module")
def secret_pcap(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("secrets") / "sasl.pcap"
    segs = []
    for i, messages in enumerate(_connections()):
        segs += conversation(("10.0.0.1", 41000 + i), ("10.0.0.2", 9092), messages,
                             ts0=1_700_000_000.0 + i, mss=1000)
    write_pcap(path, segs)
    return str(path)


def _forms(text: str, whole: bytes) -> list[str]:
    raw = text.encode()
    return [text, raw.hex(), whole.hex(), base64.b64encode(whole).decode(),
            base64.b64encode(raw).decode(), base64.urlsafe_b64encode(whole).decode()]


def _outputs(pcap: str, tmp_path, capsys, extra: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}

    def run(name: str, argv: list[str], path: str | None = None) -> None:
        assert main(argv + extra + ["-q"]) == 0, name
        text = capsys.readouterr().out
        if path is not None:
            if path.endswith(".parquet"):
                text += repr(pq.read_table(path).to_pylist())
            else:
                with open(path, encoding="utf-8") as f:
                    text += f.read()
        out[name] = text

    for table in ("exchanges", "records", "errors"):
        for fmt in ("jsonl", "csv", "parquet"):
            path = str(tmp_path / f"{table}{'-'.join(extra)}.{fmt}")
            run(f"{table}.{fmt}", [table, pcap, "-F", fmt, "-o", path], path)
        run(f"{table}.table", [table, pcap, "-F", "table"])
    run("decode", ["decode", pcap])
    run("diagnose", ["diagnose", pcap])
    run("diagnose.jsonl", ["diagnose", pcap, "-F", "jsonl"])
    run("latency", ["latency", pcap, "-F", "jsonl"])
    run("summary.table", ["summary", pcap])
    run("summary.json", ["summary", pcap, "-F", "json"])
    return out


def test_the_capture_carries_every_secret_on_the_wire(secret_pcap):
    with open(secret_pcap, "rb") as f:
        wire = f.read()
    for text, _whole in SECRETS:
        assert text.encode() in wire


def test_no_output_contains_a_secret(secret_pcap, tmp_path, capsys):
    outputs = _outputs(secret_pcap, tmp_path, capsys, [])
    assert "SaslHandshake" in outputs["exchanges.jsonl"] and "SaslToken" in outputs["exchanges.jsonl"]
    assert "DescribeDelegationToken" in outputs["decode"]
    leaks = [(name, text) for name, body in outputs.items() for text, whole in SECRETS
             for form in _forms(text, whole) if form in body]
    assert not leaks, leaks
    assert "<redacted>" in outputs["decode"]
    # what is not secret stays visible
    assert "alice" in outputs["decode"] and "carol" in outputs["decode"]


def test_no_redact_shows_the_secrets(secret_pcap, tmp_path, capsys):
    outputs = _outputs(secret_pcap, tmp_path, capsys, ["--no-redact"])
    missing = [text for text, whole in SECRETS
               if not any(form in outputs["decode"] for form in _forms(text, whole))]
    assert not missing, missing


@pytest.mark.skipif(not os.path.exists(REAL_SASL), reason="real SASL capture not in captures/")
def test_real_scram_exchange_is_redacted(tmp_path, capsys):
    with open(REAL_SASL, "rb") as f:
        wire = f.read()
    proofs = [m.group(1).decode() for m in re.finditer(rb",p=([A-Za-z0-9+/=]{16,})", wire)]
    assert proofs, "the real capture holds no SCRAM client-final proof"
    outputs = _outputs(REAL_SASL, tmp_path, capsys, [])
    assert "SaslAuthenticate" in outputs["exchanges.jsonl"]
    leaks = [(name, p) for name, body in outputs.items() for p in proofs if p in body]
    assert not leaks, leaks
    clear = _outputs(REAL_SASL, tmp_path, capsys, ["--no-redact"])
    assert any(p in clear["decode"] for p in proofs)


def _tui_texts(pcap: str, redact: bool) -> list[str]:
    """What the TUI can show per row: decoded trees and, when visible, the hex of the frames."""
    from kwinspect.analyze.render import message_json
    from kwinspect.dissect import DissectConfig
    from kwinspect.tui.indexer import Indexer
    from kwinspect.tui.store import ExchangeStore

    store = ExchangeStore(redact=redact)
    Indexer(store).index_files([pcap], DissectConfig(redact=redact))
    texts = []
    for row in range(store.first, store.total):
        req, resp = store.messages(row)
        text = repr([message_json(req), message_json(resp)])
        if store.raw_visible(row):
            req_f, resp_f = store.frames(row)
            raw = (req_f or b"") + (resp_f or b"")
            text += raw.hex() + raw.decode("latin-1")
        texts.append(text)
    return texts


def test_tui_views_show_no_secret(secret_pcap):
    texts = _tui_texts(secret_pcap, redact=True)
    assert len(texts) >= 16
    leaks = [(i, text) for i, body in enumerate(texts) for text, whole in SECRETS
             for form in _forms(text, whole) if form in body]
    assert not leaks, leaks
    # the search does find them when not redacting (raw tokens after SaslHandshake v0 have no
    # Kafka header, so the TUI's re-decoding does not show them either way)
    clear = "".join(_tui_texts(secret_pcap, redact=False))
    shown = [t for t, w in SECRETS if w not in (PLAIN_V0, SCRAM_RAW_FINAL, MISMATCH_RAW)]
    assert all(any(f in clear for f in _forms(t, w)) for t, w in SECRETS if t in shown)
