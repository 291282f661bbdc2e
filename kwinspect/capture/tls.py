"""TLS decryption with key material from a key log (as Wireshark does), sans-IO.

A ``TlsSession`` is fed the reassembled bytes of each direction of one TCP
connection and hands back the application data, decrypted, in order.  It
parses the record layer (records split across segments, several records per
segment), the handshake messages it needs (ClientHello: client random;
ServerHello: server random, cipher suite, version, with ``supported_versions``
for TLS 1.3, encrypt-then-MAC for CBC suites), and runs the key schedules:

- TLS 1.2 (RFC 5246): key block = PRF(master secret, "key expansion",
  server_random + client_random), the PRF's hash by suite (SHA-256 or SHA-384);
  AES-GCM records carry an 8-byte explicit nonce after the 4-byte implicit salt,
  ChaCha20-Poly1305 (RFC 7905) nonce = iv XOR seq; AAD = seq, type, version,
  plaintext length.  AES-CBC + HMAC, MAC-then-encrypt or encrypt-then-MAC
  (RFC 7366).  Each direction switches to its keys at its ChangeCipherSpec.
- TLS 1.3 (RFC 8446): traffic key/iv = HKDF-Expand-Label(secret, "key"/"iv"),
  nonce = iv XOR seq, AAD = the record header, inner content type after the
  padding; handshake secrets until each side's Finished, then the application
  secrets; KeyUpdate replaces a direction's secret with
  HKDF-Expand-Label(secret, "traffic upd", "", Hash.length).

The master secret / traffic secrets come from a ``capture.keylog.KeyLog`` by the
connection's client random.  Primitives are the ``cryptography`` package's.

With a key log that grows (``KeyLog.growing``: live capture, clients append lines
as they connect), a missing secret is waited for rather than a failure: the
direction's records are queued (``waiting``, at most ``MAX_WAIT_BYTES``) and
``resume()`` decrypts them once the key log has the secret; ``give_up()`` turns
the wait into the failure it would have been.

What cannot be decrypted says why (``failure``): no ClientHello or ServerHello
seen (handshake not captured), no key for this client random, an unsupported
version or cipher suite.  A record that fails authentication is an issue
(``pop_issues``) and ends decryption of its direction; every byte fed is
accounted for (``accounting``).  No secret or derived key appears in any message.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from kwinspect.capture.keylog import KeyLog

CT_CCS, CT_ALERT, CT_HANDSHAKE, CT_APPLICATION_DATA = 20, 21, 22, 23
HS_CLIENT_HELLO, HS_SERVER_HELLO, HS_FINISHED, HS_KEY_UPDATE = 1, 2, 20, 24
MAX_RECORD = (1 << 14) + 2048
MAX_WAIT_BYTES = 16 << 20  # records queued per direction while its key is awaited
HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
VERSIONS = {0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: "TLS 1.2", 0x0304: "TLS 1.3"}


@dataclass(frozen=True)
class Suite:
    name: str
    kind: str  # "gcm" | "chacha" | "cbc"
    key_len: int
    hash: str  # "sha256" | "sha384": the PRF's / HKDF's hash
    mac: str | None = None  # CBC: the HMAC's hash ("sha1", "sha256", "sha384")


def _suites() -> dict[int, Suite]:
    s: dict[int, Suite] = {
        0x1301: Suite("TLS_AES_128_GCM_SHA256", "gcm", 16, "sha256"),
        0x1302: Suite("TLS_AES_256_GCM_SHA384", "gcm", 32, "sha384"),
        0x1303: Suite("TLS_CHACHA20_POLY1305_SHA256", "chacha", 32, "sha256"),
    }
    for code, kx in ((0xC02F, "ECDHE_RSA"), (0xC02B, "ECDHE_ECDSA"), (0x009E, "DHE_RSA"), (0x009C, "RSA")):
        s[code] = Suite(f"TLS_{kx}_WITH_AES_128_GCM_SHA256", "gcm", 16, "sha256")
        s[code + 1] = Suite(f"TLS_{kx}_WITH_AES_256_GCM_SHA384", "gcm", 32, "sha384")
    for code, kx in ((0xCCA8, "ECDHE_RSA"), (0xCCA9, "ECDHE_ECDSA"), (0xCCAA, "DHE_RSA")):
        s[code] = Suite(f"TLS_{kx}_WITH_CHACHA20_POLY1305_SHA256", "chacha", 32, "sha256")
    for code, name, key_len, mac in (
            (0x002F, "RSA_WITH_AES_128_CBC_SHA", 16, "sha1"), (0x0035, "RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
            (0x0033, "DHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"), (0x0039, "DHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
            (0xC009, "ECDHE_ECDSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
            (0xC00A, "ECDHE_ECDSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
            (0xC013, "ECDHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
            (0xC014, "ECDHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
            (0x003C, "RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
            (0x003D, "RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
            (0x0067, "DHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
            (0x006B, "DHE_RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
            (0xC023, "ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
            (0xC024, "ECDHE_ECDSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
            (0xC027, "ECDHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
            (0xC028, "ECDHE_RSA_WITH_AES_256_CBC_SHA384", 32, "sha384")):
        s[code] = Suite(f"TLS_{name}", "cbc", key_len, "sha384" if mac == "sha384" else "sha256", mac)
    return s


SUITES = _suites()
_HASHES = {"sha256": hashes.SHA256, "sha384": hashes.SHA384}
_HASH_LEN = {"sha1": 20, "sha256": 32, "sha384": 48}


# -- key schedules ---------------------------------------------------------------------

def prf12(secret: bytes, label: bytes, seed: bytes, length: int, hash_name: str = "sha256") -> bytes:
    """The TLS 1.2 PRF (RFC 5246 section 5): P_hash(secret, label + seed)."""
    seed = label + seed
    out = bytearray()
    a = seed
    while len(out) < length:
        a = hmac.new(secret, a, hash_name).digest()
        out += hmac.new(secret, a + seed, hash_name).digest()
    return bytes(out[:length])


def hkdf_expand_label(secret: bytes, label: str, context: bytes, length: int, hash_name: str = "sha256") -> bytes:
    """HKDF-Expand-Label (RFC 8446 section 7.1)."""
    full = b"tls13 " + label.encode()
    info = struct.pack(">HB", length, len(full)) + full + bytes([len(context)]) + context
    return HKDFExpand(_HASHES[hash_name](), length, info).derive(secret)


def tls13_traffic_keys(secret: bytes, suite: Suite) -> tuple[bytes, bytes]:
    """(key, iv) of a TLS 1.3 traffic secret (RFC 8446 section 7.3)."""
    return (hkdf_expand_label(secret, "key", b"", suite.key_len, suite.hash),
            hkdf_expand_label(secret, "iv", b"", 12, suite.hash))


def tls13_next_secret(secret: bytes, suite: Suite) -> bytes:
    """The traffic secret after a KeyUpdate (RFC 8446 section 7.2)."""
    return hkdf_expand_label(secret, "traffic upd", b"", _HASH_LEN[suite.hash], suite.hash)


def tls12_key_block(master: bytes, client_random: bytes, server_random: bytes,
                    suite: Suite) -> tuple[tuple[bytes, bytes, bytes], tuple[bytes, bytes, bytes]]:
    """((client mac key, key, iv), (server mac key, key, iv)) from the master secret."""
    mac_len = _HASH_LEN[suite.mac] if suite.mac else 0
    iv_len = {"gcm": 4, "chacha": 12, "cbc": 0}[suite.kind]
    n = 2 * (mac_len + suite.key_len + iv_len)
    kb = prf12(master, b"key expansion", server_random + client_random, n, suite.hash)
    p = 0

    def take(k: int) -> bytes:
        nonlocal p
        p += k
        return kb[p - k:p]

    cmac, smac = take(mac_len), take(mac_len)
    ckey, skey = take(suite.key_len), take(suite.key_len)
    civ, siv = take(iv_len), take(iv_len)
    return (cmac, ckey, civ), (smac, skey, siv)


class DecryptError(Exception):
    """A record failed authentication (or its padding/length was wrong)."""


class _Cipher:
    """One direction's record protection: decrypt(type, version, body) -> plaintext."""

    def __init__(self, suite: Suite, tls13: bool, mac_key: bytes, key: bytes, iv: bytes, etm: bool = False) -> None:
        self.suite = suite
        self.tls13 = tls13
        self.seq = 0
        self.iv = iv
        self.etm = etm
        self.mac_key = mac_key
        self.key = key
        self.aead = (AESGCM(key) if suite.kind == "gcm" else ChaCha20Poly1305(key)
                     if suite.kind == "chacha" else None)

    def decrypt(self, ctype: int, version: int, body: bytes) -> bytes:
        seq = self.seq
        self.seq += 1
        kind = self.suite.kind
        if self.tls13 or kind == "chacha":
            nonce = (int.from_bytes(self.iv, "big") ^ seq).to_bytes(12, "big")
            if self.tls13:
                aad = struct.pack(">BHH", ctype, version, len(body))
            else:
                if len(body) < 16:
                    raise DecryptError("record shorter than its tag")
                aad = struct.pack(">QBHH", seq, ctype, version, len(body) - 16)
            try:
                return self.aead.decrypt(nonce, body, aad)
            except InvalidTag:
                raise DecryptError("authentication tag mismatch") from None
        if kind == "gcm":
            if len(body) < 24:
                raise DecryptError("record shorter than its nonce and tag")
            nonce = self.iv + body[:8]
            aad = struct.pack(">QBHH", seq, ctype, version, len(body) - 24)
            try:
                return self.aead.decrypt(nonce, body[8:], aad)
            except InvalidTag:
                raise DecryptError("authentication tag mismatch") from None
        return self._cbc(seq, ctype, version, body)

    def _cbc(self, seq: int, ctype: int, version: int, body: bytes) -> bytes:
        mac_name = self.suite.mac or "sha256"
        mac_len = _HASH_LEN[mac_name]
        if self.etm:
            if len(body) < 32 + mac_len or (len(body) - mac_len) % 16:
                raise DecryptError("bad record length")
            ct, tag = body[:-mac_len], body[-mac_len:]
            want = hmac.new(self.mac_key, struct.pack(">QBHH", seq, ctype, version, len(ct)) + ct,
                            mac_name).digest()
            if not hmac.compare_digest(want, tag):
                raise DecryptError("MAC mismatch")
            dec = Cipher(algorithms.AES(self.key), modes.CBC(ct[:16])).decryptor()
            plain = dec.update(ct[16:]) + dec.finalize()
            pad = plain[-1]
            if pad + 1 > len(plain):
                raise DecryptError("bad padding")
            return plain[:-(pad + 1)]
        if len(body) < 32 or len(body) % 16:
            raise DecryptError("bad record length")
        dec = Cipher(algorithms.AES(self.key), modes.CBC(body[:16])).decryptor()
        plain = dec.update(body[16:]) + dec.finalize()
        pad = plain[-1]
        if pad + 1 + mac_len > len(plain):
            raise DecryptError("bad padding")
        content, tag = plain[:-(pad + 1 + mac_len)], plain[-(pad + 1 + mac_len):-(pad + 1)]
        want = hmac.new(self.mac_key, struct.pack(">QBHH", seq, ctype, version, len(content)) + content,
                        mac_name).digest()
        if not hmac.compare_digest(want, tag):
            raise DecryptError("MAC mismatch")
        return content


