"""Repeated small calls that do their I/O before their one agreement (collio.speculate).

From the third call of a time series on, each rank writes (reads) first and the call's
head agrees after; ``last_call["guessed"]`` says so.  When the head then says that the
call must not stand (another rank's bad input, its failed I/O, a different call, an
overlap the new offsets make), every write done before it is taken back: the file keeps
its bytes and its size, byte for byte, and the series goes on.
"""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest
from helpers import mismatch_message, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio.backends import filereads
from collio.testing.romio import romio_write

pytestmark = pytest.mark.mpi(min_size=1)
N = 4096  # bytes per rank per call


def _data(step, rank, n=N):
    return np.random.default_rng(7919 * step + rank).integers(0, 256, n, np.uint8)


def _append(f, comm, want, steps, first=0):
    """Steps ``first..first+steps-1`` of a series: rank r's N bytes of step s at
    ``(s*p + r) * N``, new bytes after the last (the file grows every call)."""
    p, r = comm.size, comm.rank
    for s in range(first, first + steps):
        f.write_at_all((s * p + r) * N, _data(s, r))
        for q in range(p):
            want[(s * p + q) * N : (s * p + q + 1) * N] = _data(s, q)


def _rewrite(f, comm, want, steps, seed):
    """The same offsets rewritten ``steps`` times (rank r at ``r * N``): every write
    covers bytes the file holds."""
    p, r = comm.size, comm.rank
    for s in range(steps):
        f.write_at_all(r * N, _data(seed + s, r))
    for q in range(p):
        want[q * N : (q + 1) * N] = _data(seed + steps - 1, q)


def _same_file(comm, path, want):
    comm.Barrier()
    got = np.frombuffer(read_file(path), np.uint8)
    # (a rank's next guessed write may start as soon as it enters the call: MPI's collective
    # calls need not synchronize, so every rank reads before any goes on)
    comm.Barrier()
    assert len(got) == len(want)  # (a write taken back leaves no longer file)
    np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
def test_a_series_guesses_from_its_third_call_and_writes_what_romio_writes(comm, mpi_tmp_path):
    path, theirs = str(mpi_tmp_path / "series.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, steps = comm.size, comm.rank, 12
    want = np.zeros(steps * p * N, np.uint8)
    guessed = []
    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            _append(f, comm, want, 1, first=s)
            guessed.append(f.stats.last_call["guessed"])
            fh.Write_at_all((s * p + r) * N, _data(s, r))
        st = f.stats.as_dict()
        last = f.stats.last_call
        out = np.empty(N, np.uint8)
        for s in range(steps):  # reads guess too: each rank's bytes, in place
            f.read_at_all((s * p + r) * N, out)
            np.testing.assert_array_equal(out, _data(s, r))
        read_guessed = f.stats.last_call["guessed"]
    fh.Close()
    assert guessed == [False, False] + [True] * (steps - 2)
    assert read_guessed
    # the statistics count every call as the agreed calls do
    assert st["bytes_written"] == steps * p * N and st["write_ops"] == steps * p
    assert st["direct_calls"] == steps and st["write_size_histogram"]["1K_10K"] == steps * p
    assert last["path"] == "direct" and last["runs"] == p
    assert last["extent"] == [(steps - 1) * p * N, steps * p * N]
    _same_file(comm, path, want)
    assert read_file(path) == read_file(theirs)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("grows", [True, False], ids=["past-the-end", "overwrite"])
def test_one_rank_bad_buffer_takes_back_every_guessed_write(comm, mpi_tmp_path, grows):
    path = str(mpi_tmp_path / "bad.bin")
    p, r, bad = comm.size, comm.rank, comm.size - 1
    want = np.zeros(6 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 6)
        if not grows:
            _rewrite(f, comm, want, 4, seed=100)
        assert f.stats.last_call["guessed"]
        buf = _data(50, r, 2 * N)
        buf = buf[::2] if r == bad else buf[:N]  # strided memory on one rank
        at = (6 * p + r) * N if grows else r * N
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all(at, buf),
            match=f"rank {bad}: buffer must be contiguous",
        )  # fmt: skip
        _same_file(comm, path, want)
        # the series goes on, guessing again from its third call
        more = np.zeros(9 * p * N, np.uint8)
        more[: len(want)] = want
        _append(f, comm, more, 3, first=6)
        assert f.stats.last_call["guessed"]
    _same_file(comm, path, more)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("other", ["sync", "read_at_all"])
