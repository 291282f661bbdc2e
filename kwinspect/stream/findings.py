"""What an exchange says at a glance: its topics, its error codes and where they sit.

Both walk the decoded bodies generically, so every api and version is covered
without a table per api: error codes live in fields whose name ends in
``error_code``; topics in elements of arrays whose field name mentions topics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kwinspect.protocol.errors import error_name, is_retriable
from kwinspect.protocol.records import RecordSet

_TOPIC_KEYS = ("name", "topic", "topic_name")
_PARTITION_KEYS = ("partition_index", "partition", "index", "partition_id")
_GROUP_KEYS = ("group_id", "group")
_ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"


def _is_topic_array(key: str) -> bool:
    return "topic" in key or key == "responses"


def topics_of(body: dict | None, topic_names: dict[str, str] | None = None) -> list[str]:
    """Topic names a body mentions, in first-seen order (topic ids mapped when known)."""
    if not body:
        return []
    seen: dict[str, None] = {}
    _walk_topics(body, False, topic_names or {}, seen)
    return list(seen)


def _walk_topics(node: dict, in_topic_array: bool, topic_names: dict, seen: dict) -> None:
    # Plain recursion instead of a closure with a generator per node: ~2x faster on real bodies.
    if in_topic_array:
        name = None
        for k in _TOPIC_KEYS:
            v = node.get(k)
            if isinstance(v, str):
                name = v
                break
        if not name:
            tid = node.get("topic_id")
            if isinstance(tid, str):
                name = topic_names.get(tid)
                if name is None and tid != _ZERO_UUID:
                    name = tid
        if name:
            seen.setdefault(name, None)
    for key, value in node.items():
        if isinstance(value, list):
            _walk_topics_list(value, _is_topic_array(key), topic_names, seen)
        elif isinstance(value, dict):
            _walk_topics(value, False, topic_names, seen)


def _walk_topics_list(node: list, in_topic_array: bool, topic_names: dict, seen: dict) -> None:
    for item in node:
        if isinstance(item, dict):
            _walk_topics(item, in_topic_array, topic_names, seen)
        elif isinstance(item, list):
            _walk_topics_list(item, in_topic_array, topic_names, seen)
        elif in_topic_array and isinstance(item, str):
            seen.setdefault(item, None)


def iter_errors(body: dict | None, topic_names: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Every non-zero ``*error_code`` in a response body with topic/partition/group/path."""
    if not body:
        return iter(())
    out: list[dict[str, Any]] = []
    _walk_errors(body, None, (None, body, False, False), topic_names or {}, out)
    return iter(out)


def _render_path(path: tuple | None) -> str:
    """``path`` is a chain (parent, part) built while walking; rendered only for an error."""
    parts = []
    while path is not None:
        path, part = path
        parts.append(part)
    text = ""
    for part in reversed(parts):
        if isinstance(part, int):
            text = f"{text}[{part}]"
        else:
            text = f"{text}.{part}" if text else part
    return text


def _context(ctx: tuple, topic_names: dict) -> tuple[Any, Any, Any]:
    """(topic, partition, group) of the node at the end of ``ctx``.

    ``ctx`` is the chain (parent ctx, dict node, in a topic array, under a partition
    key) of the dict nodes from the body down to this one.  The walk only builds the
    chain; the context is worked out here, from the top down, only for a node that
    holds an error code (almost none do): the same rules, in the same order (topic
    ids are looked up under the same conditions), as one carried down every node."""
    chain = []
    while ctx is not None:
        chain.append(ctx)
        ctx = ctx[0]
    topic = partition = group = None
    for _parent, node, in_topics, in_partitions in reversed(chain):
        if in_topics:
            for k in _TOPIC_KEYS:
                v = node.get(k)
                if isinstance(v, str):
                    topic = v
                    break
            else:
                tid = node.get("topic_id")
                if isinstance(tid, str) and topic is None:
                    topic = topic_names.get(tid, tid)
        if in_partitions:
            for k in _PARTITION_KEYS:
                v = node.get(k)
                if isinstance(v, int):
                    partition = v
                    break
        for k in _GROUP_KEYS:
            v = node.get(k)
            if isinstance(v, str):
                group = v
                break
    return topic, partition, group


