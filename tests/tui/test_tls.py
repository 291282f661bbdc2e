"""`kwinspect tui --tls-keylog FILE capture.pcap`: the TUI indexes in a child process
(tui/index_proc.py), to which the DissectConfig is pickled on a pipe; the key log must
cross with it, and the rows must be the CLI's (`kwinspect exchanges -F jsonl
--tls-keylog`).  No secret may land anywhere visible: the child's command line, the
store's rows, the connections it sends back."""

from __future__ import annotations

import contextlib
import io
import json
import pickle

import pytest

from kwinspect import cli
from kwinspect.tui.app import KwinspectApp
from kwinspect.tui.indexer import Indexer
from kwinspect.tui.store import ExchangeStore

from .conftest import CAPTURES, indexed

KEYED = ["tansu-tls13-keylog", "tansu-tls12-keylog"]


def _config(name: str):
    """The DissectConfig `kwinspect tui --tls-keylog KEYS PCAP` builds."""
    parser = cli.build_parser()
    args = parser.parse_args(["tui", "--tls-keylog", str(CAPTURES / f"{name}.keys"), str(CAPTURES / f"{name}.pcap")])
    return cli._config(args)  # noqa: SLF001 - the CLI's own wiring


def _cli_rows(name: str) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["exchanges", str(CAPTURES / f"{name}.pcap"), "--tls-keylog",
                         str(CAPTURES / f"{name}.keys"), "-F", "jsonl", "-q"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _secrets(name: str) -> list[str]:
    lines = (CAPTURES / f"{name}.keys").read_text().splitlines()
    return [ln.split()[2] for ln in lines if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("name", KEYED)
@pytest.mark.parametrize("process", [True, False], ids=["process", "thread"])
def test_indexer_decrypts_like_the_cli(name: str, process: bool) -> None:
    config = _config(name)
    assert config.tls_keys  # the key log was read
    want = _cli_rows(name)
    assert want and {"Produce", "Fetch"} <= {r["api_name"] for r in want}
    store = ExchangeStore(spill=not process)
    ix = Indexer(store)
    (ix.index_files_in_process if process else ix.index_files)([CAPTURES / f"{name}.pcap"], config)
    try:
        assert ix.error is None
        assert len(store) == len(want)
        for row, w in enumerate(want):
            got = store.row_dict(row)
            for col in ("stream", "api_name", "api_version", "correlation_id", "client_id", "status",
                        "frame", "response_frame", "tcp_stream", "topics", "error_codes"):
                assert got[col] == w[col], (row, col)
        assert store.frames(0)[0] is not None  # the decrypted frames are there to re-decode
        infos = list(ix.dissector.connections.values())
        assert infos and all(i.tls_decrypted for i in infos), [i.tls for i in infos]
        # nothing the store or the connections carry holds a secret
        blob = pickle.dumps(([store.row_dict(r) for r in range(len(store))], infos))
        for s in _secrets(name):
            assert bytes.fromhex(s) not in blob and s.encode() not in blob
    finally:
        store.close()


async def test_app_shows_the_decrypted_exchanges() -> None:
    name = "tansu-tls13-keylog"
    config = _config(name)
    app = KwinspectApp([CAPTURES / f"{name}.pcap"], config=config)
    async with app.run_test(size=(160, 40)) as pilot:
        await indexed(pilot)
        assert app.indexer.error is None
        assert len(app.store) == len(_cli_rows(name)) > 0
        names = {app.store.row_dict(r)["api_name"] for r in range(len(app.store))}
        assert {"Produce", "Fetch"} <= names
        screen = app.export_screenshot()
        assert "Produce" in screen
        for s in _secrets(name):
            assert s not in screen
