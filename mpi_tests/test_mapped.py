"""Hint ``mapped_reads`` under MPI: on a local file system each rank copies its own pieces
out of the mapped file instead of the shuffle.

Bytes equal the numpy reference and ROMIO's own read of the same file view; every rank
agrees on the path (``stats.last_call["direct"]``, the same on every rank); a rank whose
runs pass the file's end sends the whole call through the shuffle; a failure on one rank
is raised by every rank, and the file goes on.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest
from helpers import local_piece, on_local_fs, raises_everywhere, reference
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import filereads
from collio.testing.guarded import far_apart
from collio.testing.romio import romio_read

pytestmark = pytest.mark.mpi(min_size=1)


def _lay(comm, pattern):
    grid = MPI.Compute_dims(comm.size, 2)
    if pattern == "colblock":
        return (512, 384), layouts.block((512, 384), "<f8", comm=comm, grid=(1, comm.size))
    if pattern == "cyclic":
        return (512, 512), layouts.block_cyclic((512, 512), "<f8", block=64, grid=grid, comm=comm)
    if pattern == "ragged":  # edge blocks shorter than the rest: two or more run lengths
        shape = (301, 299)
        return shape, layouts.block_cyclic(shape, "<f4", block=(16, 20), grid=grid, comm=comm)
    if pattern == "fortran":  # memory in another order than the file
        shape = (96, 80)
        return shape, layouts.block(shape, "<i8", comm=comm, grid=(comm.size, 1), order="F")
    shape = (24, 20, 36)  # cube
    return shape, layouts.block(shape, "<f8", comm=comm)


@pytest.mark.parametrize("pattern", ["colblock", "cyclic", "ragged", "fortran", "cube"])
@pytest.mark.parametrize("mode", ["automatic", "enable", "disable"])
def test_mapped_reads_equal_numpy_and_romio(comm, mpi_tmp_path, pattern, mode):
    path = str(mpi_tmp_path / "target.bin")
    shape, lay = _lay(comm, pattern)
    glob = reference(shape, lay.dtype, seed=41)
    if comm.rank == 0:
        with open(path, "wb") as out:
            out.write(glob.tobytes(order=lay.order))  # (the file holds the array in its order)
    comm.Barrier()
    want = local_piece(glob, lay)
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": mode}) as f:
        got = f.read_all(lay)
        stats = f.stats
    assert np.array_equal(got, want)
    assert np.array_equal(romio_read(path, lay, comm), want)
    mapped = mode == "enable" or (mode == "automatic" and on_local_fs(path))
    # the path: direct on every rank when mapped (two-phase, or direct for disjoint
    # extents, otherwise: row blocks at one rank)
    assert comm.allgather(stats.last_call["direct"]) == [stats.last_call["direct"]] * comm.size
    if mapped:
        assert stats.last_call["direct"] and stats.messages == 0
    assert stats.mapped_bytes == (_copied(comm, stats, got.nbytes) if mapped else 0)


def _copied(comm, stats, nbytes: int) -> int:
    """The bytes the ranks copied from the map: each its ``nbytes``, but a rank whose few
    small runs it preads instead (``PosixBackend.read_runs``)."""
    runs = np.asarray(stats.local.get("requests", []))
    few = filereads.preads(len(runs), int(runs.sum()))
    return int(comm.allreduce(0 if few else nbytes))


def test_a_rank_past_the_end_keeps_the_shuffle(comm, mpi_tmp_path):
    """The last rank's last run lies past the file's end (a mapped page there would
    fault): every rank takes the shuffle, and that byte reads as zero."""
    path = str(mpi_tmp_path / "target.bin")
    p, k = comm.size, 256
    n = k * p
    data = np.random.default_rng(5).integers(1, 256, n, dtype=np.uint8)
    if comm.rank == 0:
        data[: n - 1].tofile(path)  # the last byte missing
    comm.Barrier()
    offsets = np.arange(k) * p + comm.rank  # every p-th byte: k runs of one byte
    lay = layouts.Segments(offsets, np.ones(k, np.int64))
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        got = f.read_all(lay)
        assert f.stats.mapped_bytes == 0
        assert f.stats.last_call["direct"] is (p == 1)  # (one rank: disjoint, preads)
    want = data[offsets]
    if comm.rank == p - 1:
        want[-1] = 0
    assert np.array_equal(got, want)


@pytest.mark.parametrize("direct_write", [False, True])
def test_read_after_write_sees_the_data(comm, mpi_tmp_path, direct_write):
    """A read in the same file right after a write (no sync): the map shows what the
    ranks wrote through the page cache or around it (``O_DIRECT``)."""
    path = str(mpi_tmp_path / "target.bin")
    shape, lay = _lay(comm, "cyclic")
    glob = reference(shape, lay.dtype, seed=42)
    hints = {"direct_write": direct_write, "mapped_reads": "enable"}
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(local_piece(glob, lay), lay)
        got = f.read_all(lay)
        assert f.stats.last_call["direct"]
    assert np.array_equal(got, local_piece(glob, lay))


def _failing(*args, **kwargs):
    raise OSError(errno.EIO, "injected read error")


@pytest.mark.parametrize(("copier", "rows"), [("read_gathered", 512), ("read_mapped", 4096)])
def test_a_failed_mapped_read_is_raised_everywhere(comm, mpi_tmp_path, monkeypatch, copier, rows):
    """Every rank, at any size, copies ``rows`` runs (32 of the 32p + 8 columns): within
    GATHER_BYTES of the file through one pread, beyond it through a map."""
    from collio.backends.mapped import GATHER_BYTES

    path = str(mpi_tmp_path / "target.bin")
    row = (32 * comm.size + 8) * 8
    if copier == "read_gathered":  # (a rank's runs within GATHER_BYTES at any size)
        rows = min(rows, (GATHER_BYTES - 32 * 8) // row + 1)
    shape = (rows, row // 8)
    lay = layouts.Subarray(shape, (0, 32 * comm.rank), (rows, 32), "<f8")
    glob = reference(shape, "<f8", seed=43)
    if comm.rank == 0:
        glob.tofile(path)
    comm.Barrier()
    f = collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"})
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(filereads, copier, _failing)
    err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay))
    assert f"rank {comm.size - 1}" in str(err) and "injected read error" in str(err)
    monkeypatch.undo()
    assert np.array_equal(f.read_all(lay), glob[:, 32 * comm.rank : 32 * comm.rank + 32])
    assert f.stats.mapped_bytes == rows * 32 * 8 * comm.size  # (the failed call counts none)
    f.close()


@pytest.mark.parametrize("mode", ["automatic", "disable"])
def test_hdf5_contiguous_dataset_reads_map(comm, mpi_tmp_path, mode):
    """collio.h5 reads a contiguous dataset through the same posix path: on a local
    file system its pieces come from the map (the file written by collio.h5 and read
    back right by stock h5py in another process, as in test_h5)."""
    pytest.importorskip("h5py")
    from h5check import check_file

    import collio.h5

    path = str(mpi_tmp_path / "mapped.h5")
    shape, lay = _lay(comm, "cyclic")
    glob = reference(shape, lay.dtype, seed=44)
    hints = {"mapped_reads": mode}
    with collio.h5.File(path, "w", comm=comm, hints=hints) as f:
        d = collio.h5.create_dataset(f, "m", shape, lay.dtype)
        collio.h5.write_all(d, local_piece(glob, lay), lay)
    check_file(comm, path, {"m": glob})
    with collio.h5.File(path, "r", comm=comm, hints=hints) as f:
        got = collio.h5.read_all(f["m"], lay)
        stats = collio.h5.stats(f)
    assert np.array_equal(got, local_piece(glob, lay))
    mapped = mode == "automatic" and on_local_fs(path)
    assert stats.mapped_bytes == (_copied(comm, stats, got.nbytes) if mapped else 0)


def test_a_failing_mapping_check_is_raised_everywhere(comm, mpi_tmp_path, monkeypatch):
    """The question "may this rank copy from the map?" (an fstat) is asked before the
    call's first agreement: if it fails on one rank, every rank raises it there, rather
    than that rank alone while the others wait in the agreement; then the file goes on."""
    path = str(mpi_tmp_path / "target.bin")
    shape, lay = _lay(comm, "cyclic")
    glob = reference(shape, lay.dtype, seed=46)
    if comm.rank == 0:
        glob.tofile(path)
    comm.Barrier()
    f = collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"})
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(f.backend, "maps_reads", _failing)
    err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all(lay))
    assert f"rank {comm.size - 1}" in str(err) and "injected read error" in str(err)
    monkeypatch.undo()
    assert np.array_equal(f.read_all(lay), local_piece(glob, lay))
    f.close()


MIB = 1 << 20


@pytest.mark.parametrize(
    ("offs", "lens"), [([0, 20 * MIB], [48 * MIB, 100]), ([0, 20 * MIB], [40 * MIB, 8])]
)
def test_overlapping_read_with_a_run_longer_than_the_window(comm, mpi_tmp_path, offs, lens):
    """Reads may overlap: the long run's pieces after cutting must be sorted again with
    the run inside it, or a window's base lies past that run (wrong bytes, silently)."""
    data = np.random.default_rng(0).integers(0, 256, 48 * MIB, dtype=np.uint8)
    path = str(mpi_tmp_path / "f.bin")
    if comm.rank == 0:
        data.tofile(path)
    comm.Barrier()
    want = np.concatenate([data[o : o + n] for o, n in zip(offs, lens, strict=True)])
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        got = f.read_all(layouts.Segments(offs, lens))
        assert f.stats.mapped_bytes == sum(lens) * comm.size
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", [filereads.LONG_PREAD // 2, filereads.LONG_PREAD * 4])
def test_a_batch_into_memory_terabytes_apart(comm, mpi_tmp_path, size):
    """read_all_many of two items whose arrays lie terabytes apart on the last rank
    alone (a heap array beside a mapped one), their runs alternating in the file, past
    GATHER_BYTES: every rank's bytes land, copied from the map (short runs) or a preadv
    each (long ones).  The copy once built a view of rows over the batch's whole span
    there, which numpy refused on that rank."""
    from collio.backends.mapped import GATHER_BYTES

    k, r = max(12, GATHER_BYTES // size), comm.rank
    path = str(mpi_tmp_path / "target.bin")
    data = np.random.default_rng(47).integers(0, 256, 2 * k * size * comm.size, dtype=np.uint8)
    if r == 0:
        data.tofile(path)
    comm.Barrier()
    first = (2 * k * r + 2 * np.arange(k)) * size  # item 0's runs; item 1's follow each
    lays = [layouts.Segments(first + j * size, np.full(k, size)) for j in (0, 1)]
    outs = far_apart(k * size, 3 << 44) if r == comm.size - 1 else None
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        got = f.read_all_many(lays, out=outs)
        copied = 0 if filereads.preads(2 * k, 2 * k * size) else 2 * k * size * comm.size
        assert f.stats.mapped_bytes == copied
    rows = data.reshape(-1, size)[2 * k * r : 2 * k * (r + 1)]
    for j in (0, 1):
        np.testing.assert_array_equal(got[j].reshape(-1, size), rows[j::2])


def _series(comm, rows: int = 64, cols: int = 8):
    """A time series of strided steps (each rank ``rows`` runs of ``cols`` float64 of
    every step, interleaved with the other ranks' and with a column block no rank reads,
    so that one rank's runs are strided too), as the layout of step ``s``."""
    p = comm.size + 1
    shape = (rows, cols * p)

    def step(s: int) -> layouts.Subarray:
        offset = s * rows * cols * p * 8
        return layouts.Subarray(shape, (0, cols * comm.rank), (rows, cols), "<f8", offset=offset)

    return shape, step


def test_a_strided_series_reads_rows_equal_numpy_and_romio(comm, mpi_tmp_path, monkeypatch):
    """A series' repeated strided reads copy their runs as rows from one pread: every
    step's bytes equal numpy's and ROMIO's; a read failing on one rank (a repeat's,
    by its step: the pread it makes; the lane's: its copy of the rows) is raised by
    every rank and the series goes on; the last step, past the file's end, reads zeros
    there."""
    from collio.backends.mapped import Rows

    path = str(mpi_tmp_path / "series.bin")
    steps = 6
    shape, step = _series(comm)
    glob = reference((steps, *shape), "<f8", seed=44)
    if comm.rank == 0:
        with open(path, "wb") as out:  # (it ends 3 elements into the last rank's last run)
            out.write(glob.tobytes()[: -11 * 8])
    comm.Barrier()
    cols = slice(8 * comm.rank, 8 * comm.rank + 8)
    out = np.empty((64, 8))
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        for s in range(steps - 1):
            if s == 3:
                if comm.rank == comm.size - 1:
                    monkeypatch.setattr(Rows, "copy", _failing)
                    monkeypatch.setattr(filereads, "pread_zeros", _failing)
                err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all(step(3), out))
                assert f"rank {comm.size - 1}" in str(err) and "injected" in str(err)
                monkeypatch.undo()
            got = f.read_all(step(s), out=out)
            assert got is out and np.array_equal(got, glob[s][:, cols])
            assert np.array_equal(romio_read(path, step(s), comm), glob[s][:, cols])
            assert f.stats.last_call["direct"]
        last = f.read_all(step(steps - 1))
    want = glob[steps - 1][:, cols].copy()
    if comm.rank == comm.size - 1:
        want[-1, -3:] = 0
    assert np.array_equal(last, want)


