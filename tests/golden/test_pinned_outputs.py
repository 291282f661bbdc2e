"""Every CLI output on every shipped and public capture is what outputs.json pins.

The pins were taken before the issue-18 restructuring; a change that moves code
must not move a byte. After an intended output change, re-pin with
`python -m tests.golden.pin_outputs --write` and say why in the commit.
"""

import json

import pytest

from tests.golden import pin_outputs as pin

PINS = json.loads(pin.PINS.read_text())


@pytest.mark.parametrize("capture", pin.captures(), ids=lambda p: p.name)
def test_outputs_are_pinned(capture, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("NO_COLOR", "1")
    differ = []
    for name, command in pin.COMMANDS:
        got = pin.digest(*pin.run(command, capture))
        want = PINS.get(pin.key(capture, name))
        if got != want:
            differ.append(f"{name}: {want} -> {got}")
    assert not differ, "outputs changed:\n" + "\n".join(differ)


def test_every_capture_is_pinned():
    keys = {pin.key(c, name) for c in pin.captures() for name, _ in pin.COMMANDS}
    assert keys <= PINS.keys(), sorted(keys - PINS.keys())[:5]
