"""`kwinspect deliveries` on fresh rig captures, against the clients' own logs.

Each scenario of rig.deliveries_scenarios runs once (real brokers, real
confluent-kafka clients, tcpdump on lo); its manifest holds what the producers'
delivery reports said and what each consumer received. Every logged record must be
one row at the logged offset, every receipt a fetch of that row by that consumer,
and the duplicate, double-fetch and unread-partition scenarios must be findings
naming the offsets the logs imply (tests/helpers/deliveries_oracle.check_scenario;
tests/analyze/test_deliveries.py applies the same checks to the shipped captures).
"""

from __future__ import annotations

import os

import pytest

from rig.deliveries_scenarios import E2E_SCENARIOS, unavailable_reason
from tests.helpers.deliveries_oracle import check_scenario, deliveries_rows

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]


@pytest.mark.parametrize("name", list(E2E_SCENARIOS))
def test_deliveries_scenario_matches_the_clients_logs(rig, tmp_path_factory, capsys, name):
    why = unavailable_reason(name)
    if why:
        pytest.skip(why)
    workdir = str(tmp_path_factory.mktemp("deliveries"))
    m = E2E_SCENARIOS[name](rig, workdir)
    pcap = os.path.join(workdir, m.pcap)
    rows = deliveries_rows(capsys, pcap, m.kafka_ports)
    problems = deliveries_rows(capsys, pcap, m.kafka_ports, "--problems")
    check_scenario(m, rows, problems)
