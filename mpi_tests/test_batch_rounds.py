"""A batch of many small arrays whose file domains are a little over the smallest window.

200 arrays of 4 KiB per rank, rank r's array k at ``(k * ranks + r) * 4096`` (a time
series' steps, each rank's piece side by side): each aggregator's domain is a little
over 1 MiB at 3 and 4 ranks, so its last round would hold a few percent of its bytes.
The round is spread over the others (:func:`collio.policy.whole_tail`) unless
``cb_buffer_size`` forbids a wider window; either way every byte is checked against
numpy, ROMIO's 200 calls, and ROMIO reading the batch's file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import layouts

ITEMS = 200
WORDS = 512  # float64 per rank per array (4 KiB)
MiB = 1 << 20


def _layouts(comm: MPI.Intracomm, step: int) -> list[Any]:
    p, r = comm.size, comm.rank
    base = step * ITEMS * p * WORDS * 8
    return [
        layouts.Subarray(
            (WORDS * p,), (WORDS * r,), (WORDS,), "<f8", offset=base + k * p * WORDS * 8
        )
        for k in range(ITEMS)
    ]


def _data(comm: MPI.Intracomm, step: int) -> list[np.ndarray[Any, Any]]:
    """Array k of rank r at step s: the global float64 indices of its elements, plus one."""
    p, r = comm.size, comm.rank
    first = (step * ITEMS * p + r) * WORDS
    return [first + k * p * WORDS + 1 + np.arange(WORDS, dtype="f8") for k in range(ITEMS)]


def _largest_domain(last: dict[str, Any]) -> int:
    lo, hi = last["extent"]
    return -(-(hi - lo) // last["aggregators"])


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_buffer_size": MiB}])
def test_small_batch_rounds_and_bytes(comm, mpi_tmp_path, hints):
    """Two steps written and read as batches: one round per domain where the tail fits a
    half window and cb_buffer_size allows it, else the rounds of that buffer; the file
    is numpy's, ROMIO's (one Write_at_all per array), and what ROMIO reads back."""
    p = comm.size
    many, romio = str(mpi_tmp_path / "many.bin"), str(mpi_tmp_path / "romio.bin")
    steps = [(_data(comm, s), _layouts(comm, s)) for s in range(2)]
    with collio.open(many, "w", comm=comm, hints=hints) as f:
        for datas, lays in steps:
            f.write_all_many(list(zip(datas, lays, strict=True)))
            last = f.stats.last_call
            if p == 1:  # (one rank's arrays back to back: one pwritev, test_many_joined)
                assert last["items"] == ITEMS and last["path"] == "direct"
                continue
            assert last["items"] == ITEMS and last["path"] == "two-phase"
            largest, window = _largest_domain(last), last["window"]
            assert window <= hints.get("cb_buffer_size", 16 * MiB)
            assert last["rounds"] == -(-largest // window)
            if not hints and largest < 3 * MiB // 2:
                assert last["rounds"] == 1 and window >= largest
            if hints and largest > MiB:
                assert last["rounds"] == 2 and window == MiB
        outs = [np.full(WORDS, np.nan) for _ in range(ITEMS)]
        for datas, lays in steps:
            got = f.read_all_many(lays, out=outs)
            for k, (g, want) in enumerate(zip(got, datas, strict=True)):
                assert g.view(np.uint64).tolist() == want.view(np.uint64).tolist(), f"item {k}"
    fh = MPI.File.Open(comm, romio, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    try:
        for s, (datas, _) in enumerate(steps):
            for k, d in enumerate(datas):
                fh.Write_at_all(((s * ITEMS + k) * p + comm.rank) * WORDS * 8, d)
    finally:
        fh.Close()
    comm.Barrier()
    ours = read_file(many)
    want = (np.arange(2 * ITEMS * p * WORDS, dtype="f8") + 1).tobytes()
    assert ours == want == read_file(romio)
    back = np.empty(2 * ITEMS * WORDS, "f8")  # every rank reads all its pieces with ROMIO
    fh = MPI.File.Open(comm, many, MPI.MODE_RDONLY)
    try:
        piece = np.empty(WORDS, "f8")
        for j in range(2 * ITEMS):
            fh.Read_at_all((j * p + comm.rank) * WORDS * 8, piece)
            back[j * WORDS : (j + 1) * WORDS] = piece
    finally:
        fh.Close()
    np.testing.assert_array_equal(back, np.concatenate([d for datas, _ in steps for d in datas]))


@pytest.mark.mpi
def test_small_batch_errors_are_agreed(comm, mpi_tmp_path):
    """A bad item on the last rank and a count that differs on rank 0 fail on every rank
    before a byte is written; the file then takes the good batch whole."""
    path = str(mpi_tmp_path / "f.bin")
    datas, lays = _data(comm, 0), _layouts(comm, 0)
    good = list(zip(datas, lays, strict=True))
    with collio.open(path, "w", comm=comm) as f:
        bad = list(good)
        if comm.rank == comm.size - 1:
            bad[137] = (np.zeros(WORDS + 1), lays[137])  # one element too many
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all_many(bad), match="item 137")
        short = good[:-1] if comm.rank == 0 else good
        if comm.size > 1:
            raises_everywhere(comm, collio.MismatchError, lambda: f.write_all_many(short))
        comm.Barrier()
        assert read_file(path) == b""  # nothing was written
        f.write_all_many(good)
        assert f.stats.last_call["items"] == ITEMS
    comm.Barrier()
    want = (np.arange(ITEMS * comm.size * WORDS, dtype="f8") + 1).tobytes()
    assert read_file(path) == want
