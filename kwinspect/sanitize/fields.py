"""What each field of a decoded Kafka message becomes in a sanitized capture.

``sanitize_message(msg, ps)`` changes a decoded Message's header and body in
place; the caller encodes it again (protocol/encode.py).  The rules go by field
name (the schema tables' snake_case names), with the enclosing array's name or
the api key where a name means different things:

- names become stable pseudonyms (Pseudonyms.name): client ids, topics, groups,
  members (member ids, group instance ids, a JoinGroup's leader), transactional
  ids, principals and users, hosts (a broker's, a coordinator's, a group
  member's client host; address literals become the mapped addresses);
- broker ports (``port`` fields) are mapped as the TCP ports are when broker
  ports are mapped (--map-broker-ports), else kept;
- secrets are removed (empty bytes): SASL tokens (SaslAuthenticate, which
  carries PLAIN passwords, SCRAM exchanges and OAuth tokens), delegation token
  HMACs, SCRAM salts and salted passwords;
- record keys, values and header values: Pseudonyms.value (keyed hash of the
  same length by default), batches rebuilt by protocol/record_rewrite.py;
- consumer-protocol bytes (JoinGroup/SyncGroup/DescribeGroups metadata and
  assignments) are decoded, their topics replaced, and encoded again; bytes
  that do not decode as the consumer protocol, and any other bytes field, are
  removed;
- every other string (error messages, config values, reasons) keeps its text
  with the names replaced so far replaced in it (Pseudonyms.scrub), except the
  names of software, SASL mechanisms and group protocols (KEPT).

Numbers, uuids, booleans, error codes and the structure stay as they are.  A
message that holds what these rules cannot see into (tagged fields unknown to
the tables) raises ``Unsanitizable``: the frame is then dropped or zeroed.
"""

from __future__ import annotations

from typing import Any

from kwinspect.model import Message
from kwinspect.protocol.decode import decode_struct
from kwinspect.protocol.encode import EncodeError, encode_struct
from kwinspect.protocol.record_rewrite import RewriteError, rewrite_record_set
from kwinspect.protocol.records import RecordSet
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.sanitize.pseudonyms import Pseudonyms

FIND_COORDINATOR = int(ApiKey.FIND_COORDINATOR)
DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)
PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)

# field name -> pseudonym kind, wherever the name appears (strings and string arrays)
NAMES = {
    "client_id": "client", "topic": "topic", "topic_name": "topic", "topic_names": "topic",
    "subscribed_topic_names": "topic", "group_id": "group", "group_ids": "group",
    "groups_names": "group", "member_id": "member", "group_instance_id": "member",
    "instance_id": "member", "leader": "member", "transactional_id": "transactional",
    "transactional_ids": "transactional", "host": "host", "host_name": "host", "client_host": "host",
    "principal": "principal", "principal_name": "principal", "owner_principal_name": "principal",
    "token_requester_principal_name": "principal", "user": "principal",
}
# "name" inside an array of these names the element: a topic, a user
NAMED_ELEMENTS = {
    "topics": "topic", "topic_data": "topic", "forgotten_topics_data": "topic",
    "creatable_topics": "topic", "users": "principal", "deletions": "principal", "upsertions": "principal",
}
# an array called "topics" holding strings, and other arrays of names
NAME_ARRAYS = {"topics": "topic", "groups": "group", "renewers": "principal"}
# bytes that are secrets: removed
SECRETS = {
    "auth_bytes": "sasl_auth_bytes", "hmac": "delegation_token_hmac", "salt": "scram_salt",
    "salted_password": "scram_salted_password",
}
# consumer-protocol bytes: (field, struct) decoded and rewritten
GROUP_PROTOCOL = {
    "metadata": "ConsumerProtocolSubscription", "member_metadata": "ConsumerProtocolSubscription",
    "assignment": "ConsumerProtocolAssignment", "member_assignment": "ConsumerProtocolAssignment",
}


