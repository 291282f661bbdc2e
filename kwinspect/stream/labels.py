"""Exchange labels: what an exchange says at a glance (its topics, its error codes and
where they sit, its record sets), read from its decoded bodies.

Both walk the decoded bodies generically, so every api and version is covered
without a table per api: error codes live in fields whose name ends in
``error_code``; topics in elements of arrays whose field name mentions topics.

With the compiled core, ``response_errors``, ``message_topics``, ``topics_of`` and
``iter_record_sets`` (and Conversation.emit, all at once) first ask the C twin of the generic walks (``_clabels.c``, through
the facade at the end of this module); where it declines (None: a subclass, an odd
key, deep nesting) the Python walks below run, and they stay the reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from kwinspect.core import load
from kwinspect.model import Message
from kwinspect.protocol.decode import DeferredMessage
from kwinspect.protocol.errors import error_name, is_retriable
from kwinspect.protocol.records import RecordSet
from kwinspect.protocol.schema.api_keys import ApiKey

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)

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
    if compiled_topics is not None:
        found = compiled_topics(body, topic_names or {})
        if found is not None:
            return found
    seen: dict[str, None] = {}
    _walk_topics(body, False, topic_names or {}, seen)
    return list(seen)


def _note_topic(node: dict, topic_names: dict, seen: dict) -> None:
    """The topic an element of a topic array names (its id mapped when known), into `seen`."""
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


def _walk_topics(node: dict, in_topic_array: bool, topic_names: dict, seen: dict) -> None:
    # Plain recursion instead of a closure with a generator per node: ~2x faster on real bodies.
    if in_topic_array:
        _note_topic(node, topic_names, seen)
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
        if t is str or value is None:
            continue
        if t is int or t is bool or (t is not dict and t is not list and isinstance(value, int)):
            if value and isinstance(key, str) and key.endswith("error_code"):
                out.insert(start, _error(node, key, value, path, ctx, topic_names))
                start += 1
        elif t is dict or (t is not list and isinstance(value, dict)):
            key = key if isinstance(key, str) else str(key)
            _walk_errors(value, (path, key), (ctx, value, "topic" in key or key == "responses",
                                              ctx[3] or "partition" in key), topic_names, out)
        elif value and (t is list or isinstance(value, list)):
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
    if not body or api_key not in (PRODUCE, FETCH):
        return iter(())
    if compiled_record_sets is not None:
        found = compiled_record_sets(api_key, body, topic_names or {})
        if found is not None:
            return iter(found)
    # A list, not a generator: called for every Produce/Fetch message, usually for one set.
    out = []
    if api_key == PRODUCE:
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


def record_volumes(api_key: int | None, msg: Message | None,
                   topic_names: dict[str, str] | None = None) -> Sequence[tuple[str | None, int, int]]:
    """(topic, records, bytes) of each record set of a Produce request or Fetch response, as
    ``iter_record_sets`` gives them (``rs.record_count``, ``rs.size``); a scanned message's
    from what the scan noted, without decoding its body."""
    if type(msg) is DeferredMessage:
        return msg.facts[1]
    return [(topic, rs.record_count, rs.size)
            for topic, _part, rs in iter_record_sets(api_key, msg.body if msg else None, topic_names)]


# -- the error walk guided by the schema, for clean Produce/Fetch responses ----------------
#
# The generic walk type-checks every value of every dict.  A Produce or Fetch response
# decoded without issues holds, under each key the schema names, a value of the schema's
# type: ints, strings, uuids and record sets cannot hold an error code below them, so for
# a dict whose keys are all schema fields only its ``*error_code`` ints and its struct
# fields need a look.  A dict with any other key (unknown tags...) and any value of an
# unexpected type go to the generic walk, from the same path and chain, so the results
# (order included) are the generic walk's.

_SCALAR_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint16", "string", "uuid", "records",
                           "bool", "float64"})
_ERR, _STRUCT, _ARRAY, _GENERIC = 0, 1, 2, 3


def _fields_of(definitions) -> dict:
    """name -> (type, sub-fields) over every definition and version; None where they disagree."""
    merged: dict = {}
    for fields in definitions:
        for f in fields:
            name, ftype, sub = f[0], f[1], f[8]
            old = merged.get(name, ...)
            if old is ...:
                merged[name] = (ftype, [sub] if sub else [])
            elif old is None or old[0] != ftype:
                merged[name] = None
            elif sub:
                old[1].append(sub)
    return {name: (None if v is None else (v[0], _fields_of(v[1]) if v[1] else None))
            for name, v in merged.items()}


class _Struct:
    """One struct of a response schema with the plans of the key tuples met so far."""

    __slots__ = ("fields", "plans")

    def __init__(self, fields: dict) -> None:
        self.fields = fields
        self.plans: dict = {}

    def plan_for(self, keys: tuple):
        """plan(keys), remembered for the first 64 key tuples (a body shape repeats)."""
        plans = self.plans
        plan = plans.get(keys, ...)
        if plan is ...:
            plan = plans[keys] = self.plan(keys) if len(plans) < 64 else None
        return plan

    def plan(self, keys: tuple):
        """(key, action, sub-struct, in topics, in partitions) for the keys worth a look; None: walk generically."""
        plan = []
        for key in keys:
            info = self.fields.get(key) if type(key) is str else None
            if info is None:
                return None
            ftype, sub = info
            if ftype in _SCALAR_TYPES:
                if key.endswith("error_code"):
                    plan.append((key, _ERR, None, False, False))
            elif ftype in ("struct", "[]struct") and sub is not None:
                plan.append((key, _STRUCT if ftype == "struct" else _ARRAY, _Struct(sub),
                             "topic" in key or key == "responses", "partition" in key))
            else:
                plan.append((key, _GENERIC, None, "topic" in key or key == "responses", "partition" in key))
        return tuple(plan)


_GUIDED: dict[tuple[int, bool], _Struct | None] = {}


def _guide(api_key: int, request: bool = False) -> _Struct | None:
    try:
        return _GUIDED[api_key, request]
    except KeyError:
        pass
    guide = None
    try:
        if api_key == PRODUCE:
            from kwinspect.protocol.schema import api_000_produce as module
        else:
            from kwinspect.protocol.schema import api_001_fetch as module
        guide = _Struct(_fields_of([d[3] for d in (module.REQUEST if request else module.RESPONSE)]))
    except Exception:  # noqa: BLE001 - no guide: the generic walk serves
        guide = None
    _GUIDED[api_key, request] = guide
    return guide


def response_errors(api_key: int | None, body: dict | None, clean: bool,
                    topic_names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``list(iter_errors(body, topic_names))`` for a response of ``api_key``; faster when
    ``clean`` (decoded without issues, unredacted) and the api is Produce or Fetch."""
    if not body:
        return []
    names = topic_names or {}
    if compiled_errors is not None:
        found = compiled_errors(body, names)
        if found is not None:
            return found
    out: list[dict[str, Any]] = []
    guide = _guide(api_key) if clean and (api_key == PRODUCE or api_key == FETCH) and type(body) is dict else None
    if guide is None:
        _walk_errors(body, None, (None, body, False, False), names, out)
    else:
        _guided_errors(body, guide, None, (None, body, False, False), names, out)
    return out


