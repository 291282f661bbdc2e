"""Keep credentials out of every output unless the user asks for them (--no-redact).

Covers SASL/PLAIN passwords, SCRAM client proofs and server signatures,
OAUTHBEARER tokens, and delegation-token HMACs, whether they travel inside
SaslAuthenticate or as raw tokens after a SaslHandshake v0.
"""

from __future__ import annotations

import re
from typing import Any

from kwinspect.protocol.schema.api_keys import ApiKey

REDACTED = "<redacted>"

SASL_HANDSHAKE = int(ApiKey.SASL_HANDSHAKE)
SASL_AUTHENTICATE = int(ApiKey.SASL_AUTHENTICATE)
CREATE_DELEGATION_TOKEN = int(ApiKey.CREATE_DELEGATION_TOKEN)
RENEW_DELEGATION_TOKEN = int(ApiKey.RENEW_DELEGATION_TOKEN)
EXPIRE_DELEGATION_TOKEN = int(ApiKey.EXPIRE_DELEGATION_TOKEN)
DESCRIBE_DELEGATION_TOKEN = int(ApiKey.DESCRIBE_DELEGATION_TOKEN)
# the apis redact_body acts on; for the others it returns at once
REDACTED_APIS = frozenset({SASL_AUTHENTICATE, CREATE_DELEGATION_TOKEN, RENEW_DELEGATION_TOKEN,
                           EXPIRE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN})
# apis whose frames carry credentials: the redacted ones plus SaslHandshake (raw tokens follow it)
SECRET_APIS = REDACTED_APIS | {SASL_HANDSHAKE}

_SCRAM_SECRET = re.compile(rb"(^|,)(p|v)=[^,]*")
# SCRAM messages (RFC 5802): an optional GS2 header, then single-letter attributes
# (only RFC 5802's attributes: any other letter could carry anything, so it is not SCRAM)
_SCRAM_MESSAGE = re.compile(rb"^(?:[nyp][^,]*,[^,]*,)?[nrcsipve]=[\x21-\x2b\x2d-\x7e]*"
                            rb"(?:,[nrcsipve]=[\x21-\x2b\x2d-\x7e]*)*$")
# OAUTHBEARER (RFC 7628): key=value pairs after the GS2 header, separated by ^A
_GS2_HEADER = re.compile(rb"^[nyp][^,\x00-\x1f]*,[^,\x00-\x1f]*,$")
_OAUTH_KEY = re.compile(rb"^[A-Za-z]+$")


def describe_sasl_token(token: bytes | None, mechanism: str | None, from_client: bool,
                        redact: bool = True) -> dict[str, Any]:
    """A SASL token as a structure, secrets redacted.

    What is secret is decided by what the bytes are, never by the mechanism the
    handshake announced (a client may announce SCRAM and send a PLAIN token): a
    token that parses as PLAIN shows its names, one that parses as SCRAM or
    OAUTHBEARER shows its attributes, each with its credential redacted; anything
    else (GSSAPI, unknown, garbage) is opaque and withheld whole.
    """
    if token is None:
        return {"mechanism": mechanism, "token": None}
    out: dict[str, Any] = {"mechanism": mechanism, "size": len(token)}
    token = bytes(token)
    if not redact:
        if (mechanism or "").upper() == "PLAIN" and from_client and token.count(b"\x00") == 2:
            authzid, user, password = token.split(b"\x00")
            out.update(authorization_id=authzid.decode("utf-8", "replace"),
                       username=user.decode("utf-8", "replace"), password=password.decode("utf-8", "replace"))
        else:
            out["message"] = token.decode("utf-8", "replace").replace("\x01", "^A")
        return out
    if from_client and token.count(b"\x00") == 2:  # PLAIN: authzid NUL authcid NUL passwd
        authzid, user, _password = token.split(b"\x00")
        out.update(authorization_id=authzid.decode("utf-8", "replace"),
                   username=user.decode("utf-8", "replace"), password=REDACTED)
        return out
    if from_client and b"\x01" in token:  # OAUTHBEARER client response
        oauth = _oauth_message(token)
        if oauth is not None:
            out["message"] = oauth
            return out
    if _SCRAM_MESSAGE.match(token):  # SCRAM: the proof (p=) and the server signature (v=) are secret
        out["message"] = _SCRAM_SECRET.sub(lambda m: m.group(1) + m.group(2) + b"=" + REDACTED.encode(),
                                           token).decode("ascii")
        return out
    if not from_client and (not token or _is_json_object(token)):
        # a broker's empty PLAIN answer, an OAUTHBEARER error status: no credential in either
        out["message"] = token.decode("utf-8", "replace")
        return out
    # GSSAPI, unknown mechanisms, anything that parses as none of the above: opaque, withheld
    out["token"] = REDACTED
    return out


def _oauth_message(token: bytes) -> str | None:
    """An OAUTHBEARER client response with every value but host and port withheld, or None
    when the bytes are not one (RFC 7628: gs2-header ^A *(key=value ^A) ^A)."""
    head, sep, rest = token.partition(b"\x01")
    if not sep or not _GS2_HEADER.match(head):
        return None
    parts = []
    for pair in rest.split(b"\x01"):
        if not pair:
            continue
        key, eq, value = pair.partition(b"=")
        if not eq or not _OAUTH_KEY.match(key):
            return None
        shown = value if key.lower() in (b"host", b"port") else REDACTED.encode()
        parts.append(key + b"=" + shown)
    return (head + b"^A" + b"^A".join(parts)).decode("utf-8", "replace")


def _is_json_object(token: bytes) -> bool:
    import json

    try:
        return isinstance(json.loads(token), dict)
    except ValueError:
        return False


def redact_unknown_tags(value: Any) -> None:
    """Withhold unknown tagged fields (raw bytes we cannot vouch for) anywhere in a message, in place."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            tags = v.get("_unknown_tags")
            if isinstance(tags, dict):
                v["_unknown_tags"] = {t: REDACTED for t in tags}
            stack.extend(x for x in v.values() if isinstance(x, dict | list))
        elif isinstance(v, list):
            stack.extend(x for x in v if isinstance(x, dict | list))


def redact_message(api_key: int | None, is_request: bool, header: dict | None, body: dict | None,
                   mechanism: str | None) -> None:
    """Redact a decoded message of a secret-carrying api: its body's secrets and unknown tags
    in header and body (a crafted client can put a password in a tag we do not know)."""
    if api_key not in SECRET_APIS:
        return
    redact_body(api_key, is_request, body, mechanism)
    redact_unknown_tags(header)
    redact_unknown_tags(body)


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
