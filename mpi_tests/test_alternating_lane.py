"""A solver's time series of several variables: each call repeats the same variable's
last call (collio.speculate.KeptCalls), so alternating layouts take the guessed lane.

Each step writes three arrays one after the other, each rank's piece one run of the same
width (two of one shape, a third of another); from the fourth step every call is guessed.
The bytes are checked against numpy and ROMIO, and a rank that calls out of turn raises
on every rank with nothing written.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_everywhere, read_file

import collio
from collio.layouts import Subarray
from collio.testing.romio import romio_write

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 3, 16


def _variables(comm, s: int) -> list[tuple[np.ndarray, Subarray, bytes]]:
    """Rank r's piece, layout and the global bytes of each variable of step ``s``: rows
    of two float64 arrays of one shape, then columns of a float64 array in F order, each
    rank's piece one run of the same width."""
    p, r = comm.size, comm.rank
    shape, n = (ROWS * p, COLS), ROWS * p * COLS
    a = np.arange(n, dtype=np.float64).reshape(shape) + 1000 * s
    b = -a - 0.5
    c = np.asfortranarray(np.arange(n, dtype=np.float64).reshape(COLS, ROWS * p) + 7 * s)
    at = [(3 * s + k) * n * 8 for k in range(3)]
    rows = (slice(r * ROWS, (r + 1) * ROWS), slice(None))
    return [
        (np.ascontiguousarray(a[rows]),
         Subarray(shape, (r * ROWS, 0), (ROWS, COLS), "<f8", offset=at[0]), a.tobytes()),
        (np.ascontiguousarray(b[rows]),
         Subarray(shape, (r * ROWS, 0), (ROWS, COLS), "<f8", offset=at[1]), b.tobytes()),
        (np.asfortranarray(c[:, r * ROWS : (r + 1) * ROWS]),
         Subarray(c.shape, (0, r * ROWS), (COLS, ROWS), "<f8", order="F", offset=at[2]),
         c.tobytes(order="F")),
    ]  # fmt: skip


def _same_file(comm, path, want):
    comm.Barrier()
    got = read_file(path)
    comm.Barrier()  # (every rank reads before any goes on)
    assert got == want


def test_alternating_variables_take_the_lane_and_match_numpy_and_romio(comm, mpi_tmp_path):
    path, theirs = str(mpi_tmp_path / "vars.bin"), str(mpi_tmp_path / "romio.bin")
    steps, parts, guessed = 6, [], []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            for piece, lay, whole in _variables(comm, s):
                f.write_all(piece, lay)
                guessed.append(f.stats.last_call["guessed"])
                romio_write(theirs, piece, lay, comm)
                parts.append(whole)
    assert guessed[9:] == [True] * (3 * steps - 9)  # (from the fourth step on)
    _same_file(comm, path, b"".join(parts))
    assert read_file(theirs) == b"".join(parts)
    read_guessed = []
    with collio.open(path, "r", comm=comm) as f:
        for s in range(steps):
            for piece, lay, _ in _variables(comm, s):
                got = f.read_all(lay)
                assert got.dtype == piece.dtype
                np.testing.assert_array_equal(got, piece)
                read_guessed.append(f.stats.last_call["guessed"])
    assert read_guessed[9:] == [True] * (3 * steps - 9)


@pytest.mark.mpi(min_size=2)
def test_a_rank_out_of_turn_raises_everywhere_and_writes_nothing(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "turn.bin")
    parts = []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            for piece, lay, whole in _variables(comm, s):
                f.write_all(piece, lay)
                parts.append(whole)
            guessed = f.stats.last_call["guessed"]
        assert guessed
        # step 4's first variable on every rank but 0, which writes the third one
        mine = _variables(comm, 4)
        piece, lay, _ = mine[2] if comm.rank == 0 else mine[0]
        raises_everywhere(comm, collio.MismatchError, lambda: f.write_all(piece, lay),
                          match="ranks disagree on the global array")  # fmt: skip
        _same_file(comm, path, b"".join(parts))
        guessed = []
        for s in range(4, 8):
            for piece, lay, whole in _variables(comm, s):
                f.write_all(piece, lay)
                guessed.append(f.stats.last_call["guessed"])
                parts.append(whole)
        assert guessed[-3:] == [True] * 3  # (the series takes the lane again)
    _same_file(comm, path, b"".join(parts))
