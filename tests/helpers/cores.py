"""Run code on the pure-Python core or the compiled one, in one process.

The capture fast paths read their C functions from kwinspect.capture.fastpath when a
reader is iterated or a PacketParser/Dissector is made, so setting them to None there
gives the Python reference path (what KWINSPECT_PURE=1 gives a new process). The
decoders read kwinspect.protocol.compiled when they make a decoder for an (api key,
version, direction) and cache it, so the caches are emptied on the way in and out. The
labels (kwinspect.stream.labels) read their compiled walks at each call, the driver reads
the compiled conversation (kwinspect.stream.conversation) per batch of frames; a writer reads
kwinspect.export.fastrender when it renders its first jsonl row; the records table
reads kwinspect.analyze.record_rows._crows for every record batch; the --jobs reader
reads kwinspect.run.split._csplit when it is made; a TcpReassembler reads
kwinspect.capture.tcp._cstreams (its tcp.stream numbers) when it is made.
"""

from __future__ import annotations

import contextlib
import shutil
import sysconfig
from collections.abc import Iterator

from kwinspect import dissect
from kwinspect.analyze import record_rows
from kwinspect.capture import fastpath, tcp
from kwinspect.export import fastrender
from kwinspect.protocol import compiled, decode
from kwinspect.run import split
from kwinspect.stream import conversation, labels

_NAMES = ("scan_pcap", "scan_pcapng", "tcp_segment")
_DECODE_NAMES = ("compile_program", "decode_request", "decode_response", "decode_struct")
_LABEL_NAMES = ("compiled_errors", "compiled_topics", "compiled_record_sets", "compiled_exchange")


def compiled_available() -> bool:
    return all(getattr(fastpath, n) is not None for n in _NAMES) and \
        all(getattr(compiled, n) is not None for n in _DECODE_NAMES) and \
        all(getattr(labels, n) is not None for n in _LABEL_NAMES) and \
        fastrender.JsonlRow is not None and \
        dissect.segment_fastpath is not None and dissect.chunk_fastpath is not None and \
        conversation.compiled_frames is not None and \
        record_rows._crows is not None and split._csplit is not None and tcp._cstreams is not None


def require_compiled() -> None:
    """Skip where no C compiler could have built the extension; fail where one could
    (the compiled core must be tested wherever it can exist)."""
    import pytest

    if compiled_available():
        return
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}): the compiled core cannot be built here")
    pytest.fail("the compiled core is not built (or KWINSPECT_PURE is set): run "
                "`pip install -e .` or `python setup.py build_ext --inplace`")


@contextlib.contextmanager
def python_core() -> Iterator[None]:
    """The pure-Python fast paths inside the block (readers, parsers and dissectors made
    or iterated inside it)."""
    saved = {n: getattr(fastpath, n) for n in _NAMES}
    saved_driver = dissect.segment_fastpath, dissect.chunk_fastpath
    saved_conv = conversation.compiled_frames
    saved_decode = {n: getattr(compiled, n) for n in _DECODE_NAMES}
    saved_labels = {n: getattr(labels, n) for n in _LABEL_NAMES}
    saved_render = fastrender.JsonlRow
    saved_rows = record_rows._crows
    saved_split = split._csplit
    saved_streams = tcp._cstreams
    try:
        split._csplit = None  # read when the --jobs reader is made
        tcp._cstreams = None  # read when a TcpReassembler is made
        fastrender.JsonlRow = None  # read when a writer renders its first row
        record_rows._crows = None  # read for every record batch
        for n in _NAMES:
            setattr(fastpath, n, None)
        dissect.segment_fastpath = dissect.chunk_fastpath = None
        conversation.compiled_frames = None
        for n in _DECODE_NAMES:
            setattr(compiled, n, None)
        for n in _LABEL_NAMES:
            setattr(labels, n, None)
        decode.clear_caches()
        yield
    finally:
        for n, v in saved.items():
            setattr(fastpath, n, v)
        dissect.segment_fastpath, dissect.chunk_fastpath = saved_driver
        conversation.compiled_frames = saved_conv
        for n, v in saved_decode.items():
            setattr(compiled, n, v)
        for n, v in saved_labels.items():
            setattr(labels, n, v)
        fastrender.JsonlRow = saved_render
        record_rows._crows = saved_rows
        split._csplit = saved_split
        tcp._cstreams = saved_streams
        decode.clear_caches()


@contextlib.contextmanager
def python_labels() -> Iterator[None]:
    """Only the labels' Python walks inside the block (cheap: no decoder cache to empty)."""
    saved = {n: getattr(labels, n) for n in _LABEL_NAMES}
    try:
        for n in _LABEL_NAMES:
            setattr(labels, n, None)
        yield
    finally:
        for n, v in saved.items():
            setattr(labels, n, v)
