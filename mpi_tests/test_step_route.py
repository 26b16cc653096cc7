"""A repeat of a step goes from the public method straight to it (``File._stepped``).

``write_all`` / ``read_all`` / ``write_at_all`` / ``read_at_all`` of a file whose last
call left a :class:`collio.quick.Step` call it without the layers between (the
one-thread guard's wrapper, ``_check_open``, the engine's entry, the lanes' lookups),
doing their part inline.  These tests check that the route is taken (the functions the
call ran), that what it writes and reads is numpy's and ROMIO's, and that it still makes
the checks it must: a closed file raises what it raised, a second thread on the
communicator still raises at once and writes nothing, and this thread's own call in
another's goes the guarded way.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import collio_calls, mismatch_message, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import layouts, quick
from collio.layouts import Subarray
from collio.testing.romio import romio_read, romio_write

pytestmark = pytest.mark.mpi(min_size=1)

_GUARDED = {"wrapper", "_check_open", "layout_again", "again"}


def _routed(seen):
    """Whether a call went straight to its step (and the step completed it): a
    ``read_all`` through a layout by ``File._read_stepped``, any other by ``_stepped``; a
    mapped read's step by ``Step._read_mapped``, any other by ``Step._go``."""
    route = "_stepped" in seen or "_read_stepped" in seen
    step = "_go" in seen or "_read_mapped" in seen or "_read_rows" in seen
    return route and step and not (_GUARDED & seen)


def _piece(comm, s, n):
    p, r = comm.size, comm.rank
    glob = np.arange(p * n, dtype=np.float64) + 1000.0 * s + 0.25
    lay = Subarray((p * n,), (r * n,), (n,), "<f8", offset=s * glob.nbytes)
    return glob[r * n : (r + 1) * n].copy(), lay, glob.tobytes()


@pytest.mark.parametrize("n", [1, 512])
def test_a_series_goes_straight_to_its_step_and_writes_what_romio_does(comm, mpi_tmp_path, n):
    path, theirs = str(mpi_tmp_path / "s.bin"), str(mpi_tmp_path / "romio.bin")
    steps, routed, want = 8, [], b""
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, whole = _piece(comm, s, n)
            seen, got = collio_calls(lambda: f.write_all(piece, lay))  # noqa: B023
            assert got is None
            routed.append(_routed(seen))
            romio_write(theirs, piece, lay, comm)
            want += whole
        assert f.stats.last_call["guessed"]
    # (the third call makes the step: from the fourth the route takes it)
    assert routed == [False] * 3 + [True] * (steps - 3)
    comm.Barrier()
    assert read_file(path) == want
    assert read_file(theirs)[: len(want)] == want
    comm.Barrier()
    routed, routed_fresh = [], []
    with collio.open(path, "r", comm=comm) as f:
        for s in list(range(steps)) + [2, 7]:
            piece, lay, _ = _piece(comm, s, n)
            out = np.full_like(piece, np.nan)
            seen, got = collio_calls(lambda: f.read_all(lay, out=out))  # noqa: B023
            assert got is out
            routed.append(_routed(seen))
            np.testing.assert_array_equal(out, piece)
            np.testing.assert_array_equal(out, romio_read(theirs, lay, comm))
            # (a read without ``out``: a new array, by the route too)
            seen, fresh = collio_calls(lambda: f.read_all(lay))  # noqa: B023
            routed_fresh.append(_routed(seen))
            np.testing.assert_array_equal(fresh, piece)
    assert routed[3:] == [True] * (len(routed) - 3)
    assert routed_fresh[3:] == [True] * (len(routed_fresh) - 3)