def _guided_errors(node: dict, struct: _Struct, path, ctx: tuple, topic_names: dict, out: list) -> None:
    keys = tuple(node)
    plan = struct.plan_for(keys)
    if plan is None:
        _walk_errors(node, path, ctx, topic_names, out)
        return
    start = len(out)
    for key, action, sub, in_topics, in_partitions in plan:
        value = node[key]
        t = type(value)
        if action == _ERR:
            if t is int or t is bool:
                if value:
                    out.insert(start, _error(node, key, value, path, ctx, topic_names))
                    start += 1
            else:
                start = _one(node, key, value, path, ctx, topic_names, out, start)
        elif t is dict:
            child = (ctx, value, in_topics, ctx[3] or in_partitions)
            if action == _STRUCT:
                _guided_errors(value, sub, (path, key), child, topic_names, out)
            else:
                _walk_errors(value, (path, key), child, topic_names, out)
        elif t is list:
            if value:
                in_partitions = ctx[3] or in_partitions
                if action == _ARRAY:
                    lpath = (path, key)
                    for i, item in enumerate(value):
                        ti = type(item)
                        if ti is dict:
                            _guided_errors(item, sub, (lpath, i), (ctx, item, in_topics, in_partitions),
                                           topic_names, out)
                        elif ti is not list and isinstance(item, dict):
                            _walk_errors(item, (lpath, i), (ctx, item, in_topics, in_partitions), topic_names, out)
                        elif ti is list or isinstance(item, list):
                            _walk_list(item, (lpath, i), ctx, in_topics, in_partitions, topic_names, out)
                else:
                    _walk_list(value, (path, key), ctx, in_topics, in_partitions, topic_names, out)
        elif t is not str and value is not None:
            start = _one(node, key, value, path, ctx, topic_names, out, start)


