"""--jobs N: the same rows as one process, on every shipped capture.

No timing here (bench/run.py measures the speed-up); these tests pin the output.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest

from kwinspect import cli
from kwinspect.analyze.record_rows import records_from_exchange
from kwinspect.dissect import DissectConfig
from kwinspect.model import Exchange
from kwinspect.run import parallel
from kwinspect.run.files import FileRun, dissect_files
from kwinspect.run.parallel import MergedDissector, dissect_files_parallel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTURES = sorted(glob.glob(os.path.join(ROOT, "captures", "*.pcap")))
PUBLIC = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "captures-public", "**", "*.pcap*"), recursive=True))


def _rows(events, run: FileRun) -> list:
    """Every event's row, plus what the rows do not show (index, broker_id) and the
    records labelled with the topic names known at that point, as the CLI does."""
    out = []
    for ev in events:
        out.append(ev.row())
        if isinstance(ev, Exchange):
            out.append((ev.index, ev.broker_id))
            names = run.dissector.shared.topic_names
            out.extend(r.row() for r in records_from_exchange(ev, values="auto", topic_names=names))
    return out


def _sequential(path: str, config: DissectConfig | None = None):
    run = FileRun()
    rows = _rows(dissect_files([path], config, run=run), run)
    return rows, run


def test_shipped_captures_exist():
    assert len(CAPTURES) >= 10


@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_cli_exchanges_jobs_2_equals_jobs_1(path, tmp_path):
    one, two = tmp_path / "j1.jsonl", tmp_path / "j2.jsonl"
    keys = os.path.splitext(path)[0] + ".keys"  # TLS captures ship their key log
    tls = ["--tls-keylog", keys] if os.path.isfile(keys) else []
    assert cli.main(["exchanges", "-q", "-F", "jsonl", "-o", str(one), *tls, path]) == 0
    assert cli.main(["exchanges", "-q", "--jobs", "2", "-F", "jsonl", "-o", str(two), *tls, path]) == 0
    assert one.read_bytes() == two.read_bytes()
    assert one.read_bytes().count(b"\n") > 0


@pytest.mark.parametrize("table", ["records", "errors"])
def test_cli_other_tables_jobs_2(table, tmp_path):
    for path in CAPTURES:
        one, two = tmp_path / "j1.jsonl", tmp_path / "j2.jsonl"
        assert cli.main([table, "-q", "-F", "jsonl", "-o", str(one), path]) == 0
        assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
        assert one.read_bytes() == two.read_bytes(), path


def test_cli_summary_json_jobs_2(capsys):
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    assert cli.main(["summary", "-q", "-F", "json", path]) == 0
    one = capsys.readouterr().out
    assert cli.main(["summary", "-q", "-F", "json", "-j", "2", path]) == 0
    assert capsys.readouterr().out == one


def test_parallel_events_state_and_counts_equal_on_every_capture():
    """Rows, exchange index and broker id, records named with the topic ids known at that
    point, packet accounting and connections: as one process, with 2 and 3 workers and
    both ways of sharing connections out. The cross-connection state is really exercised
    (some exchanges are relabelled with what other workers learned) and the shadow
    dissectors keep the known-broker decisions exact (no fallback to one process)."""
    rebuilt = 0
    for path in CAPTURES + PUBLIC:
        want, run1 = _sequential(path)
        for jobs in (2, 3):
            for mode in ("balance", "hash"):
                run2 = FileRun()
                got = _rows(dissect_files_parallel([path], None, run=run2, jobs=jobs, mode=mode), run2)
                assert got == want, (path, jobs, mode)
                assert isinstance(run2.dissector, MergedDissector), (path, jobs, mode, "fell back")
                rebuilt += run2.dissector.rebuilt
                assert run2.dissector.packet_counts() == run1.dissector.packet_counts(), path
                assert run2.dissector.packet_accounting_error() is None
                assert ([(i.stream, i.kind, i.closed, i.packets) for i in run2.dissector.connections.values()]
                        == [(i.stream, i.kind, i.closed, i.packets) for i in run1.dissector.connections.values()])
                assert dict(run2.dissector.shared.topic_names) == dict(run1.dissector.shared.topic_names)
                assert run2.dissector.shared.brokers == run1.dissector.shared.brokers
    assert rebuilt > 0


def test_parallel_with_declared_ports_and_several_files():
    paths = [os.path.join(ROOT, "captures", n) for n in ("tansu-produce-consume.pcap", "tansu-admin.pcap")]
    config = DissectConfig(kafka_ports=frozenset({9092, 53165}))
    run1 = FileRun()
    want = _rows(dissect_files(paths, config, run=run1), run1)
    run2 = FileRun()
    assert _rows(dissect_files_parallel(paths, config, run=run2, jobs=2), run2) == want


def test_fallback_to_one_process_gives_the_same_events(monkeypatch):
    """When a cross-connection check fails, the capture is read again by one process and
    the events already handed on are skipped: the stream is still exactly --jobs 1's."""
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    want, _run = _sequential(path)
    real = MergedDissector.settle
    calls = {"n": 0}

    def settle(self, batch):
        calls["n"] += 1
        if calls["n"] == 40:
            raise parallel._Fallback("forced by the test")
        return real(self, batch)

    monkeypatch.setattr(MergedDissector, "settle", settle)
    run = FileRun()
    got = _rows(dissect_files_parallel([path], None, run=run, jobs=2), run)
    assert calls["n"] >= 40
    assert not isinstance(run.dissector, MergedDissector)
    assert got == want