def test_a_view_series_goes_straight_to_its_step_and_moves_the_pointer(comm, mpi_tmp_path):
    """``write_all(buf)`` through a view moves the file pointer as the guarded way does;
    ``write_at_all`` / ``read_at_all`` / ``read_all(buf)`` take the route too."""
    path, theirs = str(mpi_tmp_path / "v.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, n, disp, steps = comm.size, comm.rank, 16, 40, 7
    routed = []

    def data(s):
        return np.arange(n, dtype=np.float64) + 100.0 * s + 10000.0 * r

    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(disp, MPI.DOUBLE, MPI.DOUBLE)
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(disp, MPI.DOUBLE, MPI.DOUBLE)
        for s in range(steps):
            seen, _ = collio_calls(lambda: f.write_at_all((s * p + r) * n, data(s)))  # noqa: B023
            routed.append(_routed(seen))
            fh.Write_at_all((s * p + r) * n, data(s))
        # a rank's own region after the others': through the pointer of its own view
        base = disp + steps * p * n * 8
        f.set_view(base + r * steps * n * 8, MPI.DOUBLE, MPI.DOUBLE)
        fh.Set_view(base + r * steps * n * 8, MPI.DOUBLE, MPI.DOUBLE)
        for s in range(steps):
            seen, _ = collio_calls(lambda: f.write_all(data(s)))  # noqa: B023
            routed.append(_routed(seen))
            assert f.position == (s + 1) * n
            fh.Write_all(data(s))
    fh.Close()
    assert routed[3:steps] == [True] * (steps - 3)
    assert routed[steps + 3 :] == [True] * (steps - 3)
    comm.Barrier()
    got, want = read_file(path), read_file(theirs)
    size = disp + 2 * steps * p * n * 8
    assert len(got) == size and got[disp:] == want[disp:size]
    routed = []
    with collio.open(path, "r", comm=comm) as f:
        f.set_view(disp, MPI.DOUBLE, MPI.DOUBLE)
        out = np.empty(n)
        for s in range(steps):
            seen, back = collio_calls(lambda: f.read_at_all((s * p + r) * n, out))  # noqa: B023
            assert back is out
            routed.append(_routed(seen))
            np.testing.assert_array_equal(out, data(s))
        f.set_view(base + r * steps * n * 8, MPI.DOUBLE, MPI.DOUBLE)
        for s in range(steps):
            seen, back = collio_calls(lambda: f.read_all(out))  # noqa: B023
            assert back is out and f.position == (s + 1) * n
            routed.append(_routed(seen))
            np.testing.assert_array_equal(out, data(s))
    assert routed[3:steps] == [True] * (steps - 3)
    assert routed[steps + 3 :] == [True] * (steps - 3)


def _series(f, comm, steps, n=4):
    """Write ``steps`` steps through ``f`` (a step kept after them); the last layout."""
    for s in range(steps):
        piece, lay, _ = _piece(comm, s, n)
        f.write_all(piece, lay)
    assert isinstance(f._ctx.kept[True].step, quick.Step)
    return n


def test_a_call_after_close_raises_what_the_guarded_way_raises(comm, mpi_tmp_path):
    """The file closed with a step kept: every method raises the ModeError of a closed
    file, and writes nothing."""
    path = str(mpi_tmp_path / "c.bin")
    f = collio.open(path, "w", comm=comm)
    n = _series(f, comm, 6)
    f.set_view(0, MPI.BYTE, MPI.BYTE)
    piece, lay, _ = _piece(comm, 6, n)
    f.close()
    comm.Barrier()
    size = len(read_file(path))
    comm.Barrier()
    calls = [
        lambda: f.write_all(piece, lay), lambda: f.read_all(lay, out=piece),
        lambda: f.write_all(piece), lambda: f.read_all(piece),
        lambda: f.write_at_all(0, piece), lambda: f.read_at_all(0, piece),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(collio.ModeError, match="is closed"):
            call()
    comm.Barrier()
    assert len(read_file(path)) == size


@pytest.mark.timeout(90)
def test_a_second_thread_still_raises_at_once_and_writes_nothing(comm, mpi_tmp_path):
    """While another thread is in a call on the communicator, a repeat that the route
    would take raises ConcurrentCallError at once, naming both calls, and writes
    nothing; the series goes on by its step after."""
    path = str(mpi_tmp_path / "t.bin")
    with collio.open(path, "w", comm=comm) as f:
        n = _series(f, comm, 6)
        piece, lay, whole = _piece(comm, 6, n)
        m = 64
        block = layouts.Segments([len(whole) * 8 + comm.rank * m], [m])

        class Blocking(layouts.Segments):
            def runs(self):
                entered.set()
                go.wait(20)
                return super().runs()

        entered, go = threading.Event(), threading.Event()
        held = Blocking(list(block.offsets), list(block.lengths))
        errors = []

        def first():
            try:
                f.write_all(np.full(m, comm.rank + 1, np.uint8), held)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=first, name="holder")
        t.start()
        assert entered.wait(20)
        t0 = time.monotonic()
        seen = set()
        for call in (lambda: f.write_all(piece, lay), lambda: f.read_all(lay, out=piece)):
            with pytest.raises(collio.ConcurrentCallError) as info:
                collio_calls(call, seen)
            assert "while thread 'holder' is in write_all on the same communicator" in str(
                info.value
            )
        assert not {"_go", "_read_mapped"} & seen  # (nothing done: no I/O, no head)
        assert time.monotonic() - t0 < 5
        go.set()
        t.join(60)
        assert not t.is_alive() and errors == []
        comm.Barrier()
        assert len(read_file(path)) == len(whole) * 8 + comm.size * m  # (not step 6's)
        comm.Barrier()
        # the series goes on; step 6 now
        f.write_all(piece, lay)
        f.write_all(*_piece(comm, 7, n)[:2])
    comm.Barrier()
    got = read_file(path)
    want = b"".join(_piece(comm, s, n)[2] for s in range(8))
    assert got[: len(whole) * 6] == want[: len(whole) * 6]
    assert got[len(whole) * 6 : len(whole) * 8] == want[len(whole) * 6 :]
    tail = np.frombuffer(got[len(whole) * 8 :], np.uint8)
    np.testing.assert_array_equal(tail, np.repeat(np.arange(1, comm.size + 1, dtype=np.uint8), m))


def test_this_threads_own_call_in_another_goes_the_guarded_way(comm, mpi_tmp_path):
    """A call this thread makes inside one of its own (the guard's depth) is not the
    route's: it goes the guarded way, and the guard is left as it was found."""
    from collio import comms

    path = str(mpi_tmp_path / "d.bin")
    with collio.open(path, "w", comm=comm) as f:
        n = _series(f, comm, 6)
        piece, lay, whole = _piece(comm, 6, n)
        key = f.comm.py2f()
        with comms.exclusive(f.comm, "outer"):
            seen, _ = collio_calls(lambda: f.write_all(piece, lay))
            assert "wrapper" in seen and "_go" in seen  # (guarded, then the step)
            assert comms._busy[key][1:] == ("outer", 1)
        assert key not in comms._busy
        seen, _ = collio_calls(lambda: f.write_all(*_piece(comm, 7, n)[:2]))
        assert _routed(seen) and key not in comms._busy
    comm.Barrier()
    want = b"".join(_piece(comm, s, n)[2] for s in range(8))
    assert read_file(path) == want


@pytest.mark.parametrize("mapped", [False, True])
def test_a_large_repeated_read_is_one_preadv_or_copied_from_the_map(
    comm, mpi_tmp_path, monkeypatch, mapped
):
    """Reads of 2 MiB per rank (above a few small runs' preads): one run up to
    ``ONE_PREAD_BYTES`` is one preadv into the array, asking the file's size never in
    the lane; above it (``mapped``: the threshold lowered to 1 MiB), the lane copies
    each from the mapped file after asking the size once.  The bytes are numpy's and
    ROMIO's, the mapped bytes counted, and a step reaching past the end reads zeros
    there, as ROMIO does."""
    from collio.backends import filereads

    if mapped:  # (the same path as a read above 8 MiB, at a size a test can afford)
        monkeypatch.setattr(filereads, "ONE_PREAD_BYTES", filereads.PREAD_BYTES)
        monkeypatch.setattr(quick, "ONE_PREAD_BYTES", filereads.PREAD_BYTES)
    path = str(mpi_tmp_path / "m.bin")
    n = (filereads.PREAD_BYTES << 1) // 8
    assert filereads.preads(1, n * 8) is not mapped
    steps = 6
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, _ = _piece(comm, s, n)
            f.write_all(piece, lay)
    comm.Barrier()
    sizes, routes = [], []
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        be = f._ctx.backend
        size = be.size
        asked = []

        def counted():
            asked.append(1)
            return size()

        be.size = counted  # (counts the lseeks that ask the end, and asks it)
        try:
            for s in list(range(steps)) + [1, steps]:  # (the last step: past the end)
                piece, lay, _ = _piece(comm, s, n)
                want = piece if s < steps else np.zeros_like(piece)
                out = np.full_like(piece, np.nan)
                before, asked[:] = f.stats.mapped_bytes, []
                seen, _ = collio_calls(lambda: f.read_all(lay, out=out))  # noqa: B023
                sizes.append((len(asked), f.stats.mapped_bytes - before))
                routes.append(_routed(seen))
                np.testing.assert_array_equal(out, want)
                if s < steps:
                    np.testing.assert_array_equal(out, romio_read(path, lay, comm))
        finally:
            del be.size
    whole = comm.size * n * 8
    # from the fourth call (the lane's): the map's copy after one question of the size,
    # or one preadv and no question
    lane = [(1, whole)] if mapped else [(0, 0)]
    assert sizes[3 : steps + 1] == lane * (steps - 2)
    assert sizes[-1][1] == 0  # (past the end: not from the map)
    if not mapped:  # (the preadv's: the step's own, straight from the public method)
        assert routes[3 : steps + 1] == [True] * (steps - 2)


def test_a_layout_after_a_view_series_goes_the_general_way(comm, mpi_tmp_path):
    """The step a view series left is not a layout's: a Subarray write after it (and a
    view write after that) write what numpy says."""
    path = str(mpi_tmp_path / "vl.bin")
    p, r, n, steps = comm.size, comm.rank, 8, 6
    want = bytearray()

    def data(s, q=r):
        return np.arange(n, dtype=np.float64) + 100.0 * s + 10000.0 * q

    def step_bytes(s):
        return b"".join(data(s, q).tobytes() for q in range(p))

    with collio.open(path, "w", comm=comm) as f:
        f.set_view(0, MPI.DOUBLE, MPI.DOUBLE)
        for s in range(steps):
            f.write_at_all((s * p + r) * n, data(s))
            want += step_bytes(s)
        assert f._ctx.kept[True].step.k.box is None
        piece, lay, whole = _piece(comm, 0, n)
        lay = Subarray((p * n,), (r * n,), (n,), "<f8", offset=len(want))
        seen, _ = collio_calls(lambda: f.write_all(piece, lay))
        assert not _routed(seen)
        want += whole
        f.write_at_all((steps * p + r) * n + p * n, data(steps))
        want += step_bytes(steps)
    comm.Barrier()
    assert read_file(path) == bytes(want)


def test_an_explicit_none_layout_after_a_view_series_raises_as_the_guarded_way(comm, mpi_tmp_path):
    """``write_all(buf, None)`` and ``read_all(None, out)`` are errors (an explicit None
    is no layout; the view is taken only when none is given): after a series through
    the view left a step at the pointer's position, they still raise the same
    LayoutError on every rank, naming every rank, and write (read) nothing."""
    path = str(mpi_tmp_path / "none.bin")
    p, r, n = comm.size, comm.rank, 16
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(8 * n * r, MPI.DOUBLE, MPI.DOUBLE)  # (each rank's position 0 its own)
        for s in range(6):
            f.write_at_all(0, np.full(n, s, np.float64))
            f.read_at_all(0, np.empty(n))
        f.sync()
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        shown = "; ".join(
            f"rank {k}: layout must be a collio layout, not NoneType" for k in range(p)
        )
        with pytest.raises(collio.LayoutError) as info:
            f.write_all(np.full(n, 99.0), None)
        assert str(info.value) == f"write_all: {shown}"
        out = np.full(n, -1.0)
        shown = "; ".join(f"rank {k}: no buffer given" for k in range(p))
        with pytest.raises(collio.LayoutError) as info:
            f.read_all(None, out)
        assert str(info.value) == f"read_all: {shown}"
        assert (out == -1.0).all()
        f.sync()
        comm.Barrier()
        assert read_file(path) == before
        comm.Barrier()
        f.write_at_all(0, np.full(n, 7, np.float64))  # (the file usable after)
    comm.Barrier()
    got = np.frombuffer(read_file(path), np.float64)
    assert got.tobytes() == np.full(p * n, 7, np.float64).tobytes()


def test_a_mapped_read_series_goes_to_its_read_step_and_errors_stay_agreed(comm, mpi_tmp_path):
    """A time series' small reads through a layout go from ``read_all`` straight to the
    step's read of the mapped file (``File._read_stepped``, ``Step._read_mapped``) and
    read what ROMIO reads.  A repeat that one rank cannot take (a read-only ``out``, a
    layout past every real size) raises the same error on every rank, naming the rank,
    and the series goes on by the route after it."""
    path = str(mpi_tmp_path / "r.bin")
    p, r, n, steps = comm.size, comm.rank, 512, 8
    if r == 0:
        with open(path, "wb") as fh:
            fh.write(b"".join(_piece(comm, s, n)[2] for s in range(steps)))
    comm.Barrier()
    bad = p - 1
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        routed = []
        for s in range(steps):
            piece, lay, _ = _piece(comm, s, n)
            out = np.full_like(piece, np.nan)
            seen, got = collio_calls(lambda: f.read_all(lay, out=out))  # noqa: B023
            assert got is out
            routed.append(_routed(seen) and "_read_mapped" in seen)
            np.testing.assert_array_equal(out, piece)
            np.testing.assert_array_equal(out, romio_read(path, lay, comm))
            assert f.stats.last_call["path"] == "mapped"
        assert routed[3:] == [True] * (steps - 3)
        # one rank's read-only ``out`` in a repeat: the same error everywhere
        piece, lay, _ = _piece(comm, 2, n)
        out = np.full_like(piece, np.nan)
        if r == bad:
            out.flags.writeable = False
        raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay, out=out),
                          match=f"rank {bad}")  # fmt: skip
        # one rank's bad layout (a negative offset) in a repeat: agreed too
        neg = Subarray(lay.global_shape, lay.start, lay.shape, "<f8", offset=-8)
        mine = neg if r == bad else lay
        raises_everywhere(comm, collio.CollioError,
                          lambda: f.read_all(mine, out=np.empty_like(piece)),
                          match=f"rank {bad}")  # fmt: skip
        # the file is usable: the series goes on, by the route again
        routed = []
        for s in range(steps):
            piece, lay, _ = _piece(comm, s, n)
            out = np.full_like(piece, np.nan)
            seen, _ = collio_calls(lambda: f.read_all(lay, out=out))  # noqa: B023
            routed.append(_routed(seen) and "_read_mapped" in seen)
            np.testing.assert_array_equal(out, piece)
        assert routed[3:] == [True] * (steps - 3)


