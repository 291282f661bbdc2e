"""tcp.stream numbers: the compiled table (capture/_cstreams.c) gives TcpStreamNumbers'
answers, and a million 4-tuples fit in a small fraction of the dict's memory."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from helpers.cores import require_compiled

from kwinspect.capture import tcp
from kwinspect.capture.packets import ACK, FIN, RST, SYN
from kwinspect.capture.tcp import TcpStreamNumbers


def _compiled(max_streams: int):
    require_compiled()
    return tcp._cstreams.StreamNumbers(max_streams)


def _keys(rng: random.Random, n: int) -> list[bytes]:
    # IPv4 pairs (12 bytes, inline) and IPv6 pairs (36 bytes, a block of their own)
    return [bytes(rng.randrange(256) for _ in range(12 if i % 3 else 36)) for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_streams", [3, 40, 1_000_000])
def test_compiled_numbers_are_the_reference_ones(seed, max_streams):
    """Random packets over few 4-tuples and few sequence numbers: new SYNs, reused ports,
    retransmitted SYNs, first packets without SYN, both sides, past max_streams."""
    rng = random.Random(seed)
    keys = _keys(rng, 60)
    seqs = [0, 1, 2, 0xFFFFFFFF, 0x80000000, 12345]
    ref, new = TcpStreamNumbers(max_streams), _compiled(max_streams)
    for _ in range(4000):
        key, side = rng.choice(keys), rng.randrange(2)
        flags = rng.choice([SYN, SYN, SYN | ACK, ACK, ACK | FIN, RST, 0, SYN | RST])
        seq = rng.choice(seqs)
        assert new.see(key, side, flags, seq) == ref.see(key, side, flags, seq)
        other = rng.choice(keys)
        assert new.knows_direction(key, other) == ref.knows_direction(key, other)
        assert new.knows_direction(other, key) == ref.knows_direction(other, key)
        assert (new.count, new.known()) == (ref.count, ref.known())


def test_bad_arguments_are_errors_not_crashes():
    new = _compiled(10)
    with pytest.raises(OverflowError):
        new.see(b"k" * 12, 0, SYN, 1 << 32)
    with pytest.raises(ValueError):
        new.see(b"k" * 37, 0, SYN, 1)
    with pytest.raises(ValueError):
        new.see(b"k" * 12, 2, SYN, 1)
    with pytest.raises(TypeError):
        new.see("k", 0, SYN, 1)
    with pytest.raises(ValueError):
        tcp._cstreams.StreamNumbers(1 << 21)
    assert new.known() == 0


def test_a_million_four_tuples_take_little_memory():
    """The dict of TcpStreamNumbers held ~150 bytes per 4-tuple (150 MB for a SYN flood of
    a million clients); the compiled table holds 32 bytes each plus its index."""
    new = _compiled(1_000_000)
    server = bytes([10, 99, 0, 2]) + (9092).to_bytes(2, "big")
    tracemalloc.start()
    try:
        for i in range(1_000_000):
            client = i.to_bytes(4, "big") + (1000 + i % 50000).to_bytes(2, "big")
            assert new.see(client[:4] + server[:4] + client[4:] + server[4:], 0, SYN, i) == i
        used, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert new.known() == 1_000_000
    assert new.see(b"\x01" * 12, 0, SYN, 7) is None  # beyond max_streams: no number
    assert used < 50 * 1_000_000, used