def test_bodies_false_keeps_rows_and_metadata_bodies():
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    want = [ev.row() for ev in dissect_files([path])]
    events = list(dissect_files_parallel([path], None, jobs=2, bodies=False))
    assert [ev.row() for ev in events] == want
    for ev in events:
        if isinstance(ev, Exchange) and ev.api_key not in parallel.LEARN_APIS:
            assert ev.request is None and ev.response is None


def test_unreadable_input_fails_before_workers_start(tmp_path):
    bad = tmp_path / "not.pcap"
    bad.write_bytes(b"not a capture at all")
    assert cli.main(["exchanges", "-q", "-j", "2", str(bad)]) == 1


def test_jobs_flag_values(capsys):
    p = cli.build_parser()
    assert p.parse_args(["exchanges", "-j", "3", "x.pcap"]).jobs == 3
    assert p.parse_args(["exchanges", "x.pcap"]).jobs == 1
    assert p.parse_args(["summary", "--jobs", "0", "x.pcap"]).jobs == (os.cpu_count() or 1)
    with pytest.raises(SystemExit):
        p.parse_args(["exchanges", "-j", "-1", "x.pcap"])
    capsys.readouterr()


def test_tui_takes_no_jobs_flag(capsys):
    """The tui decodes in one process; -j there is a usage error, not silently ignored."""
    p = cli.build_parser()
    assert not hasattr(p.parse_args(["tui", "x.pcap"]), "jobs")
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["tui", "-j", "2", "x.pcap"])
    assert exc.value.code == 2
    assert "-j" in capsys.readouterr().err


@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_cli_summary_json_jobs_2_every_capture(path, capsys):
    """summary -j 2 ships record-set counts and sizes only; the summary is the same."""
    assert cli.main(["summary", "-q", "-F", "json", path]) == 0
    one = capsys.readouterr().out
    assert cli.main(["summary", "-q", "-F", "json", "-j", "2", path]) == 0
    assert capsys.readouterr().out == one


def _with_bad_packets(src: str, dest) -> None:
    """src with malformed packets put in: a cut IPv4 header and a bad TCP data offset
    after the 5th record, an unknown link type can not be mixed into a pcap, so a
    truncated Ethernet frame goes at the end."""
    import struct

    data = open(src, "rb").read()
    head, body = data[:24], data[24:]
    pos, n, out = 0, 0, bytearray(head)
    bad_ip = bytes(12) + b"\x08\x00" + b"\x45\x00\x00"  # IPv4 header cut after 3 bytes
    bad_tcp = (bytes(12) + b"\x08\x00" + bytes([0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2])
               + bytes(12) + b"\x10" + bytes(7))  # TCP data offset 4 bytes
    while pos < len(body):
        sec, frac, incl, orig = struct.unpack_from("<IIII", body, pos)
        out += body[pos:pos + 16 + incl]
        pos += 16 + incl
        n += 1
        if n == 5:
            for frame in (bad_ip, bad_tcp):
                out += struct.pack("<IIII", sec, frac, len(frame), len(frame)) + frame
    out += struct.pack("<IIII", sec, frac, 10, 60) + bytes(10)
    dest.write_bytes(bytes(out))