def _error(node: dict, key: str, value: int, path: tuple | None, ctx: tuple, topic_names: dict) -> dict[str, Any]:
    topic, partition, group = _context(ctx, topic_names)
    msg_key = key.replace("error_code", "error_message")
    message = node.get(msg_key) if isinstance(node.get(msg_key), str) else node.get("error_message")
    return {
        "code": value,
        "name": error_name(value),
        "retriable": is_retriable(value),
        "topic": topic,
        "partition": partition,
        "group": group,
        "path": _render_path((path, key)),
        "message": message if isinstance(message, str) else None,
    }


def _walk_errors(node: dict, path: tuple | None, ctx: tuple, topic_names: dict, out: list) -> None:
    # Error codes are rare and the walk visits every dict of every response: it carries
    # only the chain of nodes (ctx) and works out topic/partition/group when it finds one
    # (see _context).  One pass over the items, children walked as they come; a node's
    # own errors still come before its children's (inserted at `start`).  Exact types
    # first (what decoded bodies hold), isinstance for anything else.
    start = len(out)
    for key, value in node.items():
        t = type(value)
        if t is int or t is bool:
            if value and isinstance(key, str) and key.endswith("error_code"):
                out.insert(start, _error(node, key, value, path, ctx, topic_names))
                start += 1
        elif t is dict:
            key = key if isinstance(key, str) else str(key)
            _walk_errors(value, (path, key), (ctx, value, "topic" in key or key == "responses",
                                              ctx[3] or "partition" in key), topic_names, out)
        elif t is list:
            if value:
                key = key if isinstance(key, str) else str(key)
                _walk_list(value, (path, key), ctx, "topic" in key or key == "responses",
                           ctx[3] or "partition" in key, topic_names, out)
        elif t is str or value is None:
            pass
        elif isinstance(value, int):
            if value != 0 and isinstance(key, str) and key.endswith("error_code"):
                out.insert(start, _error(node, key, value, path, ctx, topic_names))
                start += 1
        elif isinstance(value, dict):
            key = key if isinstance(key, str) else str(key)
            _walk_errors(value, (path, key), (ctx, value, "topic" in key or key == "responses",
                                              ctx[3] or "partition" in key), topic_names, out)
        elif isinstance(value, list) and value:
            key = key if isinstance(key, str) else str(key)
            _walk_list(value, (path, key), ctx, "topic" in key or key == "responses",
                       ctx[3] or "partition" in key, topic_names, out)


def _walk_list(node: list, path: tuple | None, ctx: tuple, in_topics: bool, in_partitions: bool,
               topic_names: dict, out: list) -> None:
    for i, item in enumerate(node):
        t = type(item)
        if t is dict or (t is not list and isinstance(item, dict)):
            _walk_errors(item, (path, i), (ctx, item, in_topics, in_partitions), topic_names, out)
        elif t is list or isinstance(item, list):
            _walk_list(item, (path, i), ctx, in_topics, in_partitions, topic_names, out)


def iter_record_sets(api_key: int | None, body: dict | None, topic_names: dict[str, str] | None = None):
    """(topic, partition, RecordSet) for every RECORDS field of a Produce request or Fetch response."""
    if not body or api_key not in (0, 1):
        return iter(())
    # A list, not a generator: called for every Produce/Fetch message, usually for one set.
    out = []
    if api_key == 0:
        topics, parts_key = body.get("topic_data"), "partition_data"
    else:
        topics, parts_key = body.get("responses"), "partitions"
    for t in topics or ():
        if not isinstance(t, dict):
            continue
        name = t.get("name") or t.get("topic")
        if not name and isinstance(t.get("topic_id"), str):
            name = (topic_names or {}).get(t["topic_id"], t["topic_id"])
        for part in t.get(parts_key) or ():
            if not isinstance(part, dict):
                continue
            rs = part.get("records")
            if rs is not None and (type(rs) is RecordSet or hasattr(rs, "batches")):
                out.append((name, part.get("index", part.get("partition_index")), rs))
    return iter(out)
