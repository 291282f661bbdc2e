"""Where Schema Registry schemas come from: a folder, a registry export, or a registry.

Every source answers ``schema(id)`` and ``reference(name, subject, version)`` with a
``RawSchema`` (the schema text as the registry stores it, its type and its
references) or raises ``SchemaUnavailable`` with a one-line reason; decoding them is
analyze/schema_values.py's job.

- ``FolderSchemas(dir)``: files named by schema id (``42.avsc``, ``43.proto``,
  ``44.json``); any other file in the folder is a reference, found by its name (a
  Protobuf import such as ``customer.proto``, or ``SUBJECT.avsc``/``SUBJECT.json``
  for a reference to a subject).
- ``ExportSchemas(file)``: the JSON array ``GET /schemas`` returns (``subject``,
  ``version``, ``id``, ``schemaType``, ``schema``, ``references``).
- ``RegistrySchemas(url, cache_dir)``: the registry's REST API,
  ``GET /schemas/ids/{id}`` and, for references,
  ``GET /subjects/{subject}/versions/{version}``; basic auth from the environment
  variable ``KWINSPECT_SCHEMA_REGISTRY_AUTH`` (``user:password``); every answer is
  kept in ``cache_dir`` so a second run needs no network.  Credentials never reach
  the cache, an output or a message.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AUTH_ENV", "ExportSchemas", "FolderSchemas", "RawSchema", "Reference", "RegistrySchemas",
    "SchemaSourceError", "SchemaUnavailable", "open_schema_source",
]

AUTH_ENV = "KWINSPECT_SCHEMA_REGISTRY_AUTH"
MAX_SCHEMA_BYTES = 4 << 20  # a schema file or registry answer larger than this is refused
REQUEST_TIMEOUT = 10.0  # seconds per registry request
EXTENSIONS = {".avsc": "AVRO", ".proto": "PROTOBUF", ".json": "JSON"}


class SchemaUnavailable(LookupError):
    """A schema id or reference that cannot be had; ``str()`` says why, in one line."""


class SchemaSourceError(ValueError):
    """A schema source that cannot be used at all (bad folder, unreadable export)."""


@dataclass(frozen=True, slots=True)
class Reference:
    name: str  # the import name (Protobuf) or the referenced type's full name (Avro)
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class RawSchema:
    schema_type: str  # "AVRO" | "PROTOBUF" | "JSON"
    text: str
    references: tuple[Reference, ...] = ()
    name: str = ""  # the file or subject it came from, for messages
    schema_id: int | None = None


def _references(items: Any) -> tuple[Reference, ...]:
    out = []
    for r in items or ():
        if isinstance(r, dict) and isinstance(r.get("name"), str):
            try:
                version = int(r.get("version", -1))
            except (TypeError, ValueError):
                version = -1
            out.append(Reference(r["name"], str(r.get("subject", r["name"])), version))
    return tuple(out)


def _from_registry_json(obj: Any, name: str, schema_id: int | None = None) -> RawSchema:
    if not isinstance(obj, dict) or not isinstance(obj.get("schema"), str):
        raise SchemaUnavailable(f"{name}: not a registry schema object (no 'schema' text)")
    return RawSchema(str(obj.get("schemaType") or "AVRO").upper(), obj["schema"],
                     _references(obj.get("references")), name, schema_id)


def _read_text(path: str) -> str:
    size = os.path.getsize(path)
    if size > MAX_SCHEMA_BYTES:
        raise SchemaUnavailable(f"{os.path.basename(path)}: {size} bytes, over the "
                                f"{MAX_SCHEMA_BYTES} byte limit for a schema")
    with open(path, encoding="utf-8") as fh:
        return fh.read()


class FolderSchemas:
    """Schemas in a folder, files named by id: ``42.avsc``, ``43.proto``, ``44.json``."""

    def __init__(self, path: str) -> None:
        if not os.path.isdir(path):
            raise SchemaSourceError(f"{path}: not a folder")
        self.path = path
        self.by_id: dict[int, str] = {}
        self.others: dict[str, str] = {}
        for entry in sorted(os.listdir(path)):
            full = os.path.join(path, entry)
            if not os.path.isfile(full):
                continue
            stem, ext = os.path.splitext(entry)
            if ext in EXTENSIONS and stem.isdigit():
                self.by_id[int(stem)] = full
            else:
                self.others[entry] = full
        self._walk_subdirs()

    def _walk_subdirs(self) -> None:
        # Protobuf imports may name paths ("shop/customer.proto"): keep them by relative path
        for root, _dirs, files in os.walk(self.path):
            if root == self.path:
                continue
            for f in files:
                full = os.path.join(root, f)
                self.others.setdefault(os.path.relpath(full, self.path).replace(os.sep, "/"), full)

    def ids(self) -> list[int]:
        return sorted(self.by_id)

    def schema(self, schema_id: int) -> RawSchema:
        path = self.by_id.get(schema_id)
        if path is None:
            raise SchemaUnavailable(f"no file for schema id {schema_id} in {self.path}")
        try:
            text = _read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise SchemaUnavailable(f"{os.path.basename(path)}: cannot be read ({exc})") from None
        stype = EXTENSIONS[os.path.splitext(path)[1]]
        return RawSchema(stype, text, (), os.path.basename(path), schema_id)

    def reference(self, ref: Reference) -> RawSchema:
        for key in (ref.name, ref.subject, f"{ref.subject}.avsc", f"{ref.subject}.json",
                    f"{ref.subject}.proto", f"{ref.name}.avsc", f"{ref.name}.json"):
            path = self.others.get(key)
            if path is not None:
                ext = os.path.splitext(path)[1]
                try:
                    text = _read_text(path)
                except (OSError, UnicodeDecodeError) as exc:
                    raise SchemaUnavailable(f"{key}: cannot be read ({exc})") from None
                return RawSchema(EXTENSIONS.get(ext, "PROTOBUF"), text, (), key)
        raise SchemaUnavailable(f"reference {ref.name!r} not found in {self.path}")

    def find_import(self, name: str) -> Iterator[str]:
        """Texts that may be the Protobuf file ``name``: the file of that name, then every
        id-named .proto (the caller keeps the descriptor whose name matches)."""
        named = self.others.get(name)
        paths = [named] if named is not None else [p for _i, p in sorted(self.by_id.items())
                                                   if p.endswith(".proto")]
        for path in paths:
            try:
                text = _read_text(path)
            except (OSError, UnicodeDecodeError, SchemaUnavailable):
                continue
            if path is named or "{" not in text:  # only base64 descriptors carry their name
                yield text

    def avsc_paths(self) -> list[str]:
        """Every .avsc of the folder: where named types a schema uses may be defined."""
        return sorted(p for p in [*self.by_id.values(), *self.others.values()] if p.endswith(".avsc"))

    def references_for_import(self) -> dict[str, str]:
        """Every non-id file by name: what a .proto's imports may name."""
        return dict(self.others)