# -- handshake parsing -----------------------------------------------------------------

def _extensions(body: bytes, p: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    if p + 2 > len(body):
        return out
    end = min(len(body), p + 2 + int.from_bytes(body[p:p + 2], "big"))
    p += 2
    while p + 4 <= end:
        etype, elen = struct.unpack_from(">HH", body, p)
        out[etype] = body[p + 4:p + 4 + elen]
        p += 4 + elen
    return out


def parse_client_hello(body: bytes) -> bytes | None:
    """The client random of a ClientHello body, None if it is too short."""
    return body[2:34] if len(body) >= 34 else None


def parse_server_hello(body: bytes) -> tuple[bytes, int, int, bool] | None:
    """(server random, cipher suite, negotiated version, encrypt-then-MAC) of a ServerHello."""
    if len(body) < 38:
        return None
    version = int.from_bytes(body[:2], "big")
    random = body[2:34]
    sid_len = body[34]
    p = 35 + sid_len
    if p + 3 > len(body):
        return None
    suite = int.from_bytes(body[p:p + 2], "big")
    ext = _extensions(body, p + 3)
    sv = ext.get(43)
    if sv is not None and len(sv) == 2:
        version = int.from_bytes(sv, "big")
    return random, suite, version, 22 in ext


# -- the session -----------------------------------------------------------------------

class _Direction:
    __slots__ = ("buf", "hs", "cipher", "secret", "dead", "counts", "app_keys", "records", "wait", "queue",
                 "queued")

    def __init__(self) -> None:
        self.buf = bytearray()  # an incomplete record
        self.hs = bytearray()  # an incomplete handshake message
        self.cipher: _Cipher | None = None
        self.secret: bytes | None = None  # TLS 1.3: the current traffic secret
        self.dead = False  # no more decryption: the rest is counted as undecryptable
        self.app_keys = False  # TLS 1.3: on the application traffic secrets
        self.records = 0
        self.wait: str | None = None  # the key log label awaited (a growing key log)
        self.queue: list[tuple[int, int, bytes, object]] = []  # records waiting for it, with their tags
        self.queued = 0
        self.counts = {"handshake": 0, "change_cipher_spec": 0, "alert": 0, "application_data": 0,
                       "undecryptable": 0}


class TlsSession:
    """One TCP connection's TLS, fed per direction (``client``: the side that sent
    the ClientHello; the driver tells which)."""

    def __init__(self, keys: KeyLog) -> None:
        self.keys = keys
        self.client_random: bytes | None = None
        self.server_random: bytes | None = None
        self.suite_id: int | None = None
        self.suite: Suite | None = None
        self.version: int | None = None
        self.etm = False
        self.failure: str | None = None  # why the connection is not decrypted
        self.decrypted_records = 0
        self._issues: list[str] = []
        self._dirs = (_Direction(), _Direction())  # server, client
        self._app: list[list[bytes]] = [[], []]  # decrypted application data not yet handed out
        self._tag: object = None  # the caller's tag of the bytes being fed (queued with a record)

    # -- what the driver reads ------------------------------------------------------

    @property
    def version_name(self) -> str:
        return VERSIONS.get(self.version or 0, f"version 0x{self.version or 0:04x}")

    def describe(self) -> str:
        """e.g. ``TLS 1.3, TLS_AES_128_GCM_SHA256`` (what is known of it)."""
        if self.version is None:
            return "TLS"
        suite = self.suite.name if self.suite else f"cipher suite 0x{self.suite_id or 0:04x}"
        return f"{self.version_name}, {suite}"

    def pop_issues(self) -> list[str]:
        issues, self._issues = self._issues, []
        return issues

    def accounting(self, from_client: bool) -> dict[str, int]:
        d = self._dirs[from_client]
        out = dict(d.counts)
        out["buffered"] = len(d.buf) + d.queued
        return out

    @property
    def waiting(self) -> bool:
        """A direction waits for a secret the (growing) key log does not have yet."""
        if self.failure is not None:
            return False
        return any(d.wait is not None and not d.dead for d in self._dirs)

    def first_waiting_tag(self) -> object:
        """The tag of the oldest queued record (None if none)."""
        tags = [d.queue[0][3] for d in self._dirs if d.queue]
        return min(tags, key=lambda t: t[1] if isinstance(t, tuple) else 0) if tags else None

    def resume(self) -> list[tuple[bool, object, list[bytes]]]:
        """Try the awaited secrets again (the key log grew): the queued records of each
        direction that now has its key are decrypted; returns (from_client, tag,
        application data) per record that gave some, each direction in order."""
        out: list[tuple[bool, object, list[bytes]]] = []
        for from_client in (False, True):
            d = self._dirs[from_client]
            if d.wait is None or d.dead or self.failure is not None:
                continue
            if not self._set_keys(d, from_client, d.wait):
                continue
            d.wait = None
            queue, d.queue, d.queued = d.queue, [], 0
            for i, (ctype, version, record, tag) in enumerate(queue):
                if self.failure is not None or d.dead:
                    d.counts["undecryptable"] += sum(len(r[2]) for r in queue[i:])
                    break
                self._tag = tag
                self._record(d, from_client, ctype, version, record)
                if self._app[from_client]:
                    out.append((from_client, tag, self._app[from_client]))
                    self._app[from_client] = []
            self._tag = None
        return out

    def give_up(self) -> None:
        """Stop waiting (the connection ended, or the capture): the awaited secret is
        missing, as with a key log that does not grow."""
        for d in self._dirs:
            if d.wait is not None:
                d.counts["undecryptable"] += d.queued + len(d.buf)
                d.queue, d.queued = [], 0
                del d.buf[:]
                if self.failure is None:
                    self._missing(d.wait, None)
                d.wait = None

    # -- input ----------------------------------------------------------------------

    def feed(self, from_client: bool, data: bytes, tag: object = None) -> list[bytes]:
        """Bytes one direction sent, in order; returns its application data decrypted.
        ``tag`` (the caller's, e.g. the packet) goes with records queued while waiting
        for a key, and comes back from ``resume()``."""
        self._tag = tag
        d = self._dirs[from_client]
        if d.dead or self.failure is not None:
            d.counts["undecryptable"] += len(data)
            return []
        buf = d.buf
        buf += data
        out = self._app[from_client]
        p = 0
        n = len(buf)
        while n - p >= 5:
            ctype = buf[p]
            version, length = struct.unpack_from(">HH", buf, p + 1)
            if not 20 <= ctype <= 24 or version >> 8 != 3 or length > MAX_RECORD:
                rest = n - p
                del buf[:]
                d.counts["undecryptable"] += rest
                self._kill(d, from_client, "not a TLS record where one should start", rest)
                break
            if n - p < 5 + length:
                break
            record = bytes(buf[p:p + 5 + length])
            p += 5 + length
            self._record(d, from_client, ctype, version, record)
            if self.failure is not None or d.dead:
                d.counts["undecryptable"] += n - p
                p = n
                break
        del buf[:p]
        if self.failure is not None or d.dead:
            d.counts["undecryptable"] += len(buf)
            del buf[:]
        if out:
            self._app[from_client] = []
        return out

    def gap(self, from_client: bool, nbytes: int) -> None:
        """Bytes of one direction were lost: record boundaries are gone for good."""
        d = self._dirs[from_client]
        if d.dead or self.failure is not None:
            return
        d.counts["undecryptable"] += len(d.buf)
        del d.buf[:]
        self._kill(d, from_client, f"{nbytes} bytes lost: record boundaries unknown", 0)

    # -- records --------------------------------------------------------------------

    def _kill(self, d: _Direction, from_client: bool, why: str, _n: int) -> None:
        d.dead = True
        side = "client" if from_client else "server"
        self._issues.append(f"TLS ({self.describe()}): {why} in the {side}'s record {d.records + 1}; "
                            f"the rest of the {side}'s data is not decrypted")

    def _record(self, d: _Direction, from_client: bool, ctype: int, version: int, record: bytes) -> None:
        size = len(record)
        if d.wait is not None:
            self._queue(d, ctype, version, record)
            return
        body = record[5:]
        if d.cipher is None or ctype == CT_CCS:
            # plaintext (TLS 1.3 also sends a plaintext middlebox ChangeCipherSpec)
            d.records += 1
            if ctype == CT_HANDSHAKE:
                d.counts["handshake"] += size
                self._handshake(d, from_client, body)
            elif ctype == CT_CCS:
                d.counts["change_cipher_spec"] += size
                if self.version == 0x0303 and d.cipher is None:
                    self._start_tls12(d, from_client)
            elif ctype == CT_ALERT:
                d.counts["alert"] += size
            elif ctype == CT_APPLICATION_DATA and self.version == 0x0304 and d.cipher is None:
                self._start_tls13(d, from_client)
                if d.cipher is not None or d.wait is not None:
                    d.records -= 1
                    self._record(d, from_client, ctype, version, record)
                else:
                    d.counts["undecryptable"] += size
            else:
                d.counts["undecryptable"] += size
                if self.failure is None:
                    self.failure = ("handshake not captured (encrypted data before a ClientHello and ServerHello)"
                                    if self.server_random is None else "encrypted data before the keys changed")
            return
        d.records += 1
        try:
            plain = d.cipher.decrypt(ctype, version, body)
        except DecryptError as e:
            d.counts["undecryptable"] += size
            self._kill(d, from_client, str(e), size)
            return
        self.decrypted_records += 1
        if d.cipher.tls13:
            i = len(plain) - 1
            while i >= 0 and plain[i] == 0:
                i -= 1
            if i < 0:
                d.counts["undecryptable"] += size
                self._kill(d, from_client, "no inner content type", size)
                return
            ctype, plain = plain[i], plain[:i]
        if ctype == CT_APPLICATION_DATA:
            d.counts["application_data"] += size
            if plain:
                self._app[from_client].append(plain)
        elif ctype == CT_HANDSHAKE:
            d.counts["handshake"] += size
            self._handshake(d, from_client, plain)
        elif ctype == CT_ALERT:
            d.counts["alert"] += size
        else:
            d.counts["undecryptable"] += size

    def _queue(self, d: _Direction, ctype: int, version: int, record: bytes) -> None:
        d.queue.append((ctype, version, record, self._tag))
        d.queued += len(record)
        if d.queued > MAX_WAIT_BYTES:
            self.give_up()

    def _handshake(self, d: _Direction, from_client: bool, data: bytes) -> None:
        hs = d.hs
        hs += data
        p = 0
        while len(hs) - p >= 4:
            mtype = hs[p]
            mlen = int.from_bytes(hs[p + 1:p + 4], "big")
            if len(hs) - p < 4 + mlen:
                break
            body = bytes(hs[p + 4:p + 4 + mlen])
            p += 4 + mlen
            self._message(d, from_client, mtype, body)
            if self.failure is not None or d.dead:
                break
        del hs[:p]

    def _message(self, d: _Direction, from_client: bool, mtype: int, body: bytes) -> None:
        if mtype == HS_CLIENT_HELLO and from_client and d.cipher is None:
            cr = parse_client_hello(body)
            if cr is not None:
                self.client_random = cr
        elif mtype == HS_SERVER_HELLO and not from_client and d.cipher is None:
            sh = parse_server_hello(body)
            if sh is None:
                self.failure = "malformed ServerHello"
                return
            random, suite, version, etm = sh
            if random == HRR_RANDOM:  # HelloRetryRequest: a second ClientHello and ServerHello follow
                return
            self.server_random, self.suite_id, self.version, self.etm = random, suite, version, etm
            self.suite = SUITES.get(suite)
            if self.client_random is None:
                self.failure = "handshake not captured (no ClientHello)"
            elif version not in (0x0303, 0x0304):
                self.failure = f"unsupported version {self.version_name}"
            elif self.suite is None or (version == 0x0304) != (suite >> 8 == 0x13):
                self.failure = f"unsupported cipher suite 0x{suite:04x}"
            elif version == 0x0304:
                self._start_tls13(d, False)
        elif d.cipher is not None and d.cipher.tls13:
            if mtype == HS_FINISHED and not d.app_keys:
                self._tls13_switch(d, from_client, "CLIENT_TRAFFIC_SECRET_0" if from_client
                                   else "SERVER_TRAFFIC_SECRET_0")
                d.app_keys = True
            elif mtype == HS_KEY_UPDATE and d.app_keys and d.secret is not None:
                d.secret = tls13_next_secret(d.secret, self.suite)
                key, iv = tls13_traffic_keys(d.secret, self.suite)
                d.cipher = _Cipher(self.suite, True, b"", key, iv)

    # -- keys -----------------------------------------------------------------------

    def _missing(self, label: str, d: _Direction | None) -> None:
        """The key log lacks ``label``: wait for it if the key log grows, else fail."""
        if d is not None and self.keys.growing:
            d.wait = label
            return
        if self.keys.has_client_random(self.client_random or b""):
            self.failure = f"the key log has no {label} for this client random"
        else:
            self.failure = "no key for this client random in the key log"

    def _start_tls12(self, d: _Direction, from_client: bool) -> None:
        if self.client_random is None or self.server_random is None or self.suite is None:
            self.failure = self.failure or "handshake not captured (no ClientHello and ServerHello)"
            return
        if not self._set_keys(d, from_client, "CLIENT_RANDOM"):
            self._missing("CLIENT_RANDOM", d)

    def _start_tls13(self, d: _Direction, from_client: bool) -> None:
        # the server's keys change right after its ServerHello; the client's direction is
        # set up at the same time (its next protected record uses its handshake secret)
        if self.client_random is None or self.suite is None:
            self.failure = self.failure or "handshake not captured (no ClientHello and ServerHello)"
            return
        for side in (False, True):
            dd = self._dirs[side]
            if dd.cipher is not None:
                continue
            if dd.wait is not None:
                continue
            label = "CLIENT_HANDSHAKE_TRAFFIC_SECRET" if side else "SERVER_HANDSHAKE_TRAFFIC_SECRET"
            if not self._set_keys(dd, side, label):
                # the handshake secrets are needed to find where the application keys start
                # (the Finished messages are encrypted): the connection is reported as missing them
                self._missing(label, dd)
                if self.failure is not None:
                    return

    def _tls13_switch(self, d: _Direction, from_client: bool, label: str) -> None:
        if not self._set_keys(d, from_client, label):
            self._missing(label, d)

    def _set_keys(self, d: _Direction, from_client: bool, label: str) -> bool:
        """The direction's cipher from the key log's ``label`` secret; False if it has none."""
        secret = self.keys.get(label, self.client_random or b"")
        if secret is None:
            return False
        if label == "CLIENT_RANDOM":
            c, s = tls12_key_block(secret, self.client_random, self.server_random, self.suite)
            mac_key, key, iv = c if from_client else s
            d.cipher = _Cipher(self.suite, False, mac_key, key, iv, self.etm)
        else:
            d.secret = secret
            key, iv = tls13_traffic_keys(secret, self.suite)
            d.cipher = _Cipher(self.suite, True, b"", key, iv)
        return True
