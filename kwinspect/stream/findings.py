"""What an exchange says at a glance: its topics, its error codes and where they sit.

Both walk the decoded bodies generically, so every api and version is covered
without a table per api: error codes live in fields whose name ends in
``error_code``; topics in elements of arrays whose field name mentions topics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kwinspect.protocol.errors import error_name, is_retriable

_TOPIC_KEYS = ("name", "topic", "topic_name")
_PARTITION_KEYS = ("partition_index", "partition", "index", "partition_id")
_GROUP_KEYS = ("group_id", "group")


def _is_topic_array(key: str) -> bool:
    return "topic" in key or key == "responses"


def topics_of(body: dict | None, topic_names: dict[str, str] | None = None) -> list[str]:
    """Topic names a body mentions, in first-seen order (topic ids mapped when known)."""
    if not body:
        return []
    seen: dict[str, None] = {}

    def walk(node: Any, in_topic_array: bool) -> None:
        if isinstance(node, dict):
            if in_topic_array:
                name = next((node[k] for k in _TOPIC_KEYS if isinstance(node.get(k), str)), None)
                if not name and isinstance(node.get("topic_id"), str):
                    tid = node["topic_id"]
                    name = (topic_names or {}).get(tid)
                    if name is None and tid != "AAAAAAAAAAAAAAAAAAAAAA":
                        name = tid
                if name:
                    seen.setdefault(name, None)
            for key, value in node.items():
                if isinstance(value, list):
                    walk(value, _is_topic_array(key))
                elif isinstance(value, dict):
                    walk(value, False)
        elif isinstance(node, list):
            for item in node:
                if isinstance(item, str) and in_topic_array:
                    seen.setdefault(item, None)
                else:
                    walk(item, in_topic_array)

    walk(body, False)
    return list(seen)


def iter_errors(body: dict | None, topic_names: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Every non-zero ``*error_code`` in a response body with topic/partition/group/path."""
    if not body:
        return

    def walk(node: Any, path: str, ctx: dict[str, Any]):
        if isinstance(node, dict):
            local = dict(ctx)
            for k in _TOPIC_KEYS:
                if isinstance(node.get(k), str) and ctx.get("_in_topics"):
                    local["topic"] = node[k]
                    break
            else:
                tid = node.get("topic_id")
                if isinstance(tid, str) and ctx.get("_in_topics") and "topic" not in local:
                    local["topic"] = (topic_names or {}).get(tid, tid)
            for k in _PARTITION_KEYS:
                if isinstance(node.get(k), int) and ctx.get("_in_partitions"):
                    local["partition"] = node[k]
                    break
            for k in _GROUP_KEYS:
                if isinstance(node.get(k), str):
                    local["group"] = node[k]
                    break
            for key, value in node.items():
                if not isinstance(key, str):  # _unknown_tags maps int tags to bytes
                    continue
                if key.endswith("error_code") and isinstance(value, int) and value != 0:
                    msg_key = key.replace("error_code", "error_message")
                    message = node.get(msg_key) if isinstance(node.get(msg_key), str) else node.get("error_message")
                    yield {
                        "code": value,
                        "name": error_name(value),
                        "retriable": is_retriable(value),
                        "topic": local.get("topic"),
                        "partition": local.get("partition"),
                        "group": local.get("group"),
                        "path": f"{path}.{key}" if path else key,
                        "message": message if isinstance(message, str) else None,
                    }
            for key, value in node.items():
                if isinstance(value, list | dict):
                    key = key if isinstance(key, str) else str(key)
                    child_ctx = dict(local)
                    child_ctx["_in_topics"] = _is_topic_array(key)
                    child_ctx["_in_partitions"] = "partition" in key or ctx.get("_in_partitions", False)
                    yield from walk(value, f"{path}.{key}" if path else key, child_ctx)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict | list):
                    yield from walk(item, f"{path}[{i}]", ctx)

    yield from walk(body, "", {})


def iter_record_sets(api_key: int | None, body: dict | None, topic_names: dict[str, str] | None = None):
    """(topic, partition, RecordSet) for every RECORDS field of a Produce request or Fetch response."""
    if not body or api_key not in (0, 1):
        return
    topics = body.get("topic_data") if api_key == 0 else body.get("responses")
    for t in topics or []:
        if not isinstance(t, dict):
            continue
        name = t.get("name") or t.get("topic")
        if not name and isinstance(t.get("topic_id"), str):
            name = (topic_names or {}).get(t["topic_id"], t["topic_id"])
        parts = t.get("partition_data") if api_key == 0 else t.get("partitions")
        for part in parts or []:
            if not isinstance(part, dict):
                continue
            rs = part.get("records")
            if rs is not None and hasattr(rs, "batches"):
                yield name, part.get("index", part.get("partition_index")), rs