class ExportSchemas:
    """A Schema Registry export: the JSON array of ``GET /schemas``."""

    def __init__(self, path: str) -> None:
        try:
            text = _read_text(path)
            items = json.loads(text)
        except (OSError, UnicodeDecodeError, SchemaUnavailable) as exc:
            raise SchemaSourceError(f"{path}: cannot be read ({exc})") from None
        except ValueError as exc:
            raise SchemaSourceError(f"{path}: not JSON ({exc})") from None
        if isinstance(items, dict) and isinstance(items.get("schemas"), list):
            items = items["schemas"]
        if not isinstance(items, list):
            raise SchemaSourceError(f"{path}: expected the JSON array GET /schemas returns")
        self.path = path
        self.by_id: dict[int, RawSchema] = {}
        self.by_subject: dict[tuple[str, int], RawSchema] = {}
        self.latest: dict[str, RawSchema] = {}
        for obj in items:
            if not isinstance(obj, dict) or not isinstance(obj.get("id"), int):
                continue
            subject = str(obj.get("subject", ""))
            try:
                raw = _from_registry_json(obj, subject or f"id {obj['id']}", obj["id"])
            except SchemaUnavailable:
                continue
            self.by_id.setdefault(obj["id"], raw)
            version = obj.get("version")
            if isinstance(version, int):
                self.by_subject[(subject, version)] = raw
        for (subject, _version), raw in sorted(self.by_subject.items()):
            self.latest[subject] = raw  # the highest version last

    def ids(self) -> list[int]:
        return sorted(self.by_id)

    def schema(self, schema_id: int) -> RawSchema:
        raw = self.by_id.get(schema_id)
        if raw is None:
            raise SchemaUnavailable(f"schema id {schema_id} is not in {os.path.basename(self.path)}")
        return raw

    def reference(self, ref: Reference) -> RawSchema:
        raw = self.by_subject.get((ref.subject, ref.version))
        if raw is None and ref.version == -1:
            raw = self.latest.get(ref.subject)
        if raw is None:
            raise SchemaUnavailable(f"reference {ref.subject} version {ref.version} is not in "
                                    f"{os.path.basename(self.path)}")
        return raw


