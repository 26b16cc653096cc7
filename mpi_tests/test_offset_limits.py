"""A piece that ends past the largest byte offset (2**63 - 1) is a layout error, agreed.

A file offset is a signed 64-bit number (``off_t``, and the int64 every run and every
head's extent is): a piece whose offsets fit but whose end does not must be refused by
its checks on the rank that has it, like any other bad layout, not overflow later on
that rank alone while the others wait in the call's agreement.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_everywhere, read_file

import collio
from collio import layouts

pytestmark = pytest.mark.mpi(min_size=1)

_TOP = 2**63 - 1  # the largest byte offset


def _calls(f, r, last):
    """Each call with a piece ending at byte 2**63 on the last rank (the others' pieces:
    8 bytes of their own at the start), and what it writes (None: a read)."""

    def seg(n=8):
        return layouts.Segments([_TOP - n + 1 if r == last else 8 * r], [n])

    def box():
        if r == last:
            return layouts.Subarray((8,), (0,), (8,), "u1", offset=_TOP - 7)
        return layouts.Subarray((8 * last,), (8 * r,), (8,), "u1")

    buf = np.full(8, 99, np.uint8)
    return [
        (lambda: f.write_all(buf, seg()), "write_all", "segment 0 ends at byte"),
        (lambda: f.write_all_many([(buf, seg())]), "write_all_many", "segment 0 ends at byte"),
        (lambda: f.read_all(seg()), "read_all", "segment 0 ends at byte"),
        (lambda: f.read_all_many([seg()]), "read_all_many", "segment 0 ends at byte"),
        (lambda: f.write_all(buf, box()), "write_all", "the array ends at byte"),
        (lambda: f.read_all(box()), "read_all", "the array ends at byte"),
        (
            lambda: f.write_at_all(_TOP - 7 if r == last else 8 * r, buf),
            "write_at_all",
            "the call reaches byte",
        ),
        (
            lambda: f.read_at_all(_TOP - 7 if r == last else 8 * r, buf),
            "read_at_all",
            "the call reaches byte",
        ),
    ]


def test_a_piece_ending_past_the_largest_offset_raises_everywhere(comm, mpi_tmp_path):
    """On the last rank each call's piece ends one byte past 2**63 - 1 (through the
    view too): every rank raises
    the same LayoutError naming that rank and the end, the file keeps its bytes, and the
    ranks' next calls still meet (the file usable after each)."""
    path = str(mpi_tmp_path / "top.bin")
    p, r, last = comm.size, comm.rank, comm.size - 1
    mine = layouts.Segments([8 * r], [8])
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.full(8, r, np.uint8), mine)
        for k, (call, name, what) in enumerate(_calls(f, r, last)):
            err = raises_everywhere(comm, collio.LayoutError, call)
            assert str(err).startswith(f"{name}: rank {last}: "), (k, str(err))
            assert f"{what} {2**63}, past the largest offset {_TOP}" in str(err), (k, str(err))
            assert f.position == 0
            f.write_all(np.full(8, r + k, np.uint8), mine)
            assert f.read_all(mine).tobytes() == bytes([r + k]) * 8, k
        f.sync()
        comm.Barrier()
        want = b"".join(bytes([q + k]) * 8 for q in range(p))  # (the last call's)
        assert read_file(path) == want
