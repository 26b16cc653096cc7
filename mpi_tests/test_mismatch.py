"""Ranks calling different collective methods of a file: the same error everywhere, no hang.

Rank 0 makes one call while the other ranks make another.  Every collective call on a
file starts with the same nonblocking allreduce, so they all meet there and raise the
same ``MismatchError`` naming each rank's call.  Afterwards the file is in the same
state on every rank: closed everywhere when some rank called ``close`` (its commit
dropped), else open and usable, with an atomic target aborted (its writes refused,
the previous content kept at close).  On the code before that allreduce these tests
hung (pytest-timeout fails them) or raised different errors on different ranks.

Nothing collective may come before that allreduce: with the ``mpiio`` backend the
fsync of ``sync`` and ``close`` is ``MPI_File_sync``, a collective call, so a rank
that synced before agreeing sat in it while the others sat in ``write_all``'s
allreduce.  A close after a mismatch syncs on every rank as ``close()`` does, so what
was written before it is on disk.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import local_piece, mismatch_message, raises_everywhere, read_file, reference
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import register_backend
from collio.backends.mpiio import MpiioBackend

SHAPE = (16, 12)
ROW = SHAPE[1] * 8  # bytes per row of <f8


def _box(comm):
    """This rank's block of rows of SHAPE (empty on ranks past the end)."""
    return layouts.block(SHAPE, "<f8", comm=comm, grid=(comm.size, 1))


def _piece(comm, glob):
    return local_piece(glob, _box(comm))


def _call(name, f, comm, data):
    """The call ``name`` on ``f`` as a test program would make it."""
    box = _box(comm)
    if name == "write_all":
        return lambda: f.write_all(data, box)
    if name == "read_all":
        return lambda: f.read_all(box)
    if name == "set_view":
        return lambda: f.set_view(_box(comm).start[0] * ROW, MPI.DOUBLE)
    return getattr(f, name)  # sync, close


def _mismatch(comm, f, first, rest, data):
    """Rank 0 calls ``first``, the others ``rest``: the same MismatchError everywhere."""
    call = _call(first if comm.rank == 0 else rest, f, comm, data)
    err = raises_everywhere(comm, collio.MismatchError, call)
    assert str(err) == mismatch_message(comm, first, rest)
    assert err.call_mismatch and err.one_file
    assert err.calls == (first,) + (rest,) * (comm.size - 1)
    assert err.ranks == tuple(range(1, comm.size))
    assert err.close_error is None
    return err


def _on_disk(comm, path):
    comm.Barrier()
    got = np.fromfile(path, "<f8").reshape(SHAPE)
    comm.Barrier()
    return got


PAIRS = [
    ("sync", "write_all"),
    ("write_all", "sync"),
    ("close", "write_all"),
    ("write_all", "close"),
    ("close", "read_all"),
    ("set_view", "write_all"),
    ("write_all", "set_view"),
    ("sync", "read_all"),
    ("read_all", "set_view"),
    ("close", "sync"),
    ("sync", "close"),
    ("set_view", "close"),
]


class BcastSyncMpiio(MpiioBackend):
    """The mpiio backend on a file system whose ``MPI_File_sync`` communicates.

    ``MPI_File_sync`` is collective, and ROMIO's PVFS2 driver makes it so: a reduce to
    rank 0, which flushes, then a broadcast of its result.  Its UFS driver (this
    machine's) only fsyncs, so a rank syncing while the others wait elsewhere goes
    unnoticed there; this backend adds the reduce and the broadcast, on the file's
    communicator, after the fsync.
    """

    name = "mpiio-bcast-sync"

    @classmethod
    def open(cls, target, mode, *, comm, hints, **options):
        be = super().open(target, mode, comm=comm, hints=hints, **options)
        be.comm = comm
        return be

    def sync(self):
        super().sync()
        if self.mode != "r":
            self.comm.reduce(0, root=0)  # as ADIOI_PVFS2_Flush: every rank meets rank 0
            self.comm.bcast(0, root=0)  # which then sends its flush's result


register_backend(BcastSyncMpiio.name, BcastSyncMpiio)