def test_a_series_of_batches_of_long_runs_reads_equal_numpy_and_romio(
    comm, mpi_tmp_path, monkeypatch
):
    """Batches of items of 64 KiB per rank, item k of every rank side by side (a time
    series written as a batch per step), read into one array's rows: each rank reads
    its long runs with a preadv each, not a map; the second and later batches repeat
    the first, each rank reading before the head agrees.  Every batch's bytes equal
    numpy's and ROMIO's; a read failing on one rank (a repeat's preadv) is raised by
    every rank, naming it, and the series goes on."""
    p, r, n, items, steps = comm.size, comm.rank, 8192, 24, 4
    path = str(mpi_tmp_path / "steps.bin")
    glob = reference((steps * items, p * n), "<f8", seed=45)
    if r == 0:
        glob.tofile(path)
    comm.Barrier()

    def lays(s: int) -> list[layouts.Subarray]:
        return [
            layouts.Subarray((p * n,), (r * n,), (n,), "<f8", offset=(s * items + k) * p * n * 8)
            for k in range(items)
        ]

    out = np.full((items, n), np.nan)
    found = []
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        for s in range(steps):
            if s == 2:
                if r == p - 1:
                    monkeypatch.setattr(filereads, "pread_runs", _failing)
                err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all_many(
                    lays(2), out=list(out)  # noqa: B023
                ))  # fmt: skip
                assert f"rank {p - 1}" in str(err) and "injected read error" in str(err)
                monkeypatch.undo()
            before = f.stats.mapped_bytes
            got = f.read_all_many(lays(s), out=list(out))
            found.append(
                (
                    all(g.base is out for g in got),
                    np.array_equal(out, glob[s * items : (s + 1) * items, r * n : (r + 1) * n]),
                    f.stats.last_call["path"], f.stats.mapped_bytes - before,
                )
            )  # fmt: skip
    assert filereads.preads(items, items * n * 8)
    assert comm.allgather(found) == [[(True, True, "mapped", 0)] * steps] * p
    # (every item of a batch through ROMIO, a list: each romio_read is collective, and a
    # short-circuiting all() on one rank would leave the others in the next)
    romio = [romio_read(path, lay, comm) for lay in lays(1)]
    assert np.array_equal(np.stack(romio), glob[items : 2 * items, r * n : (r + 1) * n])