def test_parser_issues_reported_once_in_their_place(tmp_path):
    """Malformed packets are error rows of worker 0 only, at their packet, as with one process."""
    path = tmp_path / "bad.pcap"
    _with_bad_packets(os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap"), path)
    want, run1 = _sequential(str(path))
    assert run1.dissector.packet_counts()["unparseable"] >= 2
    for jobs in (2, 3):
        run2 = FileRun()
        got = _rows(dissect_files_parallel([str(path)], None, run=run2, jobs=jobs), run2)
        assert got == want
        assert run2.dissector.packet_counts() == run1.dissector.packet_counts()


# --- rows rendered in the workers (cli._worker_renderer): the main process only merges ---

@pytest.mark.parametrize("table", ["exchanges", "records", "errors"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_cli_rendered_rows_jobs_2_and_3_equal_jobs_1(table, fmt, tmp_path):
    """Every shipped and public capture, both text formats, without a filter on 2 workers
    and with one (applied in the workers) on 3: byte for byte the output of one process.
    (Each variant on one worker count: both counts with both variants tripled the runs
    without reaching code the pairs here do not.)"""
    filters = {"exchanges": 'api == "Produce" or error', "records": "partition == 0",
               "errors": 'kind != "tcp_gap"'}
    for path in CAPTURES + PUBLIC:
        for jobs, extra in (("2", []), ("3", ["-f", filters[table]])):
            one = tmp_path / f"j1.{fmt}"
            assert cli.main([table, "-q", "-F", fmt, "-o", str(one), *extra, path]) == 0
            many = tmp_path / f"j{jobs}.{fmt}"
            assert cli.main([table, "-q", "-j", jobs, "-F", fmt, "-o", str(many), *extra, path]) == 0
            assert one.read_bytes() == many.read_bytes(), (path, jobs, extra)


def test_rendered_rows_are_used_and_objects_only_where_needed(monkeypatch):
    """With a renderer, rows arrive as text; only Metadata-like exchanges and ones that
    looked up topic ids (the main process settles them) arrive as objects. A worker that
    leaves rendering to the main process (RENDER_SHARE) still leaves out unwanted events."""
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    args = cli.build_parser().parse_args(["exchanges", "-j", "2", path])
    render = cli._worker_renderer(args, "exchanges", "jsonl", None)
    want = [ev.row() for ev in dissect_files([path]) if isinstance(ev, Exchange)]
    for share in (1e9, 0.0):
        monkeypatch.setattr(parallel, "RENDER_SHARE", share)
        got = list(dissect_files_parallel([path], None, jobs=2, bodies=False, render=render))
        texts = [ev for ev in got if type(ev) is str]
        objects = [ev for ev in got if type(ev) is not str]
        assert all(isinstance(ev, Exchange) for ev in objects)
        assert len(got) == len(want)
        if share:
            assert len(texts) > len(objects) > 0
            assert all(t.endswith("\n") and t.count("\n") == 1 for t in texts)
        else:
            assert not texts
            assert [ev.row() for ev in objects] == want


def test_fallback_with_rendered_and_dropped_rows_gives_the_same_output(monkeypatch, tmp_path):
    """A fallback to one process skips exactly the events already handed on, counting
    the ones the workers rendered or dropped."""
    real = MergedDissector.settle
    for table in ("exchanges", "errors", "records"):
        for path in sorted(CAPTURES, key=os.path.getsize)[-3:]:
            one, two = tmp_path / "j1.jsonl", tmp_path / "j2.jsonl"
            assert cli.main([table, "-q", "-F", "jsonl", "-o", str(one), path]) == 0
            calls = {"n": 0}

            def settle(self, batch, calls=calls):
                calls["n"] += 1
                if calls["n"] == 12:
                    raise parallel._Fallback("forced by the test")
                return real(self, batch)

            monkeypatch.setattr(MergedDissector, "settle", settle)
            assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
            monkeypatch.setattr(MergedDissector, "settle", real)
            assert calls["n"] >= 12, path
            assert one.read_bytes() == two.read_bytes(), (table, path)


def test_exchanges_and_messages_survive_pickling_and_copying():
    """Exchange/Message pickle as (class, field values) for speed: every field comes back,
    also on real exchanges with decoded bodies and issues; copy.copy stays shallow."""
    import copy
    import pickle
    from dataclasses import fields

    from kwinspect.model import Issue, Message

    msg = Message(True, 0, 9, {"correlation_id": 7}, {"acks": -1}, [Issue("decode_error", "m", 3, "p")],
                  b"raw", 42, 8)
    ex = Exchange("s", "c", "b", 0, "Produce", 9, 7, None, 1.5, None, None, 10, None, "response_missing",
                  [1], ["X"], ["t"], 3, 2.5, msg, None, 4, 99)
    for obj in (msg, ex):
        back = pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        assert type(back) is type(obj) and back == obj
        assert [f.name for f in fields(obj)] == [f.name for f in fields(back)]
        shallow = copy.copy(obj)
        assert shallow == obj and shallow is not obj
    assert copy.copy(msg).body is msg.body
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    events = [ev for ev in dissect_files([path]) if isinstance(ev, Exchange)]
    back = pickle.loads(pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL))

    def view(e):  # RecordSet has no __eq__: compare what is around it
        msgs = [(m.header, sorted(m.body or {}), m.issues, m.size, m.decoded_version) if m else None
                for m in (e.request, e.response)]
        return e.row(), e.index, e.broker_id, e.response_last_ts, msgs

    assert [view(e) for e in back] == [view(e) for e in events]


def test_light_bodies_rows_equal_on_every_capture_also_when_rebuilt():
    """bodies=False / "summary": groups the main process may rebuild travel without record
    bytes (record sets as their issues, counts and sizes); the rows are still one
    process's, also for the exchanges that really are rebuilt."""
    rebuilt = 0
    for path in CAPTURES + PUBLIC:
        want = [ev.row() for ev in dissect_files([path])]
        for bodies in (False, "summary"):
            for jobs in (2, 3):
                run = FileRun()
                got = [ev.row() for ev in dissect_files_parallel([path], None, run=run, jobs=jobs, bodies=bodies)]
                assert got == want, (path, bodies, jobs)
                rebuilt += run.dissector.rebuilt
    assert rebuilt > 0


@pytest.mark.parametrize("share", [0.0, 1e9])
def test_rendering_left_to_the_main_process_or_not_gives_the_same_output(share, monkeypatch, tmp_path):
    """RENDER_SHARE 0: workers with any bytes leave rendering to the main process; 1e9:
    they always render. Both ways the output is one process's."""
    monkeypatch.setattr(parallel, "RENDER_SHARE", share)
    for path in CAPTURES:
        for table, fmt in (("exchanges", "jsonl"), ("errors", "csv"), ("exchanges", "csv")):
            one, two = tmp_path / "j1.out", tmp_path / "j2.out"
            assert cli.main([table, "-q", "-F", fmt, "-o", str(one), path]) == 0
            assert cli.main([table, "-q", "-j", "2", "-F", fmt, "-o", str(two), path]) == 0
            assert one.read_bytes() == two.read_bytes(), (path, table, fmt)


@pytest.mark.parametrize("by", ["api", "broker", "client", "topic"])
def test_cli_latency_jobs_2_equals_jobs_1(by, tmp_path):
    # latency ships exchanges without bodies (it reads only their columns)
    for path in CAPTURES:
        one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
        assert cli.main(["latency", "-q", "--by", by, "-F", "jsonl", "-o", str(one), path]) == 0
        assert cli.main(["latency", "-q", "--by", by, "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
        assert one.read_bytes() == two.read_bytes(), path


def test_a_connection_flood_goes_on_in_one_process_with_the_same_rows(tmp_path, monkeypatch):
    """Each worker holds its own connections and a shadow of the others', so a flood of
    connections would cost every worker what one process holds; past
    MAX_OPEN_CONNECTIONS open at once the run is handed to one process, and the rows
    are still exactly one process's (here: 5,000 SYNs, then a real Kafka capture)."""
    from kwinspect.capture.packets import SYN, TcpSegment
    from kwinspect.dissect import Dissector
    from kwinspect.model import Endpoint
    from tests.helpers.pcapgen import write_pcap

    server = Endpoint("10.99.0.2", 9092)
    flood = tmp_path / "flood.pcap"
    write_pcap(flood, [TcpSegment(1.0 + i * 1e-6, Endpoint(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
                                                           1000 + i), server, i, 0, SYN, b"", i + 1, 0)
                       for i in range(5000)])
    kafka = os.path.join(ROOT, "captures", "confluent-mock-errors.pcap")
    monkeypatch.setattr(parallel, "MAX_OPEN_CONNECTIONS", 1000)  # the workers are forked: they see it
    paths = [str(flood), kafka]
    one = FileRun()
    want = _rows(dissect_files(paths, run=one), one)
    run = FileRun()
    got = _rows(dissect_files_parallel(paths, run=run, jobs=2), run)
    assert got == want
    assert sum(1 for r in want if "api_name" in r and r.get("status") == "paired") > 10
    assert type(run.dissector) is Dissector  # read by one process, not merged from workers
    # below the threshold the same files stay parallel
    monkeypatch.setattr(parallel, "MAX_OPEN_CONNECTIONS", 100_000)
    run = FileRun()
    assert _rows(dissect_files_parallel(paths, run=run, jobs=2), run) == want
    assert type(run.dissector) is MergedDissector


# --- one reader (run/split.py) and partial summaries (analyze/summary.SummaryFold) ---

def _summary(args: list[str], capsys) -> str:
    assert cli.main(["summary", "-q", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_summary_merged_from_partials_equals_one_process_on_every_capture(core, capsys):
    """summary -j 2 / -j 3 (workers count what does not depend on capture order, the main
    process merges): the JSON and the text of one process, on every shipped and public
    capture, with the compiled core and with the pure-Python one (KWINSPECT_PURE=1)."""
    from tests.helpers.cores import python_core, require_compiled

    if core == "compiled":
        require_compiled()
    with python_core() if core == "python" else _nothing():
        for path in CAPTURES + PUBLIC:
            want = _summary(["-F", "json", path], capsys)
            for jobs in ("2", "3"):
                assert _summary(["-F", "json", "-j", jobs, path], capsys) == want, (path, jobs)
        path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
        assert _summary(["-j", "2", path], capsys) == _summary([path], capsys)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture(scope="module")
def big_capture(tmp_path_factory):
    """20 copies of a real produce/consume capture on their own client addresses: enough
    connections and exchanges of each kind that most are counted in the workers."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("big") / "big.pcap"
    src = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_big_capture.py"), src, "--repeat", "20",
                    "-o", str(out)], check=True, capture_output=True, timeout=300)
    return str(out)


def test_summary_workers_count_most_exchanges_and_the_merge_is_exact(big_capture, capsys):
    """On a capture with many connections the workers fold exchanges into their partial
    summaries (what travels: the first of each status, API and client, the exchanges whose
    bodies the summary reads, and those labelled with topic ids another worker may have
    learned), and the merged summary is still one process's, byte for byte."""
    from kwinspect.analyze.summary import SummaryFold

    want = _summary(["-F", "json", big_capture], capsys)
    assert json.loads(want)["exchanges"] > 1000
    assert _summary(["-F", "json", "-j", "2", big_capture], capsys) == want
    assert _summary(["-j", "2", big_capture], capsys) == _summary([big_capture], capsys)
    run = FileRun()
    shipped = sum(1 for _ in dissect_files_parallel([big_capture], run=run, jobs=2, bodies="summary",
                                                    fold=SummaryFold()))
    folded = sum(part["exchanges"] for part, _ids in run.dissector.partials)
    # 20 copies x (18 ApiVersions/Metadata/FindCoordinator + 9 Fetch v13 by topic id) travel
    assert folded > 200 and folded + shipped > 1000, (folded, shipped)
    assert len(run.dissector.partials) == 2 and all(part["exchanges"] for part, _ids in run.dissector.partials)


def test_the_reader_hands_each_packet_to_exactly_one_worker(big_capture):
    """One reader: every TCP packet goes to one worker (the same count one process feeds
    its dissector), both workers get a share, and the parser's counters are whole."""
    from kwinspect.dissect import Dissector

    for path in (big_capture, *CAPTURES):
        one = FileRun()
        for _ in dissect_files([path], run=one):
            pass
        assert isinstance(one.dissector, Dissector)
        for jobs in (2, 3):
            run = FileRun()
            for _ in dissect_files_parallel([path], run=run, jobs=jobs):
                pass
            fed = run.dissector.packets_fed()
            assert sum(fed) == one.dissector.stats.tcp_packets, (path, jobs, fed)
            assert run.dissector.packet_counts() == one.dissector.packet_counts(), path
            if path == big_capture:
                assert min(fed) > 0 and max(fed) < sum(fed) * 0.8, fed


def test_summary_goes_on_in_one_process_when_a_broker_id_is_not_certain(monkeypatch, capsys):
    """When the broker id of a worker's last exchange to a broker cannot be told without
    capture order (it changed during the capture), and when any other cross-connection
    check fails mid-run, the summary starts over in one process: still one process's."""
    path = os.path.join(ROOT, "captures", "tansu-produce-consume.pcap")
    want = _summary(["-F", "json", path], capsys)

    def uncertain(self, broker, key):
        raise parallel._Fallback("forced by the test")

    with monkeypatch.context() as m:
        m.setattr(MergedDissector, "_broker_id_at", uncertain)
        assert _summary(["-F", "json", "-j", "2", path], capsys) == want
    real = MergedDissector.settle
    calls = {"n": 0}

    def settle(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise parallel._Fallback("forced by the test")
        return real(self, batch)

    monkeypatch.setattr(MergedDissector, "settle", settle)
    assert _summary(["-F", "json", "-j", "2", path], capsys) == want
    assert calls["n"] >= 5


def test_broker_id_of_folded_exchanges_from_the_broker_table_history():
    """The id one process gives a broker's last exchange that a worker folded: the id in
    force at its merge key when the broker never had another; otherwise start over."""
    m = MergedDissector(True)
    broker = "10.0.0.1:9092"
    m._broker_history = [((), {}), ((10, 0, 1, 1), {1: ("10.0.0.1", 9092)})]
    assert m._broker_id_at(broker, (5, 0, 1, 1)) is None  # before the broker table knew it
    assert m._broker_id_at(broker, (11, 0, 1, 1)) == 1
    m._broker_history.append(((20, 0, 1, 1), {2: ("10.0.0.1", 9092)}))  # the address moved to id 2
    with pytest.raises(parallel._Fallback):
        m._broker_id_at(broker, (21, 0, 1, 1))
    m._broker_history = [((), {}), ((10, 0, 1, 1), {1: ("10.0.0.1", 9092)}), ((20, 0, 1, 1), {})]
    with pytest.raises(parallel._Fallback):  # id 1, then none: was an exchange folded while it was 1?
        m._broker_id_at(broker, (21, 0, 1, 1))
    m._ids_given[broker] = {1}  # an exchange handed on had it: the summary keeps 1 either way
    assert m._broker_id_at(broker, (21, 0, 1, 1)) is None


def test_parallel_rows_equal_one_process_with_the_pure_python_core():
    """Without the compiled reader and parser the one-reader path runs on the Python ones."""
    from tests.helpers.cores import python_core

    with python_core():
        for path in CAPTURES:
            want, run1 = _sequential(path)
            run2 = FileRun()
            got = _rows(dissect_files_parallel([path], None, run=run2, jobs=2), run2)
            assert got == want, path
            assert run2.dissector.packet_counts() == run1.dissector.packet_counts(), path


def test_record_sets_cut_from_produce_and_fetch_bodies_as_the_full_walk_does():
    """A group the main process may rebuild travels with its record sets cut to counts and
    sizes; the targeted copy (only the dicts on the way to each record set) pickles to
    the same bytes as the walk over every node, on every Produce and Fetch body of the
    shipped and public captures, and a body of another shape still takes the walk."""
    import pickle

    compared = 0
    for path in CAPTURES + PUBLIC:
        for ev in dissect_files([path]):
            if isinstance(ev, Exchange) and ev.api_key in (parallel.PRODUCE, parallel.FETCH):
                for msg in (ev.request, ev.response):
                    if msg is not None and isinstance(msg.body, dict):
                        light = parallel._records_light(msg.api_key, msg.is_request, msg.body)
                        assert pickle.dumps(light) == pickle.dumps(parallel._without_record_bytes(msg.body))
                        compared += 1
    assert compared > 200
    odd = {"responses": [{"partitions": "not a list"}]}
    assert parallel._records_light(parallel.FETCH, False, odd) == odd


def test_reader_routes_vlan_tagged_and_fragmented_packets_as_one_process(tmp_path):
    """The packets the reader's header peek does not take (802.1Q tags, IP fragments) go
    through its own parser and travel as segments (a datagram made of fragments as one);
    mixed with plain ones on the same connections, the rows, packet counts and the
    packets each worker got are one process's. Every fragmented datagram has IP id 0
    here: the shadow must get the reader's reassembled segments, not parse fragments
    itself (it would miss those of decided connections and mix up the next datagram)."""
    from kwinspect.capture.packets import PacketParser
    from kwinspect.capture.readers import open_capture
    from tests.helpers.pcapgen import build_frames, write_pcap

    parser = PacketParser()
    src = open_capture(os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap"))
    segs = [seg for raw in src if (seg := parser.parse(raw)) is not None]
    frames = []
    for k, seg in enumerate(segs):
        kw = {"vlan": (100,)} if k % 3 == 1 else {"fragment_size": 64} if k % 3 == 2 else {}
        frames.extend(build_frames([seg], **kw))
    path = str(tmp_path / "mixed.pcap")
    write_pcap(path, frames)
    assert len(frames) > len(segs) + 40  # some segments really are in several fragments
    want, run1 = _sequential(path)
    assert sum(1 for r in want if isinstance(r, dict) and r.get("status") == "paired") > 20
    for jobs in (2, 3):
        run2 = FileRun()
        got = _rows(dissect_files_parallel([path], None, run=run2, jobs=jobs), run2)
        assert got == want, jobs
        assert isinstance(run2.dissector, MergedDissector), "fell back to one process"
        assert run2.dissector.packet_counts() == run1.dissector.packet_counts()
        assert sum(run2.dissector.packets_fed()) == run1.dissector.stats.tcp_packets == len(segs)


def test_partial_summaries_need_no_fallback_on_any_capture():
    """The broker ids of folded exchanges are settled from the broker table's history on
    every shipped and public capture: none has to start over in one process."""
    from kwinspect.analyze.summary import SummaryFold

    for path in CAPTURES + PUBLIC:
        run = FileRun()
        for _ in dissect_files_parallel([path], run=run, jobs=2, bodies="summary", fold=SummaryFold()):
            pass
        assert isinstance(run.dissector, MergedDissector), path
        assert len(run.dissector.partials) == 2, path


def _reshaped_capture(path: str, *, byteorder: str, nano: bool, gz: bool = False) -> str:
    """A shipped capture's segments written again: in ``byteorder`` with ``nano`` timestamps,
    the second half an hour later (every connection is flushed as idle there and its next
    packet opens it again, without a SYN, in the middle of the reader's runs), every
    seventh segment behind a VLAN tag (the reader's Python path between runs), every
    eleventh cut by the snaplen; ``gz``: gzipped (the workers cannot read it themselves)."""
    from dataclasses import replace

    from kwinspect.capture.packets import PacketParser
    from kwinspect.capture.readers import open_capture
    from tests.helpers.pcapgen import build_frames, write_pcap

    parser = PacketParser()
    src = open_capture(os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap"))
    segs = [seg for raw in src if (seg := parser.parse(raw)) is not None]
    frames = []
    for k, seg in enumerate(segs):
        if k >= len(segs) // 2:
            seg = seg._replace(ts=seg.ts + 3600.0)
        (frame,) = build_frames([seg], vlan=(7,) if k % 7 == 3 else ())
        if k % 11 == 5 and len(frame.data) > 80:
            frame = replace(frame, data=frame.data[:-10])
        frames.append(frame)
    write_pcap(path, frames, byteorder=byteorder, nano=nano, gz=gz)
    return path


@pytest.mark.parametrize("routing", ["compiled", "python"])
@pytest.mark.parametrize(("byteorder", "nano", "gz"), [("<", False, False), (">", True, False), ("<", True, True)])
def test_reader_runs_of_plain_packets_give_one_process_output(routing, byteorder, nano, gz, tmp_path, monkeypatch,
                                                              capsys):
    """The reader's compiled routing (runs of plain pcap records fed to each worker's
    compiled packet loop) and its Python routing give the output of one process, on a
    capture whose connections are flushed as idle and reopened mid-run, with VLAN-tagged
    and snaplen-cut packets among the plain ones, big- and little-endian, micro- and
    nanosecond timestamps, read again by the workers (a file) or copied to them (gzip)."""
    from kwinspect.run import split

    if routing == "python":
        monkeypatch.setattr(split, "_csplit", None)
    elif split._csplit is None:
        pytest.skip("the compiled core is not built")
    path = _reshaped_capture(str(tmp_path / ("reshaped.pcap" + (".gz" if gz else ""))), byteorder=byteorder,
                             nano=nano, gz=gz)
    for table in ("exchanges", "records", "errors"):
        one, two = tmp_path / f"{table}1.jsonl", tmp_path / f"{table}2.jsonl"
        assert cli.main([table, "-q", "-F", "jsonl", "-o", str(one), path]) == 0
        assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
        assert one.read_bytes() == two.read_bytes(), table
        assert one.read_bytes().count(b"\n") > 10
    assert cli.main(["summary", "-q", "-F", "json", path]) == 0
    want = capsys.readouterr().out
    assert cli.main(["summary", "-q", "-F", "json", "-j", "2", path]) == 0
    assert capsys.readouterr().out == want


def test_compiled_reader_sends_plain_packets_as_runs_of_records(tmp_path):
    """Every packet goes to exactly one worker, and the plain ones travel as runs of pcap
    records (not one item each): what the workers' compiled packet loop is fed."""
    import pickle

    from kwinspect.run import split

    if split._csplit is None:
        pytest.skip("the compiled core is not built")
    path = _reshaped_capture(str(tmp_path / "reshaped.pcap"), byteorder="<", nano=False)

    class Out:
        def __init__(self) -> None:
            self.msgs: list = []

        def send_bytes(self, data: bytes) -> None:
            self.msgs.append(pickle.loads(data))

    outs = [Out(), Out()]
    splitter = split.Splitter(None, 2, "balance", outs, 50_000)
    splitter.run([path])
    seen: list[int] = []
    offsets_seen: list[int] = []
    in_runs = 0
    with open(path, "rb") as f:
        file_bytes = f.read()
    for out in outs:
        for msg in out.msgs:
            if msg[0] != split.MSG_BATCH:
                continue
            # a regular file: the runs are at offsets of the file itself
            assert msg[4] == path
            records, numbers = file_bytes, memoryview(msg[5]).cast("i")
            for it in msg[3]:
                if it[0] == split.TAG_RUN:
                    _tag, first, count, offset, record, nbytes = it
                    seen.extend(range(first, first + count))
                    in_runs += count
                    # the run's records are whole pcap records at that offset, the
                    # packets first .. first + count - 1 of the file
                    end = offset + nbytes
                    for _ in range(count):
                        caplen = int.from_bytes(records[offset + 8:offset + 12], "little")
                        offsets_seen.append(offset)
                        offset += 16 + caplen
                    assert offset == end
                    assert record + count <= len(numbers)
                elif it[0] in (split.TAG_PACKET, split.TAG_SEGMENT):
                    seen.append(it[1])
    assert sorted(seen) == list(range(1, splitter.pos + 1))  # each packet once (all are TCP here)
    assert in_runs > splitter.pos // 2
    # the offsets are the file's records (walked here from its header on)
    offsets, at = [], 24
    while at < len(file_bytes):
        offsets.append(at)
        at += 16 + int.from_bytes(file_bytes[at + 8:at + 12], "little")
    assert set(offsets_seen) <= set(offsets) and len(set(offsets_seen)) == in_runs


@pytest.mark.parametrize("table", ["exchanges", "records"])
def test_rows_a_worker_labelled_with_its_own_topic_names_are_checked(table, tmp_path, monkeypatch):
    """A worker that found a name for every topic id it looked up renders the row itself
    and the main process checks those names against the global ones: with the answers as
    found, the output is one process's; with a worker's answers made wrong (as if another
    connection had named the id differently), the check fails and the capture is read
    again by one process, with one process's output still."""
    path = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    one, two = tmp_path / "j1.jsonl", tmp_path / "j2.jsonl"
    assert cli.main([table, "-q", "-F", "jsonl", "-o", str(one), path]) == 0
    assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
    assert one.read_bytes() == two.read_bytes()

    checked, fallbacks = [], []
    real_settle, real_found = MergedDissector.settle, parallel._Worker._found

    def settle(self, batch):
        checked.extend(ev for ev, _k, _m in batch if type(ev) is tuple and ev[0] == "chk")
        try:
            return real_settle(self, batch)
        except parallel._Fallback as exc:
            fallbacks.append(str(exc))
            raise

    def wrong_names(self, lookups):  # (in the forked workers)
        return real_found(self, [(tid, None if name is None else name + "-elsewhere") for tid, name in lookups])

    monkeypatch.setattr(MergedDissector, "settle", settle)
    monkeypatch.setattr(parallel._Worker, "_found", wrong_names)
    two.unlink()
    assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
    assert checked, "no row was labelled by a worker"
    assert fallbacks and "named differently" in fallbacks[0]
    assert one.read_bytes() == two.read_bytes()
    assert b"-elsewhere" not in two.read_bytes()


def test_runs_fed_one_packet_at_a_time_without_the_compiled_packet_loop(tmp_path, monkeypatch):
    """A worker whose Dissector has no compiled packet loop (the driver's extension not
    built, the reader's routing loop built) feeds a run's records as RawPackets, one by
    one: the output is still one process's."""
    from kwinspect import dissect
    from kwinspect.run import split

    if split._csplit is None:
        pytest.skip("the compiled core is not built")
    path = _reshaped_capture(str(tmp_path / "reshaped.pcap"), byteorder=">", nano=True)
    one, two = tmp_path / "j1.jsonl", tmp_path / "j2.jsonl"
    assert cli.main(["exchanges", "-q", "-F", "jsonl", "-o", str(one), path]) == 0
    monkeypatch.setattr(dissect, "chunk_fastpath", None)  # read by the workers' Dissector
    assert cli.main(["exchanges", "-q", "-j", "2", "-F", "jsonl", "-o", str(two), path]) == 0
    assert one.read_bytes() == two.read_bytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_helper_process_dies_with_the_process_that_started_it(tmp_path):
    """run/procs.die_with_parent, as the --jobs reader and workers call it first thing: a
    forked helper that would sleep for a minute ends within seconds of its parent's SIGKILL
    (without it, it slept on: the daemon flag only helps a parent that exits normally)."""
    import signal
    import subprocess
    import time

    pidfile = tmp_path / "helper.pid"
    code = (
        "import os, time\n"
        "from kwinspect.run.procs import die_with_parent\n"
        "parent = os.getpid()\n"
        "if os.fork() == 0:\n"
        "    die_with_parent(parent)\n"
        f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline, "the helper never started"
            time.sleep(0.05)
        helper = int(pidfile.read_text())
        assert _alive(helper)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(helper):
        os.kill(helper, signal.SIGKILL)
        pytest.fail("the helper outlived its parent")


def _alive(pid: int) -> bool:
    """pid runs (a zombie waiting for a reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("cut", [7, 0])
def test_a_capture_cut_inside_its_last_record_gives_one_process_output(cut, tmp_path):
    """The reader maps a regular file instead of reading it: a file whose last record is cut
    by the end of the file (``cut`` bytes short) is read to the same packets, with the same
    issue, as one process reads it."""
    src = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    with open(src, "rb") as f:
        data = f.read()
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:len(data) - cut])
    for table in ("exchanges", "errors"):
        one, two = tmp_path / f"{table}1.jsonl", tmp_path / f"{table}2.jsonl"
        assert cli.main([table, "-q", "-F", "jsonl", "-o", str(one), str(path)]) == 0
        assert cli.main([table, "-q", "-j", "2", "-F", "jsonl", "-o", str(two), str(path)]) == 0
        assert one.read_bytes() == two.read_bytes(), table
    assert (b"capture ends inside" in one.read_bytes()) == (cut > 0)
