"""CSV opened in a spreadsheet: text from the capture that starts like a formula is
neutralised (OWASP's CSV injection rule) unless --csv-exact.

The capture is built from frames kio and kafka-python encode: a Produce whose record
key, value and header value, and whose client id, start with = + - @.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import subprocess
import sys

import pytest
from helpers.pcapgen import conversation, write_pcap
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as p_req
from kio.schema.produce.v9 import response as p_resp
from kio.static.primitive import i16, i32, i32Timedelta, i64
from stream.kio_frames import request_frame, response_frame

FORMULA_VALUE = '=HYPERLINK("http://attacker.example/x","click")'
FORMULA_KEY = "+cmd|' /C calc'!A0"
FORMULA_HEADER = "@SUM(1+1)*cmd"
CLIENT_ID = "-evil-client"


def _sized(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> str:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1_700_000_000_000, key=FORMULA_KEY.encode(), value=FORMULA_VALUE.encode(),
             headers=[("h", FORMULA_HEADER.encode())])
    req = p_req.ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(dt.timedelta(seconds=1)),
        topic_data=(p_req.TopicProduceData(name="orders", partition_data=(
            p_req.PartitionProduceData(index=i32(0), records=bytes(b.build())),)),))
    resp = p_resp.ProduceResponse(
        responses=(p_resp.TopicProduceResponse(name="orders", partition_responses=(
            p_resp.PartitionProduceResponse(index=i32(0), error_code=ErrorCode(0), base_offset=i64(-5),
                                            log_append_time=None, log_start_offset=i64(0), record_errors=(),
                                            error_message=None),)),),
        throttle_time=i32Timedelta.parse(dt.timedelta(0)))
    msgs = [("c", _sized(request_frame(req, 7, client_id=CLIENT_ID))), ("s", _sized(response_frame(resp, 7)))]
    path = tmp_path_factory.mktemp("csv") / "formulas.pcap"
    write_pcap(path, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, ts0=1_700_000_000.0))
    return str(path)


def _csv(capture: str, table: str, *extra: str) -> list[dict[str, str]]:
    out = subprocess.run([sys.executable, "-m", "kwinspect.cli", table, capture, "-F", "csv", "-q", *extra],
                         check=True, capture_output=True, text=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def _cells(rows: list[dict[str, str]]) -> list[str]:
    return [v for r in rows for v in r.values()]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_formula_cells_are_neutralised_by_default(capture, jobs):
    records = _csv(capture, "records", "-j", jobs)
    exchanges = _csv(capture, "exchanges", "-j", jobs)
    assert len(records) == 1 and len(exchanges) == 1
    cells = _cells(records) + _cells(exchanges)
    # nothing a spreadsheet would run
    assert not [c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and not _number(c))]
    rec = records[0]
    assert rec["value"] == "'" + FORMULA_VALUE and rec["key"] == "'" + FORMULA_KEY
    assert FORMULA_HEADER in rec["headers"]  # inside a JSON list cell, which starts with [
    assert exchanges[0]["client_id"] == "'" + CLIENT_ID
    assert exchanges[0]["correlation_id"] == "7"


def test_numbers_stay_numbers():
    from kwinspect.export.writers import neutralize_formulas

    # an int column holding a negative number is not text: no quote (only str cells change)
    assert neutralize_formulas([-1, 0, "-1", "=1", "a=1", ""]) == [-1, 0, "'-1", "'=1", "a=1", ""]


def test_csv_exact_writes_the_values_as_captured(capture):
    rec = _csv(capture, "records", "--csv-exact")[0]
    assert rec["value"] == FORMULA_VALUE and rec["key"] == FORMULA_KEY
    assert _csv(capture, "exchanges", "--csv-exact")[0]["client_id"] == CLIENT_ID


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