def _one(node: dict, key: str, value: Any, path, ctx: tuple, topic_names: dict, out: list, start: int) -> int:
    """What _walk_errors does with one item of ``node`` (values of unexpected types); returns ``start``."""
    if isinstance(value, int):
        if value != 0 and key.endswith("error_code"):
            out.insert(start, _error(node, key, value, path, ctx, topic_names))
            start += 1
    elif isinstance(value, dict):
        _walk_errors(value, (path, key), (ctx, value, "topic" in key or key == "responses",
                                          ctx[3] or "partition" in key), topic_names, out)
    elif isinstance(value, list) and value:
        _walk_list(value, (path, key), ctx, "topic" in key or key == "responses",
                   ctx[3] or "partition" in key, topic_names, out)
    return start


def message_topics(api_key: int | None, body: dict | None, request: bool, clean: bool,
                   topic_names: dict[str, str] | None = None) -> list[str]:
    """``topics_of(body, topic_names)`` for a message of ``api_key``; faster when ``clean``
    (decoded without issues) and the api is Produce or Fetch (same guide as the errors)."""
    if not body:
        return []
    if compiled_topics is not None:
        found = compiled_topics(body, topic_names or {})
        if found is not None:
            return found
    guide = _guide(api_key, request) if clean and (api_key == PRODUCE or api_key == FETCH) and type(body) is dict else None
    if guide is None:
        return topics_of(body, topic_names)
    seen: dict[str, None] = {}
    _guided_topics(body, guide, False, topic_names or {}, seen)
    return list(seen)


def _guided_topics(node: dict, struct: _Struct, in_topic_array: bool, topic_names: dict, seen: dict) -> None:
    keys = tuple(node)
    plan = struct.plan_for(keys)
    if plan is None:
        _walk_topics(node, in_topic_array, topic_names, seen)
        return
    if in_topic_array:  # as _walk_topics
        _note_topic(node, topic_names, seen)
    for key, action, sub, in_topics, _in_partitions in plan:
        value = node[key]
        if isinstance(value, list):
            if action == _ARRAY and type(value) is list:
                for item in value:
                    if type(item) is dict:
                        _guided_topics(item, sub, in_topics, topic_names, seen)
                    else:
                        _walk_topics_list((item,), in_topics, topic_names, seen)
            else:
                _walk_topics_list(value, in_topics, topic_names, seen)
        elif isinstance(value, dict):
            if action == _STRUCT and type(value) is dict:
                _guided_topics(value, sub, False, topic_names, seen)
            else:
                _walk_topics(value, False, topic_names, seen)


# -- the compiled twin (stream/_clabels.c) ------------------------------------------------
#
# The facade: the C functions, or None without the extension (or with KWINSPECT_PURE=1;
# tests set them to None for the Python core).  The C walks are the generic ones above
# (which the guided ones equal); an error's dict is made by _error, here, from the same
# path and context chains the Python walk builds.

_c = load("kwinspect.stream._clabels")
if _c is not None:
    _c.configure(_error, RecordSet)
compiled_errors = _c.errors if _c is not None else None
compiled_topics = _c.topics if _c is not None else None
compiled_record_sets = _c.record_sets if _c is not None else None
# (api_key, request body, response body, names) -> (response_errors, the request's topics or
# else the response's, the request's and the response's record sets with issues) | None:
# what Conversation.emit asks, in one call
compiled_exchange = _c.exchange if _c is not None else None
