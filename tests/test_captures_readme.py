"""captures/README.md, as rig.captures_readme writes it from the manifests."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rig.captures_readme import write_readme

CAPTURES = Path(__file__).resolve().parents[1] / "captures"


def test_the_committed_readme_is_what_the_manifests_give(tmp_path):
    for path in CAPTURES.iterdir():  # links, so write_readme reads the real files and sizes
        if path.name.endswith((".manifest.json", ".pcap", ".pcapng")):
            os.symlink(path, tmp_path / path.name)
    assert write_readme(str(tmp_path)) == (CAPTURES / "README.md").read_text(encoding="utf-8")


def test_each_client_id_is_listed_once_with_its_instances():
    readme = (CAPTURES / "README.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^### (\S+)\n(.*?)(?=^### |^## )", readme, re.S | re.M))
    repeated = 0
    for manifest in sorted(CAPTURES.glob("*.manifest.json")):
        m = json.loads(manifest.read_text())
        line = next(x for x in sections[m["pcap"]].splitlines() if x.startswith("- Clients:"))
        shown = line.split("client ids: ", 1)[1].split(", ") if m["clients"] else []
        ids = [c["client_id"] for c in m["clients"]]
        want = [cid if ids.count(cid) == 1 else f"{cid} ({ids.count(cid)} instances)"
                for cid in dict.fromkeys(ids)]
        assert shown == want, m["pcap"]
        repeated += len(ids) != len(set(ids))
    assert repeated >= 2  # deliveries-consumer-seek and deliveries-retry-duplicate
