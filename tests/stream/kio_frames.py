"""Kafka frames encoded by kio, an encoder we did not write (test helper)."""

from __future__ import annotations

import io

from kio.serial import entity_writer
from kio.static.primitive import i16, i32


def request_frame(entity, correlation_id: int, client_id: str | None = "kwinspect-test") -> bytes:
    """Header + body of one request, without the size prefix."""
    header_cls = entity.__header_schema__
    fields = {"request_api_key": i16(entity.__api_key__), "request_api_version": i16(entity.__version__),
              "correlation_id": i32(correlation_id)}
    if "client_id" in header_cls.__dataclass_fields__:
        fields["client_id"] = client_id
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(**fields))
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def response_frame(entity, correlation_id: int) -> bytes:
    header_cls = entity.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(correlation_id=i32(correlation_id)))
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()
