"""collio writes the same bytes ROMIO writes, for every decomposition MPI can express."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import all_layouts, file_image, local_piece, reference, segments_for

import collio
import collio.aggregators
from collio.testing.romio import covered_mask, romio_read, romio_write

SHAPES = [((37, 45), "<f8"), ((7, 9, 11), "<i2"), ((256, 256), "<f8")]
HINTS = [
    {},
    {"cb_buffer_size": 65536},
    {"cb_nodes": 1},
    {"cb_nodes": 2, "cb_buffer_size": 4096},
    {"cb_nodes": 3, "cb_buffer_size": 1000},
    {"cb_nodes": 4, "striping_unit": 512},
    {"romio_cb_write": "disable", "romio_cb_read": "disable"},
    {"romio_cb_write": "enable", "romio_cb_read": "enable", "direct_threshold": 1},
]


def _ids(values: list[object]) -> list[str]:
    return [str(v).replace(" ", "") for v in values]


@pytest.mark.mpi
@pytest.mark.parametrize("hints", HINTS, ids=_ids(HINTS))
@pytest.mark.parametrize("shape,dtype", SHAPES, ids=_ids([s for s, _ in SHAPES]))
def test_same_bytes_as_romio(comm, mpi_tmp_path, shape, dtype, hints):
    glob = reference(shape, dtype)
    for name, lay in all_layouts(comm, shape, dtype):
        mine = str(mpi_tmp_path / f"collio-{name}.bin")
        theirs = str(mpi_tmp_path / f"romio-{name}.bin")
        local = local_piece(glob, lay)
        with collio.open(mine, "w", comm=comm, hints=hints) as f:
            f.write_all(local, lay)
            back = f.read_all(lay)
        np.testing.assert_array_equal(back, local, err_msg=name)
        romio_write(theirs, local, lay, comm)
        comm.Barrier()
        with open(mine, "rb") as fh:
            ours = fh.read()
        with open(theirs, "rb") as fh:
            ref = fh.read()
        assert ours == ref, f"{name}: collio and ROMIO files differ"
        if getattr(lay, "grid", None) is not None:  # block(): also as MPI darray BLOCK
            darr = str(mpi_tmp_path / f"romio-darray-{name}.bin")
            romio_write(darr, local, lay, comm, darray=True)
            comm.Barrier()
            with open(darr, "rb") as fh:
                assert fh.read() == ours, f"{name}: differs from ROMIO darray BLOCK"
        assert ours == file_image(glob, lay.order), f"{name}: file differs from numpy"
        # each reads the other's file
        np.testing.assert_array_equal(romio_read(mine, lay, comm), local, err_msg=name)
        with collio.open(theirs, "r", comm=comm, hints=hints) as f:
            np.testing.assert_array_equal(f.read_all(lay), local, err_msg=name)


@pytest.mark.mpi
@pytest.mark.parametrize("hints", HINTS[:5], ids=_ids(HINTS[:5]))
def test_segments_same_bytes_as_romio(comm, mpi_tmp_path, hints):
    size = 10_007
    glob = reference((size,), "u1", seed=11)
    lay = segments_for(comm, size)
    pieces = [
        glob[o : o + n] for o, n in zip(lay.offsets.tolist(), lay.lengths.tolist(), strict=True)
    ]
    data = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
    mine = str(mpi_tmp_path / "seg-collio.bin")
    theirs = str(mpi_tmp_path / "seg-romio.bin")
    with collio.open(mine, "w", comm=comm, hints=hints) as f:
        f.write_all(data, lay)
        back = f.read_all(lay)
    np.testing.assert_array_equal(back, data)
    romio_write(theirs, data, lay, comm)
    comm.Barrier()
    ours = np.fromfile(mine, np.uint8)
    ref = np.fromfile(theirs, np.uint8)
    every = comm.allgather(lay)
    mask = covered_mask(every, size)
    assert mask.all(), "the segments of all ranks cover the file"
    np.testing.assert_array_equal(ours[mask], ref[mask])
    np.testing.assert_array_equal(ours, glob)


@pytest.mark.mpi
def test_offset_and_empty_ranks(comm, mpi_tmp_path):
    """A subarray stored after a header; ranks with empty boxes still take part."""
    shape = (20, 30)
    glob = reference(shape, "<i4")
    p = comm.size
    # only the first half of the ranks (at least one) hold data
    holders = max(1, p // 2)
    if comm.rank < holders:
        rows = np.array_split(np.arange(shape[0]), holders)[comm.rank]
        lay = collio.layouts.Subarray(shape, (rows[0], 0), (len(rows), shape[1]), "<i4", offset=100)
    else:
        lay = collio.layouts.Subarray(shape, (0, 0), (0, shape[1]), "<i4", offset=100)
    local = glob[lay.slices]
    path = str(mpi_tmp_path / "offset.bin")
    with collio.open(path, "w", comm=comm, hints={"romio_cb_write": "enable"}) as f:
        f.write_all(local, lay)
        np.testing.assert_array_equal(f.read_all(lay), local)
    comm.Barrier()
    with open(path, "rb") as fh:
        assert fh.read() == file_image(glob, "C", offset=100)


@pytest.mark.mpi
def test_nothing_to_write_anywhere(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    lay = collio.layouts.Segments([], [])
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.zeros(0, np.uint8), lay)
        assert f.read_all(lay).size == 0
    assert os.path.getsize(path) == 0


@pytest.mark.mpi
def test_stats_reduced_and_same_on_every_rank(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    shape = (64, 64)
    glob = reference(shape, "<f8")
    lay = collio.layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    hints = {"cb_buffer_size": 8192, "romio_cb_write": "enable", "cb_min_domain": 0}
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(local_piece(glob, lay), lay)
        d = f.stats.as_dict()
    bounds = collio.aggregators.file_domains(0, glob.nbytes, comm.size)
    per_domain = -(-np.diff(bounds) // 8192)  # windows per domain, all non-empty
    assert d["bytes_written"] == glob.nbytes
    assert d["write_ops"] == per_domain.sum()
    assert d["rounds"] == per_domain.max()
    assert d["write_size_histogram"]["1K_10K"] == d["write_ops"]
    assert d["hints"]["cb_buffer_size"] == 8192
    assert d["hints"]["cb_nodes"] == len(d["aggregators"]) == comm.size
    assert comm.allgather(d) == [d] * comm.size
