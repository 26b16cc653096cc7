"""Checkpoints of every format version a save has written load at any rank count: version 3
sums with CRC-32, version 2 (laid out alike) with CRC-32C; each load checks with the
file's own checksum, resharded loads combining parts by its polynomial."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.checkpoint import format
from collio.testing import checkpoint as model


def _saved(comm: MPI.Intracomm, tmp: Any, version: int, state: Any, name: str) -> str:
    """``state`` saved as a version ``version`` file (the writer's version set for the save
    alone); its header, trailer and index name that version and its checksum."""
    path = str(comm.bcast(os.path.join(str(tmp), name), root=0))
    mp = pytest.MonkeyPatch()
    mp.setattr(format, "VERSION", version)
    try:
        ckpt.save(path, state, comm=comm, metadata={"version": version})
    finally:
        mp.undo()
    raw = read_file(path) if comm.rank == 0 else b""
    facts = None
    if comm.rank == 0:
        assert raw is not None
        head = format.HEADER.unpack(raw[: format.HEADER.size])[1]
        _, tail, off, length, crc, _ = format.TRAILER.unpack(raw[-format.TRAILER.size :])
        doc = json.loads(raw[off : off + length])
        facts = (head, tail, doc["version"], sorted(doc["extent_table"]))
    facts = comm.bcast(facts, root=0)
    name = "crc32" if version >= 3 else "crc32c"
    assert facts == (version, version, version, sorted(["offset", "count", name])), facts
    return path


@pytest.mark.mpi
@pytest.mark.parametrize("version", [2, 3])
def test_each_version_loads_in_other_decompositions(
    comm: MPI.Intracomm, mpi_tmp_path: Any, version: int
) -> None:
    """Every decomposition of the model, mapped and read, byte for byte; ``info`` alone."""
    path = _saved(comm, mpi_tmp_path, version, model.save_state(comm.rank, comm.size), "m.ckpt")
    spec = model.load_spec(comm.rank, comm.size)
    for maps in ("enable", "disable"):
        got = ckpt.load(path, spec, comm=comm, hints={"checkpoint_map": maps})
        same = [
            got[n].tobytes(order="A") == model.expected(n, lay).tobytes(order="A")
            for n, lay in sorted(spec.items())
        ]
        assert all(comm.allgather(all(same))), (comm.rank, maps, same)
    assert ckpt.info(path).metadata == {"version": version}


@pytest.mark.mpi
@pytest.mark.parametrize("version", [2, 3])
def test_each_version_checks_extents_across_pieces(
    comm: MPI.Intracomm, mpi_tmp_path: Any, version: int
) -> None:
    """A load in another row split combines the parts of the extents across its pieces by
    the file's polynomial: it passes intact, and a flipped byte there is found on every
    rank."""
    state = model.rows_state(comm.rank, comm.size)
    path = _saved(comm, mpi_tmp_path, version, state, "rows.ckpt")
    lay = model.shifted_rows(comm.rank, comm.size)
    got = ckpt.load(path, {"a": lay}, comm=comm)["a"]
    ok = got.tobytes() == model.rows_reference("a")[lay.slices].tobytes()
    assert all(comm.allgather(ok))
    del got
    model.flip_past_first_edge(comm, path)
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, {"a": lay}, comm=comm)
    )
    assert err.names == ("a",)
    whole = ckpt.load(path, {"b": None}, comm=comm)["b"]  # (an intact array still loads)
    assert all(comm.allgather(bool(np.array_equal(whole, model.rows_reference("b")))))