# strings that name software and protocols, not people or systems: kept as they are
# (free text is scrubbed, and a client id such as librdkafka's default "rdkafka" must
# not turn "librdkafka" into something else)
KEPT = frozenset({
    "client_software_name", "client_software_version", "mechanism", "mechanisms", "protocol_type",
    "protocol_name", "assignor_name", "server_assignor", "cluster_id",
})


class Unsanitizable(Exception):  # noqa: N818 - a verdict on a frame, not a bug
    """A message holds something the rules cannot see into."""


def sanitize_message(msg: Message, ps: Pseudonyms) -> None:
    header = msg.header
    if "client_id" in header:
        header["client_id"] = ps.name("client", header["client_id"])
    if header.get("_unknown_tags"):
        raise Unsanitizable("tagged fields in the header the tables do not know")
    if msg.body is not None:
        _walk(msg.body, ps, msg.api_key, None)


def _name_kind(name: str, parent: str | None, api_key: int | None) -> str | None:
    kind = NAMES.get(name)
    if kind is not None:
        return kind
    if name == "name" and parent in NAMED_ELEMENTS:
        return NAMED_ELEMENTS[parent]
    if name == "name" and parent == "responses" and api_key in (PRODUCE, FETCH):
        return "topic"
    if api_key == FIND_COORDINATOR and name in ("key", "coordinator_keys"):
        return "coordinator_key"
    return None


def _walk(d: dict[str, Any], ps: Pseudonyms, api_key: int | None, parent: str | None) -> None:
    if d.get("_unknown_tags"):
        raise Unsanitizable("tagged fields the tables do not know")
    key_kind = "transactional" if d.get("key_type") == 1 else "group"  # FindCoordinator
    for name, value in d.items():
        if name in KEPT:
            continue
        if name == "port" and type(value) is int:  # a broker's (Metadata, FindCoordinator, ...)
            d[name] = ps.body_port(value)
        elif isinstance(value, str):
            kind = _name_kind(name, parent, api_key)
            if kind == "coordinator_key":
                kind = key_kind
            d[name] = ps.name(kind, value) if kind else ps.scrub(value)
        elif isinstance(value, dict):
            _walk(value, ps, api_key, name)
        elif isinstance(value, list):
            if value and isinstance(value[0], dict):
                for item in value:
                    _walk(item, ps, api_key, name)
            elif value and isinstance(value[0], str):
                kind = _name_kind(name, parent, api_key) or NAME_ARRAYS.get(name)
                if kind == "coordinator_key":
                    kind = key_kind
                d[name] = [ps.name(kind, v) if kind else ps.scrub(v) for v in value]
        elif isinstance(value, RecordSet):
            d[name] = _records(value, ps)
        elif isinstance(value, (bytes, bytearray)):
            d[name] = _bytes(name, bytes(value), ps, api_key)


def _records(rs: RecordSet, ps: Pseudonyms) -> bytes:
    try:
        result = rewrite_record_set(rs.raw or b"", ps.value)
    except RewriteError as exc:
        raise Unsanitizable(f"records: {exc}") from None
    if result.dropped_tail_bytes:
        ps.count("partial_batch_bytes_dropped", result.dropped_tail_bytes)
    return result.data


def _bytes(name: str, data: bytes, ps: Pseudonyms, api_key: int | None) -> bytes:
    if not data:
        return data
    if name in SECRETS:
        return ps.removed(SECRETS[name])
    struct_name = GROUP_PROTOCOL.get(name)
    if struct_name is not None and len(data) >= 2:
        version = int.from_bytes(data[:2], "big", signed=True)
        value, issues = decode_struct(struct_name, version, data[2:])
        if value is not None and not issues:
            try:
                if encode_struct(struct_name, version, value) == data[2:]:  # understood in full
                    _walk(value, ps, api_key, None)
                    ps.count("group_protocol")
                    return data[:2] + encode_struct(struct_name, version, value)
            except EncodeError:
                pass
    return ps.removed(f"bytes_{name}")