def default_cache_dir(url: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    host = urllib.parse.urlsplit(url).netloc.rsplit("@", 1)[-1] or "registry"
    return os.path.join(base, "kwinspect", "schema-registry", re.sub(r"[^A-Za-z0-9._-]", "_", host))


@dataclass
class RegistrySchemas:
    """A Schema Registry over its REST API, with an on-disk cache of every answer."""

    url: str
    cache_dir: str
    auth: str | None = field(default=None, repr=False)  # "user:password", never shown
    failures: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SchemaSourceError(f"--schema-registry {self.url!r}: expected an http:// or "
                                    "https:// URL")
        if "@" in parts.netloc:  # user:password@host: take it as auth, keep it out of messages
            cred, host = parts.netloc.rsplit("@", 1)
            self.auth = self.auth or urllib.parse.unquote(cred)
            self.url = urllib.parse.urlunsplit(parts._replace(netloc=host))
        self.url = self.url.rstrip("/")
        if self.auth is None:
            self.auth = os.environ.get(AUTH_ENV) or None

    def ids(self) -> list[int]:
        """The ids already in the cache (what the filter can know before a run)."""
        out = []
        with _suppress_os():
            for entry in os.listdir(self.cache_dir):
                m = re.fullmatch(r"id-(\d+)\.json", entry)
                if m:
                    out.append(int(m.group(1)))
        return sorted(out)

    def schema(self, schema_id: int) -> RawSchema:
        obj = self._get(f"id-{schema_id}.json", f"/schemas/ids/{schema_id}")
        return _from_registry_json(obj, f"schema id {schema_id}", schema_id)

    def reference(self, ref: Reference) -> RawSchema:
        version = "latest" if ref.version == -1 else str(ref.version)
        subject = urllib.parse.quote(ref.subject, safe="")
        cache_name = "subject-" + re.sub(r"[^A-Za-z0-9._-]", "_", ref.subject) + f"-{version}.json"
        obj = self._get(cache_name, f"/subjects/{subject}/versions/{version}")
        return _from_registry_json(obj, f"{ref.subject} version {version}")

    def _get(self, cache_name: str, path: str) -> Any:
        cached = os.path.join(self.cache_dir, cache_name)
        if os.path.isfile(cached):
            try:
                return json.loads(_read_text(cached))
            except (OSError, ValueError, SchemaUnavailable):
                pass  # a damaged cache entry is fetched again
        if path in self.failures:  # one request per missing id, not one per record
            raise SchemaUnavailable(self.failures[path])
        try:
            body = self._request(path)
            obj = json.loads(body)
        except SchemaUnavailable as exc:
            self.failures[path] = str(exc)
            raise
        except ValueError:
            self.failures[path] = f"registry answered {path} with something that is not JSON"
            raise SchemaUnavailable(self.failures[path]) from None
        with _suppress_os():
            os.makedirs(self.cache_dir, exist_ok=True)
            tmp = f"{cached}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(obj, fh)
            os.replace(tmp, cached)
        return obj

    def _request(self, path: str) -> bytes:
        # here, not at the top: urllib.request (and http.client, email) cost every start ~5 ms
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + path, headers={
            "Accept": "application/vnd.schemaregistry.v1+json, application/json"})
        if self.auth:
            token = base64.b64encode(self.auth.encode("utf-8")).decode("ascii")
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:  # noqa: S310 (http(s) only, checked)
                body = resp.read(MAX_SCHEMA_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = ""
            with _suppress_os():
                err = json.loads(exc.read(4096) or b"{}")
                if isinstance(err, dict) and isinstance(err.get("message"), str):
                    detail = f": {err['message'][:200]}"
            raise SchemaUnavailable(f"registry answered {path} with HTTP {exc.code}{detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SchemaUnavailable(f"registry {self.url} unreachable for {path}: {reason}") from None
        if len(body) > MAX_SCHEMA_BYTES:
            raise SchemaUnavailable(f"registry answer for {path} is over {MAX_SCHEMA_BYTES} bytes")
        return body


class _suppress_os:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> bool:
        return typ is not None and issubclass(typ, OSError | ValueError)


def open_schema_source(schemas: str | None = None, registry: str | None = None,
                       cache_dir: str | None = None) -> Any:
    """The source the command line names: ``--schemas DIR|FILE`` or ``--schema-registry URL``."""
    if schemas and registry:
        raise SchemaSourceError("use --schemas or --schema-registry, not both")
    if schemas:
        if os.path.isdir(schemas):
            return FolderSchemas(schemas)
        if os.path.isfile(schemas):
            return ExportSchemas(schemas)
        raise SchemaSourceError(f"--schemas {schemas}: no such folder or file")
    if registry:
        src = RegistrySchemas(registry, cache_dir or "")
        if not cache_dir:
            src.cache_dir = default_cache_dir(src.url)
        return src
    return None