def test_a_different_call_on_one_rank_takes_back_every_guessed_write(comm, mpi_tmp_path, other):
    path = str(mpi_tmp_path / "other.bin")
    p, r = comm.size, comm.rank
    want = np.zeros(5 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 5)
        out = np.empty(N, np.uint8)

        def call():
            if r == 0 and other == "sync":
                f.sync()
            elif r == 0:
                f.read_at_all(0, out)
            else:
                f.write_at_all((5 * p + r) * N, _data(5, r))

        err = raises_everywhere(
            comm, collio.MismatchError, call,
            match=mismatch_message(comm, other, "write_at_all"),
        )  # fmt: skip
        assert err.call_mismatch
        _same_file(comm, path, want)
        _rewrite(f, comm, want, 4, seed=200)  # (the file still works: new bytes)
    _same_file(comm, path, want)


@pytest.mark.mpi(min_size=2)
def test_a_failed_write_on_one_rank_takes_back_the_others(comm, mpi_tmp_path):
    """A real EFBIG: one rank's file size limit stops its guessed write at the end of the
    file (Python ignores SIGXFSZ); every rank raises the I/O error, and the bytes the
    others wrote before the agreement are gone again."""
    path = str(mpi_tmp_path / "efbig.bin")
    p, r, bad = comm.size, comm.rank, 1
    want = np.zeros(5 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 5)
        assert f.stats.last_call["guessed"]
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        if r == bad:
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(want), limits[1]))
        try:
            err = raises_everywhere(
                comm, collio.BackendError,
                lambda: f.write_at_all((5 * p + r) * N, _data(5, r)),
                match=f"backend I/O: rank {bad}:",
            )  # fmt: skip
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert err.ranks == (bad,)
        _same_file(comm, path, want)
        more = np.zeros(7 * p * N, np.uint8)
        more[: len(want)] = want
        _append(f, comm, more, 2, first=5)
    _same_file(comm, path, more)


@pytest.mark.mpi(min_size=2)
def test_ranks_that_move_apart_keep_their_guessed_writes_when_the_path_stays_direct(
    comm, mpi_tmp_path
):
    """The last rank skips ahead one step (it does not guess, the others do): the head
    finds the extents still disjoint, so the direct path stands and the others' guessed
    writes are that path's; the last rank writes after the head."""
    path = str(mpi_tmp_path / "apart.bin")
    p, r = comm.size, comm.rank
    want = np.zeros(8 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 5)
        at = (5 * p + r) * N if r < p - 1 else (7 * p + r) * N
        f.write_at_all(at, _data(5, r))
        done = f.stats.last_call
        st = f.stats.as_dict()
    for q, a in enumerate(comm.allgather(at)):
        want[a : a + N] = _data(5, q)
    assert not done["guessed"] and done["path"] == "direct"
    assert st["bytes_written"] == 6 * p * N and st["write_ops"] == 6 * p
    _same_file(comm, path, want[: (7 * p + p) * N])


@pytest.mark.mpi(min_size=1)
def test_a_guessed_series_of_an_atomic_file_commits_at_close(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "atomic.bin")
    p = comm.size
    want = np.zeros(6 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm, hints={"atomic_commit": True}) as f:
        _append(f, comm, want, 6)
        assert f.stats.last_call["guessed"]
        comm.Barrier()
        assert not os.path.exists(path) or os.path.getsize(path) == 0
    _same_file(comm, path, want)


