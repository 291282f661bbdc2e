"""API keys, names and the version ranges the schema tables cover."""

from __future__ import annotations

from kwinspect.protocol.schema.index import APIS

API_NAMES: dict[int, str] = {key: name for key, (name, _lo, _hi) in APIS.items()}
API_KEYS: dict[str, int] = {name: key for key, name in API_NAMES.items()}


def api_name(api_key: int) -> str | None:
    """'Produce' for 0; None for a key no schema describes."""
    return API_NAMES.get(api_key)


def version_range(api_key: int) -> tuple[int, int] | None:
    """(lowest, highest) version any known release defined for this key."""
    entry = APIS.get(api_key)
    return (entry[1], entry[2]) if entry else None


def is_known_version(api_key: int, api_version: int) -> bool:
    rng = version_range(api_key)
    return rng is not None and rng[0] <= api_version <= rng[1]
