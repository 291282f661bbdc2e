"""`kwinspect diagnose` on real faults: the rig's mock cluster injects them, real clients hit them.

Each scenario of rig.diagnose_scenarios runs once (private mock cluster,
real confluent-kafka/kafka-python clients, tcpdump on lo) and its capture must yield
the finding kinds the scenario is built to cause, with evidence that points at real
exchanges of the capture.
"""

from __future__ import annotations

import pytest

from rig.diagnose_scenarios import CLEAN_DIAG_SCENARIOS, DIAG_SCENARIOS

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("rig")]


def _diagnose(pcap: str, ports: list[int]):
    from kwinspect.analyze.diagnose import Diagnoser
    from kwinspect.dissect import DEFAULT_KAFKA_PORTS, DissectConfig
    from kwinspect.model import Exchange
    from kwinspect.run.files import FileRun, dissect_files

    d = Diagnoser()
    refs = set()
    run = FileRun()
    kafka_ports = frozenset(ports) | DEFAULT_KAFKA_PORTS
    for ev in dissect_files([pcap], DissectConfig(kafka_ports=kafka_ports), run=run):
        d.add(ev)
        if isinstance(ev, Exchange):
            refs.add((ev.stream, ev.correlation_id))
    # as `kwinspect diagnose` does: how each connection ended and who closed it (without
    # it a request the client abandoned by closing its own connection looked lost)
    d.connections_ended(run.dissector.connections.values(), kafka_ports)
    return d, refs


def _run_with_one_retake(run, tmp_path_factory, prefix):
    """Run a rig scenario into a fresh directory; once more if the rig itself gave up.

    The rig raises RuntimeError when the clients did not reach the state the scenario needs
    (a rebalance that did not settle in 30 s on a loaded CI box): that says nothing about
    kwinspect, so the scenario is recorded once more before the test judges anything.
    """
    workdir = str(tmp_path_factory.mktemp(prefix))
    try:
        return workdir, run(workdir)
    except RuntimeError:
        workdir = str(tmp_path_factory.mktemp(prefix + "-retake"))
        return workdir, run(workdir)


# Findings that measure the host's timing rather than the protocol: one stall of the loaded
# CI box (an ApiVersions answered in 120 ms by the mock) is a true latency outlier of that
# capture. A clean scenario showing only these is recorded once more and must then be quiet.
TIMING_KINDS = {"latency_outlier", "slow_broker"}


def _only_timing(findings) -> bool:
    return bool(findings) and all(f.kind in TIMING_KINDS for f in findings)


def _loud_text(name, loud) -> str:
    return f"{name}: false alarms:\n" + "\n".join(f"  {f.severity} {f.kind}: {f.title}" for f in loud)


@pytest.mark.parametrize("name", list(DIAG_SCENARIOS))
def test_diagnose_scenario(rig, tmp_path_factory, name):
    import os

    from rig.diagnose_scenarios import run_diag_scenario

    fn, expected = DIAG_SCENARIOS[name]
    workdir, m = _run_with_one_retake(lambda wd: run_diag_scenario(name, rig, wd), tmp_path_factory, "diag")
    d, refs = _diagnose(os.path.join(workdir, m.pcap), m.kafka_ports)
    findings = d.findings()
    kinds = {f.kind for f in findings}
    summary = "\n".join(f"  {f.severity} {f.kind}: {f.title}" for f in findings)
    assert expected <= kinds, f"{name}: missing {sorted(expected - kinds)}; got:\n{summary}"
    for f in findings:
        if f.kind in expected:
            assert f.evidence, f"{name}: {f.kind} has no evidence"
            for ev in f.evidence:
                if ev.correlation_id is not None:
                    assert (ev.stream, ev.correlation_id) in refs, f"{name}: {f.kind} points at nothing: {ev}"
    if name == "diag-group-churn":
        (lost,) = [f for f in findings if f.kind == "member_lost"]
        assert lost.key["client_id"] == "victim-consumer"
        (g,) = [t for t in d.group_timelines() if t.group_id == "diag-churn-group"]
        assert len(g.generations) >= 6
        assigned = [gen.assignment for gen in g.generations.values() if gen.assignment]
        assert any(a.get("assigned_partitions") for per_member in assigned for a in per_member.values() if a)
    if name == "diag-transactions":
        (open_txn,) = [f for f in findings if f.kind == "transaction_open"]
        assert open_txn.key["transactional_id"] == "diag-txn-open"
        assert {f.key["transactional_id"] for f in findings if f.kind == "transaction_aborted"} == {"diag-txn-aborted"}
    if name == "diag-version-not-advertised":
        (f,) = [f for f in findings if f.kind == "version_not_advertised"]
        assert (f.key["api_name"], f.key["api_version"], f.key["advertised"]) == ("Produce", 7, [0, 2])


# The rig's own fault-free scenarios, captured afresh (timings differ from the committed
# files): diagnose must not raise a warning or an error on them. The fixture shares each
# run with tests/e2e/test_e2e_live.py when both run in one session.
CLEAN_RIG_SCENARIOS = ["confluent-mock-produce-consume", "confluent-mock-idempotent",
                       "confluent-mock-transactions", "kafka-python-mock-group", "confluent-mock-codecs"]


@pytest.mark.parametrize("name", CLEAN_RIG_SCENARIOS)
def test_clean_rig_scenario_raises_no_warning(scenario_run, rig, tmp_path_factory, name):
    import os

    from rig.scenarios import run_scenario

    m, pcap, _decoded = scenario_run(name)
    d, _refs = _diagnose(pcap, m.kafka_ports)
    loud = d.findings("warning")
    if _only_timing(loud):
        workdir = str(tmp_path_factory.mktemp("clean-retake"))
        m = run_scenario(name, rig, workdir)
        d, _refs = _diagnose(os.path.join(workdir, m.pcap), m.kafka_ports)
        loud = d.findings("warning")
    assert not loud, _loud_text(name, loud)


@pytest.mark.parametrize("name", list(CLEAN_DIAG_SCENARIOS))
def test_clean_diag_scenario_raises_no_warning(rig, tmp_path_factory, name):
    import os

    from rig.diagnose_scenarios import run_diag_scenario

    def take(wd):
        return run_diag_scenario(name, rig, wd)

    workdir, m = _run_with_one_retake(take, tmp_path_factory, "diag-clean")
    d, _refs = _diagnose(os.path.join(workdir, m.pcap), m.kafka_ports)
    loud = d.findings("warning")
    if _only_timing(loud):
        workdir, m = _run_with_one_retake(take, tmp_path_factory, "diag-clean-retake")
        d, _refs = _diagnose(os.path.join(workdir, m.pcap), m.kafka_ports)
        loud = d.findings("warning")
    assert not loud, _loud_text(name, loud)
    (g,) = [t for t in d.group_timelines() if t.group_id == m.group_ids[0]]
    assert len(g.members848) == 2 and all(info["left"] for info in g.members848.values())
