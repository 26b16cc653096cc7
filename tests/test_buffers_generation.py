"""The kept allocations' generation: advanced when one is made or freed, not when one is
reused, so that what a kept plan prepared is known to be there.  Local, no MPI."""

from __future__ import annotations

from collio import buffers


def test_the_generation_moves_when_an_allocation_is_made_or_freed():
    buffers.free_buffers()
    g0 = buffers.generation()
    first = buffers.round_buffers(8192, 2)
    g1 = buffers.generation()
    assert g1 > g0
    again = buffers.round_buffers(4096, 2)  # (smaller: the kept one serves)
    assert buffers.generation() == g1
    assert again[0].base is first[0].base
    buffers.round_buffers(1 << 20, 2)  # (larger: made anew)
    g2 = buffers.generation()
    assert g2 > g1
    buffers.free_buffers()
    assert buffers.generation() > g2
    buffers.round_buffers(4096, 2)
    assert buffers.generation() > g2 + 1
    buffers.free_buffers()