#: the targets each pair runs on: hints and backend of the second open
TARGETS = {
    "plain": {},
    "atomic": {"hints": {"atomic_commit": True}},
    # MPI_File_sync and MPI_File_close are collective: a rank in close or sync must not
    # enter them while the others are still in write_all's first agreement
    "mpiio": {"backend": "mpiio"},
    "mpiio-bcast-sync": {"backend": BcastSyncMpiio.name},
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize(("first", "rest"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_different_calls_raise_everywhere_and_the_file_goes_on(
    comm, mpi_tmp_path, first, rest, target
):
    path = str(mpi_tmp_path / "target.bin")
    old, new, newer = (reference(SHAPE, "<f8", seed=s) for s in (1, 2, 3))
    box = _box(comm)
    atomic = target == "atomic"
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(_piece(comm, old), box)
    with collio.open(path, "r+", comm=comm, **TARGETS[target]) as f:
        f.write_all(_piece(comm, new), box)  # written before the mismatch
        _mismatch(comm, f, first, rest, np.zeros_like(_piece(comm, new)))
        closing = "close" in (first, rest)
        assert comm.allgather(f.closed) == [closing] * comm.size
        if closing and target == "plain":
            # closed as close() closes, its sync on every rank: this rank's writes were
            # fsynced (the bytes themselves are checked below)
            assert comm.allgather(f.backend.dirty) == [False] * comm.size
        if closing:
            f.close()  # idempotent, local: every rank is closed
            with pytest.raises(collio.ModeError, match="is closed"):
                f.write_all(_piece(comm, newer), box)
        else:
            # nothing moved; the view, the file pointer and the file go on
            np.testing.assert_array_equal(f.read_all(box), _piece(comm, new))
            assert f.position == 0
            f.set_view(_box(comm).start[0] * ROW, MPI.DOUBLE)
            if atomic:  # aborted as after a failed write, on every rank alike
                raises_everywhere(comm, collio.ModeError, lambda: f.write_all(_piece(comm, newer)))
            else:
                f.write_all(_piece(comm, newer))
                got = f.read_at_all(0, np.empty_like(_piece(comm, newer)))
                np.testing.assert_array_equal(got, _piece(comm, newer))
                f.sync()
    # atomic: the previous content stays and no temporary is left; else what was written
    want = old if atomic else (new if closing else newer)
    np.testing.assert_array_equal(_on_disk(comm, path), want)
    assert sorted(os.listdir(mpi_tmp_path)) == ["target.bin"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("first", "rest"), [("close", "read_all"), ("sync", "read_all")])
def test_read_only_file(comm, mpi_tmp_path, first, rest):
    """A file opened in 'r': the same error everywhere; closed everywhere, or still read."""
    path = str(mpi_tmp_path / "target.bin")
    old = reference(SHAPE, "<f8", seed=4)
    if comm.rank == 0:
        old.tofile(path)
    comm.Barrier()
    with collio.open(path, "r", comm=comm) as f:
        _mismatch(comm, f, first, rest, None)
        assert comm.allgather(f.closed) == [first == "close"] * comm.size
        if not f.closed:
            np.testing.assert_array_equal(f.read_all(_box(comm)), _piece(comm, old))
    np.testing.assert_array_equal(_on_disk(comm, path), old)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("target", list(TARGETS))
def test_one_rank_leaves_a_with_block_early(comm, mpi_tmp_path, target):
    """Rank 0 leaves the ``with`` block (its close) while the others still write: every
    rank raises, the others' own close (their ``with``) finds the file closed."""
    path = str(mpi_tmp_path / "target.bin")
    old, new = reference(SHAPE, "<f8", seed=5), reference(SHAPE, "<f8", seed=6)
    box = _box(comm)
    atomic = target == "atomic"
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(_piece(comm, old), box)

    def program():
        with collio.open(path, "r+", comm=comm, **TARGETS[target]) as g:
            g.write_all(_piece(comm, new), box)
            if comm.rank != 0:
                g.write_all(np.zeros_like(_piece(comm, new)), box)

    err = raises_everywhere(comm, collio.MismatchError, program)
    assert str(err) == mismatch_message(comm, "close", "write_all")
    np.testing.assert_array_equal(_on_disk(comm, path), old if atomic else new)
    assert sorted(os.listdir(mpi_tmp_path)) == ["target.bin"]


@pytest.mark.mpi(min_size=2)
def test_open_beside_a_call_on_an_open_file(comm, mpi_tmp_path):
    """Rank 0 opens another file on the communicator while the others write: every rank
    raises (calls on different files) before anything is created, and goes on."""
    path, other = (str(mpi_tmp_path / n) for n in ("target.bin", "other.bin"))
    new = reference(SHAPE, "<f8", seed=7)
    box = _box(comm)
    with collio.open(path, "w", comm=comm) as f:
        if comm.rank == 0:
            call = lambda: collio.open(other, "w", comm=comm)  # noqa: E731
        else:
            call = lambda: f.write_all(np.zeros_like(_piece(comm, new)), box)  # noqa: E731
        err = raises_everywhere(comm, collio.MismatchError, call)
        shown = ", ".join(f"rank {r}: write_all of {path!r}" for r in range(1, min(comm.size, 9)))
        assert str(err) == (
            f"ranks called operations on different files: rank 0 open of {other!r}; {shown} "
            "(every rank must make the same call)"
        )
        assert err.call_mismatch and not err.one_file
        assert not f.closed
        f.write_all(_piece(comm, new), box)
    np.testing.assert_array_equal(_on_disk(comm, path), new)
    assert sorted(os.listdir(mpi_tmp_path)) == ["target.bin"]


@pytest.mark.mpi(min_size=2)
def test_calls_on_two_files(comm, mpi_tmp_path):
    """Rank 0 syncs one file while the others write another (open on the same
    communicator): every rank raises; neither file is aborted or closed."""
    paths = [str(mpi_tmp_path / n) for n in ("a.bin", "b.bin")]
    new = [reference(SHAPE, "<f8", seed=s) for s in (8, 9)]
    box = _box(comm)
    with (
        collio.open(paths[0], "w", comm=comm, hints={"atomic_commit": True}) as a,
        collio.open(paths[1], "w", comm=comm) as b,
    ):
        if comm.rank == 0:
            call = a.sync
        else:
            call = lambda: b.write_all(_piece(comm, new[1]), box)  # noqa: E731
        err = raises_everywhere(comm, collio.MismatchError, call)
        assert "ranks called operations on different files: rank 0 sync of " in str(err)
        assert not err.one_file
        a.write_all(_piece(comm, new[0]), box)  # not aborted
        b.write_all(_piece(comm, new[1]), box)
    for path, want in zip(paths, new, strict=True):
        np.testing.assert_array_equal(_on_disk(comm, path), want)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_at_calls_and_batches_are_named_in_their_errors(comm, mpi_tmp_path):
    """``write_at_all``/``read_at_all`` errors were labelled ``write_all``/``read_all``:
    now each names the call made, on every rank alike, whether the call repeats kept
    ones (the fast steps) or not, and so do the batches and a read past the end."""
    r, p = comm.rank, comm.size
    path = comm.bcast(str(mpi_tmp_path / "named.bin"), root=0)
    strided = memoryview(np.zeros(4))[::2]
    with collio.open(path, "w", comm=comm, hints={"read_past_eof": "disable"}) as f:
        f.set_view(0, MPI.DOUBLE)
        for k in range(4):  # (repeats: the later ones take the kept call's step)
            f.write_at_all(k * p + r, np.array([k * p + r + 0.5]))
            np.testing.assert_array_equal(f.read_at_all(k * p + r, np.zeros(1)), [k * p + r + 0.5])
        want = (np.arange(4 * p) + 0.5).tobytes()
        for call in ("write_at_all", "read_at_all"):
            fn = getattr(f, call)
            odd = strided if r == p - 1 else np.zeros(1)
            raises_everywhere(
                comm, collio.LayoutError, lambda fn=fn: fn(-1 if r == p - 1 else r, np.zeros(1)),
                match=f"{call}: rank {p - 1}: offset -1 is negative",
            )  # fmt: skip
            raises_everywhere(
                comm, collio.LayoutError, lambda fn=fn, odd=odd: fn(r, odd),
                match=f"{call}: rank {p - 1}: buffer (memoryview) is not contiguous memory",
            )  # fmt: skip
        raises_everywhere(
            comm, collio.LayoutError,
            lambda: f.read_at_all(4 * p + r if r == p - 1 else r, np.zeros(1)),
            match=f"read_at_all: rank {p - 1}: read_at_all reaches byte {8 * 5 * p}, past the",
        )  # fmt: skip
        bad = layouts.Subarray((4,), (0,), (5 if r == p - 1 else 0,), "<f8")
        raises_everywhere(
            comm, collio.LayoutError,
            lambda: f.write_all_many([(np.zeros(bad.local_shape), bad)]),
            match=f"write_all_many: rank {p - 1}: item 0: region (0,)+(5,) exceeds global shape",
        )  # fmt: skip
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.read_all_many([bad]),
            match=f"read_all_many: rank {p - 1}: item 0: region (0,)+(5,) exceeds global shape",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == want
        comm.Barrier()
        f.write_at_all(r, np.array([-r - 0.5]))
        assert f.read_at_all(r, np.zeros(1)).tolist() == [-r - 0.5]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("repeated", [False, True])
def test_at_call_beside_a_pointer_call_is_a_mismatch(comm, mpi_tmp_path, repeated):
    """Rank 0's ``write_at_all`` (``read_at_all``) while the others call ``write_all``
    (``read_all``) through the view: they agreed as one call, so an error named one
    call on some ranks and the other on the rest; now the same MismatchError on every
    rank naming each rank's call, also after repeats (rank 0's write guessed and taken
    back), the file, the pointers and the view as they were."""
    r, p = comm.rank, comm.size
    path = comm.bcast(str(mpi_tmp_path / "mixed.bin"), root=0)
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(0, MPI.DOUBLE)
        for k in range(4 if repeated else 1):
            f.write_at_all(k * p + r, np.array([k * p + r + 0.5]))
            f.read_at_all(k * p + r, np.zeros(1))
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        for first, rest in (("write_at_all", "write_all"), ("read_at_all", "read_all")):
            if r == 0:
                call = lambda first=first: getattr(f, first)(r, np.array([9.0]))  # noqa: E731
            else:
                call = lambda rest=rest: getattr(f, rest)(np.array([9.0]))  # noqa: E731
            err = raises_everywhere(comm, collio.MismatchError, call)
            assert str(err) == mismatch_message(comm, first, rest)
            assert err.calls == (first,) + (rest,) * (p - 1)
            assert f.position == 0
        comm.Barrier()
        assert read_file(path) == before
        comm.Barrier()
        f.write_at_all(r, np.array([-r - 0.5]))
        assert f.read_at_all(r, np.zeros(1)).tolist() == [-r - 0.5]
