"""kwinspect: a Kafka wire-protocol analyzer and pcap dissector.

    from kwinspect.protocol import decode_request, decode_response
    from kwinspect.run.files import dissect_files
"""

__version__ = "0.1.0"
