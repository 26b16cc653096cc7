"""A time series of batch reads that do their I/O before their one agreement.

A ``read_all_many`` whose layouts are the last batch's all moved by one offset, over
arrays of the same shapes, repeats that batch's requests: from the third batch of a
series on (the second, for reads copied from the file's pages), each rank reads first
and the head agrees after (``last_call["guessed"]``),
as single calls do (collio.speculate).  A rank whose batch differs, fails, or meets
another call makes every rank raise the same error, and the series goes on; single
calls between batches keep their own series.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from helpers import mismatch_message, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import filereads

pytestmark = pytest.mark.mpi(min_size=1)

#: Items per batch: a contiguous float64 piece and an int32 column block, alternating.
PAIRS = 6
ROWS, COLS = 8, 4
STEPS = 6


def _len(j: int) -> int:
    return 40 + 8 * (j % 3)


def _step_bytes(p: int) -> int:
    return sum(8 * _len(j) * p + 4 * ROWS * COLS * p for j in range(PAIRS))


def _items(comm: MPI.Intracomm, step: int) -> list[tuple[Any, tuple[Any, ...], int, Any]]:
    """Step ``step``'s items: (layout, global shape, offset, dtype), every rank's piece
    of each (item 2j a 1-D piece beside the others', 2j+1 a column block)."""
    p, r = comm.size, comm.rank
    out = []
    at = step * _step_bytes(p)
    for j in range(PAIRS):
        n = _len(j)
        out.append((layouts.Subarray((n * p,), (n * r,), (n,), "<f8", offset=at),
                    (n * p,), at, "<f8"))  # fmt: skip
        at += 8 * n * p
        out.append((layouts.Subarray((ROWS, COLS * p), (0, COLS * r), (ROWS, COLS), "<i4",
                                     offset=at), (ROWS, COLS * p), at, "<i4"))  # fmt: skip
        at += 4 * ROWS * COLS * p
    return out


def _want(image: bytes, comm: MPI.Intracomm, items: Any) -> list[np.ndarray[Any, Any]]:
    """Each item's piece as numpy reads it from ``image`` (zeros past its end)."""
    p, r = comm.size, comm.rank
    got = []
    for k, (_, shape, at, dtype) in enumerate(items):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = np.zeros(n, np.uint8)
        have = image[at : at + n]
        raw[: len(have)] = np.frombuffer(have, np.uint8)
        glob = raw.view(dtype).reshape(shape)
        if k % 2 == 0:
            m = shape[0] // p
            got.append(glob[m * r : m * (r + 1)])
        else:
            got.append(glob[:, COLS * r : COLS * (r + 1)])
    return got


def _file(comm: MPI.Intracomm, path: str) -> bytes:
    """A file of random bytes, ``STEPS`` steps long, written by rank 0 with numpy."""
    if comm.rank == 0:
        raw = np.random.default_rng(11).integers(0, 256, STEPS * _step_bytes(comm.size), np.uint8)
        raw.tofile(path)
    comm.Barrier()
    image = read_file(path)
    assert image is not None
    return image


def _read(f: Any, comm: MPI.Intracomm, step: int, image: bytes, outs: Any = None) -> bool:
    """Step ``step`` read as one batch and checked against numpy; whether it was guessed."""
    items = _items(comm, step)
    got = f.read_all_many([lay for lay, *_ in items], out=outs)
    for k, (g, w) in enumerate(zip(got, _want(image, comm, items), strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {step} item {k}")
    return bool(f.stats.last_call["guessed"])


def _everywhere(comm: MPI.Intracomm, flags: list[bool]) -> list[bool]:
    """The flags, asserted equal on every rank (a rank that guessed alone would be a
    defect of the head)."""
    every = comm.allgather(flags)
    assert every == [flags] * comm.size, every
    return flags


@pytest.mark.mpi
@pytest.mark.parametrize("new_outs", [False, True], ids=["same-outs", "new-outs"])
def test_a_series_of_batch_reads_guesses_from_its_second_batch(comm, mpi_tmp_path, new_outs):
    """Steps read one batch each, into the same arrays or new ones: the second batch on
    is guessed (a mapped read needs no agreed shift), every byte as numpy reads it; a
    single read between batches keeps both series (the batch after it is guessed
    still)."""
    path = str(mpi_tmp_path / "series.bin")
    image = _file(comm, path)
    outs = None if new_outs else [np.empty(s[0].shape, s[3]) for s in _items(comm, 0)]
    with collio.open(path, "r", comm=comm) as f:
        flags = [_read(f, comm, s, image, outs) for s in range(4)]
        assert _everywhere(comm, flags) == [False, True, True, True]
        assert f.stats.last_call["items"] == 2 * PAIRS
        same = []
        for s in range(3):  # (a single series between the batches)
            one = f.read_all(layouts.Subarray((8 * comm.size,), (8 * comm.rank,), (8,), "<f8",
                                              offset=s * 64 * comm.size))  # fmt: skip
            want = np.frombuffer(image, "<f8", 8, (s * comm.size + comm.rank) * 64)
            same.append(bool(np.array_equal(one, want)))
        assert _everywhere(comm, same) == [True] * 3
        single = f.stats.last_call["guessed"]
        flags = [_read(f, comm, s, image, outs) for s in (4, 5)]
        assert _everywhere(comm, [single, *flags]) == [True, True, True]


@pytest.mark.mpi(min_size=2)
def test_a_guessed_batch_with_a_bad_item_on_one_rank_fails_everywhere(comm, mpi_tmp_path):
    """One rank's output array of the wrong shape in a batch the others guessed: the same
    error on every rank, naming the item and the rank; the series then goes on."""
    path = str(mpi_tmp_path / "bad.bin")
    image = _file(comm, path)
    bad = comm.size - 1
    with collio.open(path, "r", comm=comm) as f:
        for s in range(3):
            _read(f, comm, s, image)
        lays = [lay for lay, *_ in _items(comm, 3)]
        outs = [np.empty(lay.shape, "<i4" if k % 2 else "<f8") for k, lay in enumerate(lays)]
        if comm.rank == bad:
            outs[3] = np.empty((ROWS + 1, COLS), "<i4")
        err = raises_everywhere(comm, collio.LayoutError, lambda: f.read_all_many(lays, out=outs))
        assert f"rank {bad}" in str(err) and "item 3" in str(err), str(err)
        flags = [_read(f, comm, s, image) for s in (3, 4, 5)]
        assert _everywhere(comm, flags)[-1]


@pytest.mark.mpi(min_size=2)
def test_a_guessed_batch_whose_read_fails_on_one_rank_fails_everywhere(
    comm, mpi_tmp_path, monkeypatch
):
    """The read itself failing on one rank in a guessed batch: every rank raises the
    same error, naming the rank; the series goes on."""
    path = str(mpi_tmp_path / "eio.bin")
    image = _file(comm, path)
    bad = comm.size - 1
    with collio.open(path, "r", comm=comm, hints={"mapped_reads": "enable"}) as f:
        for s in range(3):
            _read(f, comm, s, image)

        def failing(*args: Any) -> None:
            raise OSError(5, "injected read error")

        if comm.rank == bad:
            for name in ("read_gathered", "read_mapped", "pread_runs"):
                monkeypatch.setattr(filereads, name, failing)
        lays = [lay for lay, *_ in _items(comm, 3)]
        err = raises_everywhere(comm, collio.CollioError, lambda: f.read_all_many(lays))
        assert f"rank {bad}" in str(err) and "injected read error" in str(err), str(err)
        monkeypatch.undo()
        flags = [_read(f, comm, s, image) for s in (3, 4, 5)]
        assert _everywhere(comm, flags)[-1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("other", ["read_all", "fewer items", "moved apart"])
def test_a_guessed_batch_beside_another_call_on_one_rank_is_a_mismatch(comm, mpi_tmp_path, other):
    """Rank 0 makes another call where the others' batch is guessed (a single read, a
    batch of fewer items, or the same items one step further on): every rank raises the
    same MismatchError, and the series goes on."""
    path = str(mpi_tmp_path / "other.bin")
    image = _file(comm, path)
    with collio.open(path, "r", comm=comm) as f:
        for s in range(3):
            _read(f, comm, s, image)
        lays = [lay for lay, *_ in _items(comm, 3)]
        if comm.rank == 0 and other == "read_all":
            call: Any = lambda: f.read_all(lays[0])  # noqa: E731
        elif comm.rank == 0 and other == "fewer items":
            call = lambda: f.read_all_many(lays[:-1])  # noqa: E731
        elif comm.rank == 0:
            call = lambda: f.read_all_many([lay for lay, *_ in _items(comm, 4)])  # noqa: E731
        else:
            call = lambda: f.read_all_many(lays)  # noqa: E731
        err = raises_everywhere(comm, collio.MismatchError, call)
        if other == "read_all":
            assert str(err) == mismatch_message(comm, "read_all", "read_all_many"), str(err)
        elif other == "fewer items":
            assert f"rank 0: {2 * PAIRS - 1}" in str(err), str(err)
        flags = [_read(f, comm, s, image) for s in (3, 4, 5)]
        assert _everywhere(comm, flags)[-1]


@pytest.mark.mpi
def test_a_guessed_batch_past_the_end_reads_zeros_there(comm, mpi_tmp_path):
    """The file cut short inside the last step while the series is guessed: the batch
    reads zeros past the new end, as numpy's reference has them."""
    path = str(mpi_tmp_path / "short.bin")
    image = _file(comm, path)
    with collio.open(path, "r", comm=comm) as f:
        for s in range(4):
            _read(f, comm, s, image)
        comm.Barrier()
        end = len(image) - _step_bytes(comm.size) // 2
        if comm.rank == 0:
            os.truncate(path, end)
        comm.Barrier()
        _read(f, comm, 4, image[:end])
        _read(f, comm, 5, image[:end])


@pytest.mark.mpi
def test_a_batch_of_more_runs_than_are_kept_reads_with_two_agreements(
    comm, mpi_tmp_path, monkeypatch
):
    """A batch of more runs than a kept call may hold (``KEPT_BATCH_RUNS``: each kept
    call holds its run lengths until the file closes) is not kept, so its repeats are
    not guessed; every byte as numpy reads it."""
    from collio import speculate

    monkeypatch.setattr(speculate, "KEPT_BATCH_RUNS", 0)  # (fewer than any batch's runs)
    path = str(mpi_tmp_path / "many_runs.bin")
    image = _file(comm, path)
    with collio.open(path, "r", comm=comm) as f:
        flags = [_read(f, comm, s, image) for s in range(4)]
    assert _everywhere(comm, flags) == [False] * 4
