"""Ranks making different collective ``collio.h5`` calls: the same error everywhere, no hang.

Rank 0 makes one call on an HDF5 file while the other ranks make another (a dataset
write beside a flush, a close, a read, a write of another dataset; an open beside a
call on an open file).  As with :class:`collio.File`, every such call starts with
the same nonblocking allreduce (``collio.collective.call_head``) naming the call, the
file and the dataset, so every rank raises the same ``MismatchError`` naming each
rank's call.  Afterwards the file is in the same state on every rank: closed
everywhere, its metadata written and its bytes synced as a normal close does, when
some rank called close; else open and usable (nothing was written or published, and
the next call made alike on every rank works).  Files are checked with stock h5py in
a separate process.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import layouts

h5py = pytest.importorskip("h5py")
from h5check import check_file  # noqa: E402
from helpers import local_piece, mismatch_message, raises_everywhere, reference  # noqa: E402

import collio.h5  # noqa: E402  - after the importorskip
from collio.h5.session import session_of  # noqa: E402

SHAPE = (16, 12)
STORAGE = {"contiguous": {}, "chunked": {"chunks": (5, 4), "compression": "gzip"}}
LABELS = {
    "write_x": "write_all of dataset '/x'",
    "write_y": "write_all of dataset '/y'",
    "read_x": "read_all of dataset '/x'",
    "flush": "flush",
    "close": "close",
}


def _box(comm):
    """This rank's block of rows of SHAPE (empty on ranks past the end)."""
    return layouts.block(SHAPE, "<f8", comm=comm, grid=(comm.size, 1))


def _piece(comm, glob):
    return local_piece(glob, _box(comm))


def _call(name, f, comm):
    """The collio.h5 call ``name`` on the file ``f``, as a program would make it."""
    zeros = np.zeros(SHAPE)
    if name in ("write_x", "write_y"):
        dset = f[name[-1]]
        return lambda: collio.h5.write_all(dset, _piece(comm, zeros), _box(comm))
    if name == "read_x":
        return lambda: collio.h5.read_all(f["x"], _box(comm))
    if name == "flush":
        return lambda: collio.h5.flush(f)
    assert name == "close"
    return lambda: collio.h5.close(f)


def _mismatch(comm, f, first, rest):
    """Rank 0 calls ``first``, the others ``rest``: the same MismatchError everywhere."""
    err = raises_everywhere(
        comm, collio.MismatchError, _call(first if comm.rank == 0 else rest, f, comm)
    )
    assert str(err) == mismatch_message(comm, LABELS[first], LABELS[rest])
    assert err.call_mismatch and err.one_file
    calls = tuple(LABELS[c].split()[0] for c in (first,) + (rest,) * (comm.size - 1))
    assert err.calls == calls
    assert err.ranks == tuple(range(1, comm.size))
    assert err.close_error is None
    return err


def _closed_everywhere(comm, f, session):
    """The h5py file is closed on every rank and collio let go of its descriptor (after
    publishing and fsyncing, as at a normal close); the data written was fsynced."""
    assert comm.allgather(bool(f.id.valid)) == [False] * comm.size
    with pytest.raises(collio.ModeError, match="is closed"):
        session.vfile  # noqa: B018 - raises once the descriptor is closed
    assert comm.allgather(not session.backend.dirty) == [True] * comm.size