def _columns(comm, s, order="C", rows=64, cols=8):
    """Rank r's column block of step ``s``: a (rows, cols * (p + 1)) float64 matrix in C
    order from byte ``s`` steps in, rank r's ``rows`` runs interleaved with the others'
    (the size sweep's strided pattern; a block more that no rank reads, so that one
    rank's runs are rows too); in Fortran order its transpose, rank r's row block.  Its
    piece, its layout and the step's bytes."""
    p, r = comm.size, comm.rank
    glob = np.arange(rows * cols * (p + 1), dtype=np.float64).reshape(rows, -1) + 1e5 * s + 0.5
    if order == "F":
        glob = np.asfortranarray(glob.T)
        lay = Subarray(glob.shape, (r * cols, 0), (cols, rows), "<f8", order="F",
                       offset=s * glob.nbytes)  # fmt: skip
        piece = np.asfortranarray(glob[r * cols : (r + 1) * cols])
        return piece, lay, glob.tobytes(order="F")
    lay = Subarray(glob.shape, (0, r * cols), (rows, cols), "<f8", offset=s * glob.nbytes)
    return np.ascontiguousarray(glob[:, r * cols : (r + 1) * cols]), lay, glob.tobytes()


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_strided_read_series_goes_to_its_rows_step_and_errors_stay_agreed(
    comm, mpi_tmp_path, monkeypatch, order
):
    """A time series' small strided reads (64 runs per rank, column blocks interleaved
    across ranks) go from ``read_all`` straight to the step's read of the rows
    (``Step._read_rows``: one pread of their extent, one copy of the rows) and read what
    ROMIO reads, into ``out`` or a new array, forwards and back.  A step reaching past
    the end of the file reads zeros there, the general way.  A repeat that one rank
    cannot take (a read-only ``out``, a negative offset, another global array) or
    another call on one rank raises the same error on every rank, naming the rank, and
    the series goes on by the route after it."""
    from collio.backends import filereads

    path = str(mpi_tmp_path / "cols.bin")
    p, r, steps, bad = comm.size, comm.rank, 8, comm.size - 1
    if r == 0:
        with open(path, "wb") as fh:
            fh.write(b"".join(_columns(comm, s, order)[2] for s in range(steps)))
    comm.Barrier()

    def series(which):
        routed = []
        for s in which:
            piece, lay, _ = _columns(comm, s, order)
            out = np.full_like(piece, np.nan)
            seen, got = collio_calls(lambda: f.read_all(lay, out=out))  # noqa: B023
            assert got is out
            routed.append(_routed(seen) and "_read_rows" in seen)
            np.testing.assert_array_equal(out, piece)
            assert f.stats.last_call["path"] == "mapped"
        return routed

    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        be = f._ctx.backend
        size, asked = be.size, []

        def counted():
            asked.append(1)
            return size()

        be.size = counted  # (the step asks no size: the pread tells it)
        try:
            routed = series(list(range(steps)) + [5, 2, 7])
            assert routed[3:] == [True] * (len(routed) - 3)
            before, asked[:] = f.stats.mapped_bytes, []
            for s in range(steps):
                piece, lay, _ = _columns(comm, s, order)
                seen, fresh = collio_calls(lambda: f.read_all(lay))  # noqa: B023
                assert _routed(seen) and "_read_rows" in seen
                np.testing.assert_array_equal(fresh, piece)
                np.testing.assert_array_equal(fresh, romio_read(path, lay, comm))
            assert asked == []
            assert f.stats.mapped_bytes - before == steps * p * piece.nbytes
        finally:
            del be.size
        # past the end: zeros there, as ROMIO reads them
        piece, lay, _ = _columns(comm, steps, order)
        seen, got = collio_calls(lambda: f.read_all(lay))
        assert not _routed(seen)
        np.testing.assert_array_equal(got, np.zeros_like(piece))
        assert series(range(4)) == [False, False, True, True]  # (a call of its own between)
        # one rank's read-only ``out`` in a repeat: the same error everywhere
        piece, lay, _ = _columns(comm, 2, order)
        out = np.full_like(piece, np.nan)
        if r == bad:
            out.flags.writeable = False
        raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay, out=out),
                          match=f"rank {bad}")  # fmt: skip
        assert series(range(4)) == [True] * 4
        # one rank's negative offset
        neg = Subarray(lay.global_shape, lay.start, lay.shape, "<f8", order=order, offset=-8)
        mine = neg if r == bad else lay
        raises_everywhere(comm, collio.CollioError,
                          lambda: f.read_all(mine, out=np.empty_like(piece)),
                          match=f"rank {bad}")  # fmt: skip
        assert series(range(4)) == [True] * 4

        # one rank's read fails: agreed, named
        def failing(*args):
            raise OSError(5, "injected read error")

        if r == bad:
            monkeypatch.setattr(filereads, "pread_zeros", failing)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay))
        monkeypatch.undo()
        assert f"rank {bad}" in str(err) and "injected read error" in str(err)
        assert series(range(4)) == [True] * 4

        # one rank cannot make the gather buffer the step views again: agreed, named
        def no_memory(nbytes):
            raise MemoryError("injected: no memory for the gather buffer")

        if r == bad:
            be._gather = None
            monkeypatch.setattr(be, "_gather_buffer", no_memory)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay))
        monkeypatch.undo()
        assert f"rank {bad}" in str(err) and "no memory for the gather buffer" in str(err)
        assert series(range(4)) == [True] * 4
        if p == 1:
            return
        # one rank's other global array (a column more)
        wider = tuple(n + (k == 1) for k, n in enumerate(lay.global_shape))
        other = Subarray(wider, lay.start, lay.shape, "<f8", order=order, offset=lay.offset)
        mine = other if r == bad else lay
        raises_everywhere(comm, collio.MismatchError, lambda: f.read_all(mine),
                          match="ranks disagree on the global array")  # fmt: skip
        assert series(range(4)) == [True] * 4
        # one rank in another call: a MismatchError on every rank
        call = f.sync if r == 0 else (lambda: f.read_all(lay))
        raises_everywhere(comm, collio.MismatchError, call,
                          match=mismatch_message(comm, "sync", "read_all"))  # fmt: skip
        assert series(range(4)) == [True] * 4


def test_a_strided_read_step_without_a_typed_view_copies_the_rows_as_bytes(
    comm, mpi_tmp_path, monkeypatch
):
    """Where the rows have no view as the array's elements (``quick._typed`` None), the
    step copies them as bytes (``Rows.copy``'s copy) and reads what numpy reads."""
    monkeypatch.setattr(quick, "_typed", lambda *args: None)
    path = str(mpi_tmp_path / "bytes.bin")
    steps = 6
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"".join(_columns(comm, s)[2] for s in range(steps)))
    comm.Barrier()
    routed = []
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        for s in list(range(steps)) + [3, 1]:
            piece, lay, _ = _columns(comm, s)
            seen, got = collio_calls(lambda: f.read_all(lay))  # noqa: B023
            routed.append("_read_rows" in seen)
            np.testing.assert_array_equal(got, piece)
        assert f._ctx.kept[False].step.typed is None
    assert routed[3:] == [True] * (len(routed) - 3)