@pytest.mark.mpi(min_size=2)
def test_a_guessed_read_learns_from_its_read_whether_it_maps_and_a_failure_is_agreed(
    comm, mpi_tmp_path, monkeypatch
):
    """A repeated small read through the view is one pread, mapped or not: whether the
    run lies within the file (so that the rank would copy from the map) comes from the
    bytes read, not from asking the size first.  A read that fails on one rank is raised
    on every rank; a rank whose run now lies past the end (the file cut short) leaves
    the lane and reads zeros there the general way; the series goes on."""
    path = str(mpi_tmp_path / "mapq.bin")
    p, r, bad = comm.size, comm.rank, comm.size - 1
    want = np.zeros(4 * p * N, np.uint8)
    out = np.empty(N, np.uint8)
    with collio.open(path, "w", comm=comm, hints={"mapped_reads": "enable"}) as f:
        _append(f, comm, want, 4)
        for s in range(4):
            f.read_at_all((s * p + r) * N, out)
        assert f.stats.last_call["guessed"] and f.stats.last_call["path"] == "mapped"

        def failing(*args):
            raise OSError(5, "injected read error")

        if r == bad:
            monkeypatch.setattr(f.backend, "size", failing)  # (not asked: read, not mapped)
            monkeypatch.setattr(filereads, "pread_zeros", failing)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.read_at_all(r * N, out))
        assert f"rank {bad}" in str(err) and "injected read error" in str(err)
        monkeypatch.undo()
        for s in range(4):
            f.read_at_all((s * p + r) * N, out)
            np.testing.assert_array_equal(out, _data(s, r))
        monkeypatch.setattr(f.backend, "size", failing)  # (every rank: never asked)
        f.read_at_all((2 * p + r) * N, out)
        np.testing.assert_array_equal(out, _data(2, r))
        assert f.stats.last_call["guessed"]
        monkeypatch.undo()
        comm.Barrier()
        if r == 0:  # (the last step's last rank's run ends past the new end)
            os.truncate(path, len(want) - N // 2)
        comm.Barrier()
        f.read_at_all((3 * p + r) * N, out)
        assert not f.stats.last_call["guessed"]
        mine = _data(3, r)
        if r == p - 1:
            mine[N // 2 :] = 0
        np.testing.assert_array_equal(out, mine)


@pytest.mark.mpi(min_size=2)
def test_no_rank_goes_on_before_a_mismatched_guessed_write_is_taken_back(
    comm, mpi_tmp_path, monkeypatch
):
    """Rank 0 syncs while the others append past the end; the others' take-back is slow.
    Rank 0 must not leave the failed call before it is done: its next (guessed) write
    would land where the take-back then cuts the file."""
    import time

    from collio import speculate

    path = str(mpi_tmp_path / "late.bin")
    p, r = comm.size, comm.rank
    want = np.zeros(5 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 4)
        assert f.stats.last_call["guessed"]
        if r > 0:
            slow = speculate.after_mismatch

            def late(*args):
                time.sleep(0.3)
                slow(*args)

            monkeypatch.setattr(speculate, "after_mismatch", late)
        with pytest.raises(collio.MismatchError):  # (no gather after it: nothing waits)
            if r == 0:
                f.sync()
            else:
                f.write_at_all((4 * p + r) * N, _data(4, r))
        monkeypatch.undo()
        _append(f, comm, want, 1, first=4)  # step 4 again, at once, on every rank
    _same_file(comm, path, want)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("odd", ["object array", "huge offset"])
def test_a_repeat_that_cannot_take_the_short_way_on_one_rank_is_agreed(comm, mpi_tmp_path, odd):
    """A repeated call through the view whose buffer or offset the short way cannot
    handle on one rank (an object array of the same size, an offset past int64) takes
    the general way there, whose checks agree on the error; nothing is written."""
    path = str(mpi_tmp_path / "odd.bin")
    p, r, bad = comm.size, comm.rank, comm.size - 1
    want = np.zeros(4 * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _append(f, comm, want, 4)
        data, at = _data(4, r), (4 * p + r) * N
        if r == bad and odd == "object array":
            data = np.empty(N // 8, dtype=object)  # (as many bytes, on 64-bit)
        elif r == bad:
            at = 2**64
        raises_everywhere(comm, collio.CollioError, lambda: f.write_at_all(at, data))
        _same_file(comm, path, want)
        _rewrite(f, comm, want, 4, seed=200)  # (the file still works: new bytes)
    _same_file(comm, path, want)


@pytest.mark.mpi(min_size=2)
def test_guessed_writes_taken_back_before_the_shuffle_the_head_chose(
    comm, mpi_tmp_path, monkeypatch
):
    """A series whose steps leave a gap of H bytes before their blocks; at its fifth
    step the others guess (moved by the same shift), and the last rank writes its step
    in two halves, in the gap before everybody's blocks and after them (legal,
    interleaved: the head chooses the shuffle).  Every guessing rank takes its write
    back (to the file's size before the call) before the shuffle, and the shuffle
    writes every byte.  (The shuffle writes the bytes the guesses wrote, so the file
    alone cannot show the take-back: the backend's own take_back is watched, and it
    still does the work.)"""
    from collio import layouts

    path = str(mpi_tmp_path / "mixed.bin")
    p, r, last = comm.size, comm.rank, comm.size - 1
    H = N // 2
    S = p * N + H  # (a step: its gap, then every rank's block)
    want = np.zeros(5 * S, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        # (a series through layouts: write_at_all beside write_all is a mismatch)
        for s in range(4):
            f.write_all(_data(s, r), layouts.Segments([s * S + H + r * N], [N]))
            for q in range(p):
                want[s * S + H + q * N : s * S + H + (q + 1) * N] = _data(s, q)
        guessed = f.stats.last_call["guessed"]
        base = 4 * S
        mine = _data(4, r)
        taken, real = [], f.backend.take_back

        def watched(kept, size):
            taken.append((size, kept is not None and kept.size))
            real(kept, size)

        monkeypatch.setattr(f.backend, "take_back", watched)
        if r < last:  # (its step, moved as always: guessed)
            f.write_all(mine, layouts.Segments([base + H + r * N], [N]))
        else:  # its halves in the gap before the others' blocks and after them
            halves = layouts.Segments([base, base + H + (p - 1) * N], [H, H])
            f.write_all(mine, halves)
        monkeypatch.undo()
        done = f.stats.last_call
        st = f.stats.as_dict()
    for q in range(p):
        data = _data(4, q)
        if q < last:
            want[base + H + q * N : base + H + (q + 1) * N] = data
        else:
            want[base : base + H] = data[:H]
            want[base + H + (p - 1) * N : base + (p - 1) * N + 2 * H] = data[H:]
    every = comm.allgather(taken)
    assert guessed and done["path"] == "two-phase" and not done["guessed"]
    # each guessing rank took back what it kept, once, to the size before the call (what
    # it kept, the file's size before its write, may count the others' guesses already);
    # the last rank's new layout guessed nothing
    assert [[size for size, _ in got] for got in every] == [[base]] * last + [[]]
    assert all(kept >= base for got in every for _, kept in got)
    assert st["bytes_written"] == 5 * p * N
    _same_file(comm, path, want[: base + H + (p - 1) * N + H])


def _rows_step(comm, s, rows, cols, *, at=None):
    """Step ``s`` of a series of one global array (``rows`` rows per rank but rank 0's,
    which holds an empty piece) at a new offset each step: this rank's piece, its layout
    (``at``: another offset) and the global array."""
    p, r = comm.size, comm.rank
    shape = ((p - 1) * rows, cols)
    glob = np.arange(shape[0] * cols, dtype=np.float64).reshape(shape) + 1000.0 * s
    start, n = (0, 0) if r == 0 else ((r - 1) * rows, rows)
    offset = s * glob.nbytes if at is None else at
    lay = collio.layouts.Subarray(shape, (start, 0), (n, cols), np.float64, offset=offset)
    return np.ascontiguousarray(glob[start : start + n]), lay, glob


@pytest.mark.mpi(min_size=2)
def test_a_series_of_array_layouts_guesses_and_the_head_still_compares_offsets(comm, mpi_tmp_path):
    """A time series through layouts (one global array, a new offset each step) is
    guessed from its third call; a rank whose layout says another offset, though its
    (empty) piece lets it guess, makes every rank raise, and every guessed write is
    taken back."""
    path, theirs = str(mpi_tmp_path / "rows.bin"), str(mpi_tmp_path / "romio.bin")
    rows, cols, steps = 4, 64, 6
    parts, guessed = [], []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, glob = _rows_step(comm, s, rows, cols)
            f.write_all(piece, lay)
            guessed.append(f.stats.last_call["guessed"])
            romio_write(theirs, piece, lay, comm)
            parts.append(glob.tobytes())
        want = np.frombuffer(b"".join(parts), np.uint8)
        piece, lay, glob = _rows_step(comm, steps, rows, cols)
        if comm.rank == 0:  # (an empty piece moved alike: only the offset differs)
            piece, lay, _ = _rows_step(comm, steps, rows, cols, at=(steps + 1) * glob.nbytes)
        err = raises_everywhere(
            comm, collio.MismatchError, lambda: f.write_all(piece, lay),
            match="ranks disagree on the global array",
        )  # fmt: skip
        assert str(err).startswith("write_all: ranks disagree"), str(err)
        _same_file(comm, path, want)
        for s in range(steps, steps + 3):  # (the series goes on)
            piece, lay, glob = _rows_step(comm, s, rows, cols)
            f.write_all(piece, lay)
            parts.append(glob.tobytes())
        out = np.empty_like(piece)
        f.read_all(lay, out=out)
        np.testing.assert_array_equal(out, piece)
    assert guessed == [False, False] + [True] * (steps - 2)
    _same_file(comm, path, np.frombuffer(b"".join(parts), np.uint8))
    assert read_file(theirs) == want.tobytes()


class _Tagged(collio.layouts.Subarray):
    """A user's layout whose signature holds an array."""

    __slots__ = ()

    def signature(self):
        return (np.arange(3), self.global_shape, self.dtype.str, self.order, self.offset)


@pytest.mark.mpi(min_size=2)
def test_a_signature_holding_an_array_fails_agreed(comm, mpi_tmp_path):
    """A user's layout whose signature holds an array writes; one rank's bad piece
    makes every rank raise its error (none is left waiting in the head)."""
    path = str(mpi_tmp_path / "tagged.bin")
    p, r = comm.size, comm.rank
    lay = _Tagged((p, 4), (r, 0), (1, 4), np.float64)
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.full((1, 4), float(r)), lay)
        bad = np.full((1, 4), r, np.float32 if r == 0 else np.float64)
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_all(bad, lay),
            match="rank 0: data dtype float32 does not match layout dtype float64",
        )  # fmt: skip
    comm.Barrier()
    want = np.repeat(np.arange(p, dtype=np.float64), 4)
    np.testing.assert_array_equal(np.frombuffer(read_file(path), np.float64), want)