PAIRS = [
    ("write_x", "flush"),
    ("flush", "write_x"),
    ("write_x", "close"),
    ("close", "write_x"),
    ("write_x", "write_y"),
    ("read_x", "write_x"),
    ("write_x", "read_x"),
    ("flush", "close"),
    ("close", "flush"),
    ("close", "read_x"),
    ("read_x", "flush"),
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize(("first", "rest"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_different_calls_raise_everywhere_and_the_file_goes_on(
    comm, mpi_tmp_path, first, rest, storage
):
    path = str(mpi_tmp_path / "m.h5")
    old_x, old_y, newer = (reference(SHAPE, "<f8", seed=s) for s in (1, 2, 3))
    box = _box(comm)
    f = collio.h5.File(path, "w", comm=comm)
    session = session_of(f)
    x = collio.h5.create_dataset(f, "x", SHAPE, "<f8", **STORAGE[storage])
    y = collio.h5.create_dataset(f, "y", SHAPE, "<f8", **STORAGE[storage])
    collio.h5.write_all(x, _piece(comm, old_x), box)
    collio.h5.write_all(y, _piece(comm, old_y), box)
    f.attrs["before"] = 1  # metadata of no collective call yet: written by the next one
    _mismatch(comm, f, first, rest)
    attrs = {"/": {"before": 1}}
    if "close" in (first, rest):
        _closed_everywhere(comm, f, session)
        collio.h5.close(f)  # idempotent, local: every rank is closed
        want_x = old_x
    else:
        # nothing was written, published or diverged: the same calls go on alike
        np.testing.assert_array_equal(collio.h5.read_all(f["x"], box), _piece(comm, old_x))
        collio.h5.write_all(f["x"], _piece(comm, newer), box)
        np.testing.assert_array_equal(collio.h5.read_all(f["x"], box), _piece(comm, newer))
        f.attrs["after"] = 2
        collio.h5.flush(f)
        collio.h5.close(f)
        _closed_everywhere(comm, f, session)
        attrs["/"]["after"] = 2
        want_x = newer
    check_file(comm, path, {"x": want_x, "y": old_y}, attrs)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("first", "rest"), [("close", "read_x"), ("flush", "read_x")])
def test_read_only_file(comm, mpi_tmp_path, first, rest):
    """A file opened in 'r': the same error everywhere; closed everywhere, or still read."""
    path = str(mpi_tmp_path / "r.h5")
    old = reference(SHAPE, "<f8", seed=4)
    if comm.rank == 0:
        with h5py.File(path, "w") as g:
            g["x"] = old
    comm.Barrier()
    f = collio.h5.File(path, "r", comm=comm)
    session = session_of(f)
    _mismatch(comm, f, first, rest)
    if first == "close":
        _closed_everywhere(comm, f, session)
    else:
        np.testing.assert_array_equal(collio.h5.read_all(f["x"], _box(comm)), _piece(comm, old))
        collio.h5.close(f)
    check_file(comm, path, {"x": old})


@pytest.mark.mpi(min_size=2)
def test_one_rank_leaves_a_with_block_early(comm, mpi_tmp_path):
    """Rank 0 leaves the ``with`` block (its close) while the others still write: every
    rank raises; the others' own close (their ``with``) finds the file closed, with what
    was written and declared before the mismatch in it."""
    path = str(mpi_tmp_path / "early.h5")
    old = reference(SHAPE, "<f8", seed=5)
    box = _box(comm)

    def program():
        with collio.h5.File(path, "w", comm=comm) as f:
            d = collio.h5.create_dataset(f, "x", SHAPE, "<f8")
            collio.h5.write_all(d, _piece(comm, old), box)
            d.attrs["units"] = "m"
            if comm.rank != 0:
                collio.h5.write_all(d, np.zeros_like(_piece(comm, old)), box)

    err = raises_everywhere(comm, collio.MismatchError, program)
    assert str(err) == mismatch_message(comm, "close", LABELS["write_x"])
    check_file(comm, path, {"x": old}, {"x": {"units": "m"}})


@pytest.mark.mpi(min_size=2)
def test_plain_h5py_file_closed_by_collio_h5_close(comm, mpi_tmp_path):
    """A plain ``h5py.File(..., driver='collio')``: ``collio.h5.close`` on rank 0 beside
    ``collio.h5.flush`` on the others closes it everywhere."""
    path = str(mpi_tmp_path / "plain.h5")
    old = reference(SHAPE, "<f8", seed=6)
    f = h5py.File(path, "w", driver="collio", comm=comm)
    session = session_of(f)
    d = f.create_dataset("x", SHAPE, "<f8")  # h5py's defaults: allocated at the first write
    collio.h5.write_all(d, _piece(comm, old), _box(comm))
    f["x"].attrs["n"] = 3
    _mismatch(comm, f, "close", "flush")
    _closed_everywhere(comm, f, session)
    check_file(comm, path, {"x": old}, {"x": {"n": 3}})


@pytest.mark.mpi(min_size=2)
def test_late_allocation_beside_flush(comm, mpi_tmp_path):
    """A dataset h5py allocates at its first write (not collio.h5.create_dataset's): the
    ranks writing it must not allocate it alone before learning that rank 0 flushes,
    or their metadata would differ from rank 0's at every later call."""
    path = str(mpi_tmp_path / "late.h5")
    new = reference(SHAPE, "<f8", seed=7)
    with collio.h5.File(path, "w", comm=comm) as f:
        f.create_dataset("x", SHAPE, "<f8")
        _mismatch(comm, f, "flush", "write_x")
        collio.h5.write_all(f["x"], _piece(comm, new), _box(comm))
        collio.h5.flush(f)
    check_file(comm, path, {"x": new})


def _labelled(name, path):
    """How the error names a call of rank ``name`` on the file at ``path`` when ranks
    called operations on different files."""
    label = LABELS[name]
    return f"{label} in {path!r}" if " of " in label else f"{label} of {path!r}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("opener", [0, 1])
@pytest.mark.parametrize("call", ["write_x", "flush", "close"])
def test_open_beside_a_call_on_an_open_file(comm, mpi_tmp_path, opener, call):
    """One side opens another HDF5 file on the communicator while the other side calls
    on an open one: every rank raises (calls on different files) before anything is
    created, and both sides go on; the open file is not closed, even beside a close."""
    path, other = (str(mpi_tmp_path / n) for n in ("open.h5", "other.h5"))
    new = reference(SHAPE, "<f8", seed=8)
    box = _box(comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", SHAPE, "<f8")
        opening = (comm.rank == 0) == (opener == 0)
        if opening:
            fn = lambda: collio.h5.File(other, "w", comm=comm)  # noqa: E731
        else:
            fn = _call(call, f, comm)
        err = raises_everywhere(comm, collio.MismatchError, fn)
        labels = [f"open of {other!r}", _labelled(call, path)]
        if opener != 0:
            labels.reverse()
        assert str(err) == mismatch_message(comm, *labels, files=True)
        assert err.call_mismatch and not err.one_file
        assert comm.allgather(bool(f.id.valid)) == [True] * comm.size
        collio.h5.write_all(d, _piece(comm, new), box)
    assert not os.path.exists(other)
    check_file(comm, path, {"x": new})


@pytest.mark.mpi(min_size=2)
def test_h5_write_beside_a_collio_file_write(comm, mpi_tmp_path):
    """Files of collio.open and collio.h5 on one communicator are numbered by the same
    counter: rank 0 writing one beside the others writing the other is a call on
    different files, and both files go on."""
    h5path, binpath = (str(mpi_tmp_path / n) for n in ("a.h5", "b.bin"))
    new = reference(SHAPE, "<f8", seed=9)
    box = _box(comm)
    with collio.h5.File(h5path, "w", comm=comm) as f, collio.open(binpath, "w", comm=comm) as b:
        d = collio.h5.create_dataset(f, "x", SHAPE, "<f8")
        if comm.rank == 0:
            fn = lambda: b.write_all(_piece(comm, new), box)  # noqa: E731
        else:
            fn = lambda: collio.h5.write_all(d, _piece(comm, new), box)  # noqa: E731
        err = raises_everywhere(comm, collio.MismatchError, fn)
        shown = f"write_all of {binpath!r}", _labelled("write_x", h5path)
        assert str(err) == mismatch_message(comm, *shown, files=True)
        collio.h5.write_all(d, _piece(comm, new), box)
        b.write_all(_piece(comm, 2 * new), box)
    comm.Barrier()
    np.testing.assert_array_equal(np.fromfile(binpath, "<f8").reshape(SHAPE), 2 * new)
    check_file(comm, h5path, {"x": new})


@pytest.mark.mpi(min_size=2)
def test_h5_open_beside_a_collio_open(comm, mpi_tmp_path):
    """Rank 0 opens a file with collio.open while the others open one with collio.h5:
    the same first agreement (an open, the same serial), then different arguments:
    every rank raises the same error, nothing is created, and both open after."""
    h5path, binpath = (str(mpi_tmp_path / n) for n in ("o.h5", "o.bin"))
    if comm.rank == 0:
        fn = lambda: collio.open(binpath, "w", comm=comm)  # noqa: E731
    else:
        fn = lambda: collio.h5.File(h5path, "w", comm=comm)  # noqa: E731
    err = raises_everywhere(comm, collio.MismatchError, fn)
    hints: dict[str, object] = {}  # (the hints given other values than the defaults)
    h5args, binargs = ("w", hints, h5path), ("w", hints, "posix", binpath)
    assert str(err) == "open: " + "; ".join(
        f"rank {r}: h5 open arguments {h5args!r} differs from rank 0's h5 open arguments "
        f"{binargs!r}"  # (the h5 side describes both)
        for r in range(1, min(comm.size, 9))
    )
    assert not err.call_mismatch
    assert sorted(os.listdir(mpi_tmp_path)) == []
    new = reference(SHAPE, "<f8", seed=11)
    with collio.h5.File(h5path, "w", comm=comm) as f, collio.open(binpath, "w", comm=comm) as b:
        collio.h5.write_all(
            collio.h5.create_dataset(f, "x", SHAPE, "<f8"), _piece(comm, new), _box(comm)
        )
        b.write_all(_piece(comm, new), _box(comm))
    comm.Barrier()
    np.testing.assert_array_equal(np.fromfile(binpath, "<f8").reshape(SHAPE), new)
    check_file(comm, h5path, {"x": new})


@pytest.mark.mpi(min_size=2)
def test_same_call_still_compares_metadata(comm, mpi_tmp_path):
    """The same call on every rank after different metadata calls is not a call
    mismatch: the digest of the metadata, carried by the same first allreduce, still
    names what differs (and the file keeps rank 0's metadata)."""
    path = str(mpi_tmp_path / "meta.h5")
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", SHAPE, "<f8")
        if comm.rank == comm.size - 1:
            f.attrs["only-here"] = 1
        err = raises_everywhere(
            comm,
            collio.MismatchError,
            lambda: collio.h5.write_all(d, _piece(comm, np.ones(SHAPE)), _box(comm)),
        )
        assert not err.call_mismatch
        assert str(err) == (
            f"write_all: ranks made different metadata calls on {path!r}: rank "
            f"{comm.size - 1} has /@only-here (attribute); metadata calls must be the same, "
            "in the same order, on every rank (the file keeps rank 0's metadata)"
        )
        # (the file takes no more calls: each later one is refused in its own name)
        later = raises_everywhere(
            comm, collio.MismatchError, lambda: collio.h5.read_all(d, _box(comm))
        )
        assert str(later) == (
            f"read_all: {path!r} takes no more calls after an earlier one failed on every "
            f"rank; close it and open it again (the earlier error: {err})"
        )
    comm.Barrier()
    if comm.rank == 0:
        with h5py.File(path, "r") as g:
            assert list(g) == ["x"] and "only-here" not in g.attrs
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_mismatch_on_a_sub_communicator(comm, mpi_tmp_path):
    """Each half of the ranks has its own file: a mismatch on one half leaves the other
    half's calls untouched."""
    color = comm.rank % 2
    sub = comm.Split(color, comm.rank)
    try:
        path = str(mpi_tmp_path / f"half{color}.h5")
        glob = reference(SHAPE, "<f8", seed=10 + color)
        lay = layouts.block(SHAPE, "<f8", comm=sub, grid=(sub.size, 1))
        f = collio.h5.File(path, "w", comm=sub)
        d = collio.h5.create_dataset(f, "x", SHAPE, "<f8")
        part = np.ascontiguousarray(glob[lay.slices])
        if color == 0 and sub.size > 1:
            if sub.rank == 0:
                fn = lambda: collio.h5.flush(f)  # noqa: E731
            else:
                fn = lambda: collio.h5.write_all(d, part, lay)  # noqa: E731
            err = raises_everywhere(sub, collio.MismatchError, fn)
            assert err.calls == ("flush",) + ("write_all",) * (sub.size - 1)
        collio.h5.write_all(d, part, lay)
        collio.h5.close(f)
    finally:
        sub.Free()
    for c in range(min(2, comm.size)):
        check_file(
            comm,
            str(mpi_tmp_path / f"half{c}.h5"),
            {"x": reference(SHAPE, "<f8", seed=10 + c)},
        )


@pytest.mark.mpi
def test_world_is_still_in_step(comm):
    """After every test above, the ranks are still in step on COMM_WORLD."""
    assert comm.allgather(comm.rank) == list(range(comm.size))
    assert MPI.COMM_WORLD.allreduce(1) == comm.size
