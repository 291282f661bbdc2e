"""The sans-IO Kafka protocol decoder (stdlib only; see docs/architecture.md).

    from kwinspect.protocol import decode_request, decode_response
    msg = decode_request(frame)            # frame: one request without its size prefix
    msg.header, msg.body, msg.issues
"""

from kwinspect.protocol.decode import decode_request, decode_response, decode_struct

__all__ = ["decode_request", "decode_response", "decode_struct"]
