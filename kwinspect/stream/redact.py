"""Keep credentials out of every output unless the user asks for them (--no-redact).

Covers SASL/PLAIN passwords, SCRAM client proofs and server signatures,
OAUTHBEARER tokens, and delegation-token HMACs, whether they travel inside
SaslAuthenticate or as raw tokens after a SaslHandshake v0.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
CREATE_DELEGATION_TOKEN = 38
RENEW_DELEGATION_TOKEN = 39
EXPIRE_DELEGATION_TOKEN = 40
DESCRIBE_DELEGATION_TOKEN = 41
# the apis redact_body acts on; for the others it returns at once
REDACTED_APIS = frozenset({SASL_AUTHENTICATE, CREATE_DELEGATION_TOKEN, RENEW_DELEGATION_TOKEN,
                           EXPIRE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN})
# apis whose frames carry credentials: the redacted ones plus SaslHandshake (raw tokens follow it)
SECRET_APIS = REDACTED_APIS | {SASL_HANDSHAKE}

_SCRAM_SECRET = re.compile(rb"(^|,)(p|v)=[^,]*")
_OAUTH_TOKEN = re.compile(rb"(auth=Bearer )[^\x01]*", re.I)


def describe_sasl_token(token: bytes | None, mechanism: str | None, from_client: bool,
                        redact: bool = True) -> dict[str, Any]:
    """A SASL token as a structure: PLAIN split into its parts, secrets redacted."""
    if token is None:
        return {"mechanism": mechanism, "token": None}
    mech = (mechanism or "").upper()
    out: dict[str, Any] = {"mechanism": mechanism, "size": len(token)}
    if mech == "PLAIN" and from_client:
        parts = token.split(b"\x00")
        if len(parts) == 3:
            out["authorization_id"] = parts[0].decode("utf-8", "replace")
            out["username"] = parts[1].decode("utf-8", "replace")
            out["password"] = REDACTED if redact else parts[2].decode("utf-8", "replace")
            return out
    if mech.startswith("SCRAM"):
        text = _SCRAM_SECRET.sub(lambda m: m.group(1) + m.group(2) + b"=" + REDACTED.encode(), token) if redact else token
        out["message"] = text.decode("utf-8", "replace")
        return out
    if mech == "OAUTHBEARER" and from_client:
        text = _OAUTH_TOKEN.sub(lambda m: m.group(1) + REDACTED.encode(), token) if redact else token
        out["message"] = text.decode("utf-8", "replace").replace("\x01", "^A")
        return out
    if mech == "PLAIN" and not from_client:
        out["message"] = token.decode("utf-8", "replace")
        return out
    # GSSAPI and unknown mechanisms: opaque; redact, as we cannot tell what is secret.
    out["token"] = REDACTED if redact else token
    return out


def redact_body(api_key: int | None, is_request: bool, body: dict | None, mechanism: str | None) -> None:
    """Replace secrets inside a decoded body, in place."""
    if not body or api_key not in REDACTED_APIS:
        return
    if api_key == SASL_AUTHENTICATE and isinstance(body.get("auth_bytes"), bytes | type(None)):
        body["auth_bytes"] = describe_sasl_token(body.get("auth_bytes"), mechanism, is_request)
    elif api_key in (RENEW_DELEGATION_TOKEN, EXPIRE_DELEGATION_TOKEN) and is_request and "hmac" in body:
        body["hmac"] = REDACTED
    elif api_key == CREATE_DELEGATION_TOKEN and not is_request and "hmac" in body:
        body["hmac"] = REDACTED
    elif api_key == DESCRIBE_DELEGATION_TOKEN and not is_request:
        tokens = body.get("tokens")
        for token in tokens if isinstance(tokens, list) else ():  # a hand-built body may hold anything
            if isinstance(token, dict) and "hmac" in token:
                token["hmac"] = REDACTED
