"""Unusual and illegal inputs: every rank raises the same error, nothing given is changed
by a rejected call, and legal input comes back byte for byte as numpy has it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts


def _path(comm: MPI.Intracomm, tmp: Any, name: str) -> str:
    return str(comm.bcast(os.path.join(str(tmp), name), root=0))


Arr = np.ndarray[Any, Any]


def _two_arrays(comm: MPI.Intracomm, tmp: Any) -> tuple[str, Arr, Arr]:
    """A checkpoint of two replicated (6, 4) float64 arrays "a" and "b" of other values."""
    path = _path(comm, tmp, "two.ckpt")
    a, b = np.arange(24.0).reshape(6, 4), -1.5 - np.arange(24.0).reshape(6, 4)
    ckpt.save(path, {"a": a, "b": b}, comm=comm)
    return path, a, b


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["same", "overlapping", "last-rank-only", "one-object"])
def test_load_into_arrays_sharing_memory(comm: MPI.Intracomm, mpi_tmp_path: Any, how: str) -> None:
    """Two arrays loaded into memory they share: one would silently hold the other's bytes
    (the load returned both, "a" holding b's values); now the same error on every rank,
    naming both, the arrays as they were; apart, both load byte for byte.  (One array
    object that owns its memory, passed for both: arrays that own theirs share none
    unless they are one.)"""
    path, a, b = _two_arrays(comm, mpi_tmp_path)
    mem = np.full((12, 4), 7.0)
    own = np.full((6, 4), 7.0)
    into = {"same": (mem[:6], mem[:6]), "overlapping": (mem[:6], mem[3:9]),
            "one-object": (own, own)}.get(how)  # fmt: skip
    if into is None:  # (the last rank alone passes one array twice)
        into = (mem[:6], mem[:6] if comm.rank == comm.size - 1 else mem[6:])
    spec = {"a": (into[0], None), "b": (into[1], None)}
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, spec, comm=comm),
        match="arrays 'a' and 'b' are loaded into arrays that share memory",
    )  # fmt: skip
    assert (mem == 7.0).all() and (own == 7.0).all()
    got = ckpt.load(path, {"a": (mem[:6], None), "b": (mem[6:], None)}, comm=comm)
    assert got["a"].tobytes() == a.tobytes() and got["b"].tobytes() == b.tobytes()
    assert mem.tobytes() == np.concatenate([a, b]).tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["numpy-scalar", "list"])
def test_load_into_what_numpy_copies(comm: MPI.Intracomm, mpi_tmp_path: Any, kind: str) -> None:
    """A numpy scalar or a list as the array to load into: numpy converts it to a new array,
    and the load filled that and returned the caller's object as it was (a scalar 0.0 for
    a stored 5.0); now the same error on every rank.  A 0-d array loads in place."""
    path = _path(comm, mpi_tmp_path, "scalar.ckpt")
    ckpt.save(path, {"s": np.float64(5.0), "v": np.arange(3.0)}, comm=comm)
    name, obj = ("s", np.float64(0.0)) if kind == "numpy-scalar" else ("v", [0.0, 0.0, 0.0])
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, {name: (obj, None)}, comm=comm),
        match=f"array {name!r}: cannot load into a {type(obj).__name__}, which numpy copies",
    )  # fmt: skip
    zero_d, vec = np.zeros(()), np.zeros(3)
    got = ckpt.load(path, {"s": (zero_d, None), "v": (vec, None)}, comm=comm)
    assert got["s"] is zero_d and zero_d.tobytes() == np.float64(5.0).tobytes()
    assert got["v"] is vec and vec.tobytes() == np.arange(3.0).tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_load_spec_with_an_offset_is_refused(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A load spec's layout with an offset, which a save refuses (the checkpoint places
    every array): the load read the piece as if the offset were 0, silently; now the same
    error on every rank, the array given untouched, and the checkpoint loads after."""
    path = _path(comm, mpi_tmp_path, "offset.ckpt")
    glob_ = np.arange(4.0 * comm.size).reshape(comm.size, 4)
    lay = layouts.block(glob_.shape, "<f8", comm=comm, grid=(comm.size, 1))
    ckpt.save(path, {"a": (glob_[comm.rank : comm.rank + 1].copy(), lay)}, comm=comm)
    moved = layouts.Subarray(lay.global_shape, lay.start, lay.shape, "<f8", offset=64)
    out = np.full(lay.shape, -1.0)
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, {"a": (out, moved)}, comm=comm),
        match="array 'a': layout offset 64; the checkpoint places it",
    )  # fmt: skip
    assert (out == -1.0).all()
    got = ckpt.load(path, {"a": (out, lay)}, comm=comm)
    assert got["a"].tobytes() == glob_[comm.rank : comm.rank + 1].tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("offset", [1.5, 2.0, np.float64(1.0), "1"])
def test_offset_through_view_must_be_an_integer(
    comm: MPI.Intracomm, mpi_tmp_path: Any, offset: Any
) -> None:
    """``write_at_all``/``read_at_all`` at an offset that is not an integer (as MPI_Offset
    is; mpi4py refuses it): int() cut 1.5 to 1 and read "1" as 1, so the bytes went
    elsewhere than asked, silently; now the same error on every rank, the file and the
    buffer untouched, also after calls that repeat (a kept step)."""
    path = _path(comm, mpi_tmp_path, "at.bin")
    r, p = comm.rank, comm.size
    ranks = np.arange(p, dtype="<f8")
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(0, MPI.DOUBLE)
        for step in range(3):  # (a time series: the third call repeats the second)
            f.write_at_all(step * p + r, np.array([step * 10 + r], "<f8"))
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()  # (a rank's guessed write of its next call may land before others)
        assert before == np.concatenate([ranks + 10 * s for s in range(3)]).tobytes()
        bad = offset if r == p - 1 else 3 * p + r
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all(bad, np.array([-1.0])),
            match=f"rank {p - 1}: offset {offset!r} is not an integer",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == before
        comm.Barrier()
        buf = np.full(1, -7.0)
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.read_at_all(bad, buf),
            match=f"rank {p - 1}: offset {offset!r} is not an integer",
        )  # fmt: skip
        assert buf[0] == -7.0
        f.write_at_all(3 * p + r, np.array([30.0 + r]))  # (the file goes on)
        assert f.read_at_all(p + r, buf)[0] == 10.0 + r
    comm.Barrier()
    assert read_file(path) == np.concatenate([ranks + 10 * s for s in range(4)]).tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [1.5, "1", (1, 0, 0)])
def test_buffer_count_must_be_an_integer(
    comm: MPI.Intracomm, mpi_tmp_path: Any, count: Any
) -> None:
    """``[buf, count, type]`` with a count that is not an integer (mpi4py refuses it):
    int() cut 1.5 to 1, silently; now the same error on every rank, the file untouched."""
    path = _path(comm, mpi_tmp_path, "count.bin")
    r, p = comm.rank, comm.size
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(0, MPI.DOUBLE)
        f.write_at_all(r, np.array([float(r)]))
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        spec = [np.array([-1.0, -2.0]), count if r == p - 1 else 1, MPI.DOUBLE]
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all(p + r, spec),
            match=f"rank {p - 1}: buffer count {count!r} is not",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == before == np.arange(p, dtype="<f8").tobytes()
        comm.Barrier()
        f.write_at_all(p + r, [np.array([-1.0, -2.0]), 1, MPI.DOUBLE])
    comm.Barrier()
    want = np.concatenate([np.arange(p, dtype="<f8"), np.full(p, -1.0)]).tobytes()
    assert read_file(path) == want


def _refused_then_written(
    comm: MPI.Intracomm, path: str, bad: Any, good: Any, data: Any, want: bytes, match: str
) -> None:
    """The last rank's ``bad`` layout (the others' ``good``) raises ``match`` on every rank
    and leaves the file as it was; then every rank's ``good`` writes ``want``."""
    r, p = comm.rank, comm.size
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(data, good)
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        raises_everywhere(
            comm, collio.LayoutError,
            lambda: f.write_all_many([(data, bad() if r == p - 1 else good)]),
            match=f"rank {p - 1}: item 0: {match}",
        )  # fmt: skip
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_all(data, bad() if r == p - 1 else good),
            match=f"rank {p - 1}: {match}",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == before == want
        comm.Barrier()
        f.write_all(data, good)
        assert f.read_all(good).tobytes() == np.asarray(data).tobytes()
    comm.Barrier()
    assert read_file(path) == want


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "field, value, match",
    [
        ("start", (2.5,), "start (2.5,) must be integers"),
        ("start", ("x",), "start ('x',) must be integers"),
        ("shape", 4, "shape 4 must be integers"),
        ("global_shape", (4.0,), "global shape (4.0,) must be integers"),
        ("offset", 8.5, "offset 8.5 must be an integer"),
        ("offset", "8", "offset '8' must be an integer"),
    ],
)  # fmt: skip
def test_subarray_fields_must_be_integers(
    comm: MPI.Intracomm, mpi_tmp_path: Any, field: str, value: Any, match: str
) -> None:
    """A Subarray whose start, shape, global shape or offset is not integers: int() cut
    2.5 to 2 and read "8" as 8, writing the piece elsewhere without a word, and "x" made
    the constructor raise on that rank alone (the others waited in the call); now the
    layout is refused inside the call, the same error on every rank, the file as it was."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "box.bin")
    fields = {"global_shape": (4 * p,), "start": (4 * r,), "shape": (4,), "offset": 0}
    good = collio.layouts.Subarray(dtype="<f8", **fields)  # type: ignore[arg-type]

    def bad() -> Any:
        return collio.layouts.Subarray(dtype="<f8", **{**fields, field: value})  # type: ignore[arg-type]

    data = np.arange(4.0) + 4 * r
    _refused_then_written(
        comm, path, bad, good, data, np.arange(4.0 * p).astype("<f8").tobytes(), match
    )


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("block", [(1.5, 1), ("1", 1)])
def test_block_cyclic_fields_must_be_integers(
    comm: MPI.Intracomm, mpi_tmp_path: Any, block: Any
) -> None:
    """The same for a block-cyclic block: int() cut 1.5 to 1 (ScaLAPACK's blocks of 1)."""
    p = comm.size
    path = _path(comm, mpi_tmp_path, "cyclic.bin")
    g = np.arange(8.0 * p * 3).reshape(4 * p, 6)

    def lay(blk: Any) -> Any:
        return collio.layouts.block_cyclic((4 * p, 6), "<f8", block=blk, grid=(p, 1), comm=comm)

    good = lay((1, 1))
    data = np.ascontiguousarray(g[np.ix_(*good.indices)])
    _refused_then_written(
        comm, path, lambda: lay(block), good, data, g.tobytes(), f"block {block!r} must be"
    )


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "offsets, match",
    [
        ([8.5], "segment offsets must be integers, not float64"),
        (["8"], "segment offsets must be integers, not <U1"),
        ([2**64], "segment offsets must be integers that fit int64"),
        (np.array([2**63], np.uint64), "segment offsets must be integers that fit int64"),
    ],
)  # fmt: skip
def test_segments_must_be_integers(
    comm: MPI.Intracomm, mpi_tmp_path: Any, offsets: Any, match: str
) -> None:
    """Segments at offsets that are not int64 integers: 8.5 was cut to 8, silently (also in
    a batch of raw pieces), and 2**64 made the constructor raise on that rank alone (the
    others waited in the call); now the same error on every rank, the file as it was."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "segments.bin")
    good = collio.layouts.Segments([8 * r], [8])
    data = np.full(8, r + 1, np.uint8)
    want = np.repeat(np.arange(1, p + 1, dtype=np.uint8), 8).tobytes()
    _refused_then_written(
        comm, path, lambda: collio.layouts.Segments(offsets, [8]), good, data, want, match
    )


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", ["write_all", "write_all_many", "read_all", "read_all_many"])
def test_object_dtype_is_refused(comm: MPI.Intracomm, mpi_tmp_path: Any, call: str) -> None:
    """Arrays of Python objects: a batch's items skip the single call's byte view, so
    write_all_many wrote the objects' pointers into the file and read_all_many made
    objects of the file's bytes (a segfault for any bytes but zeros); a single call
    raised numpy's "Cannot change data-type for array of references".  Now the same
    error on every rank saying why, the file as it was; then the file goes on."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "objects.bin")
    f8 = collio.layouts.Subarray((2 * p,), (2 * r,), (2,), "<f8")
    objects = collio.layouts.Subarray((2 * p,), (2 * r,), (2,), object)
    want = (np.arange(2.0 * p) + 0.5).tobytes()
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.arange(2.0) + 2 * r + 0.5, f8)
        comm.Barrier()
        assert read_file(path) == want
        comm.Barrier()
        lay = objects if r == p - 1 else f8
        data = np.array([None, "x"], object) if r == p - 1 else np.zeros(2)
        calls = {
            "write_all": lambda: f.write_all(data, lay),
            "write_all_many": lambda: f.write_all_many([(data, lay)]),
        }
        with collio.open(path, "r", comm=comm) as g:
            calls["read_all"] = lambda: g.read_all(lay)
            calls["read_all_many"] = lambda: g.read_all_many([lay])
            item = "item 0: " if call.endswith("many") else ""
            raises_everywhere(
                comm, collio.LayoutError, calls[call],
                match=f"rank {p - 1}: {item}dtype object holds Python objects",
            )  # fmt: skip
            assert g.read_all(f8).tobytes() == want[16 * r : 16 * r + 16]
        comm.Barrier()
        assert read_file(path) == want
        comm.Barrier()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_checkpoint_object_piece_names_its_entry(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A sharded checkpoint entry of Python objects: the error named neither the entry
    nor the reason (numpy's "Cannot change data-type for array of references")."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "objects.ckpt")
    lay = collio.layouts.Subarray((p,), (r,), (1,), object)
    state = {"ok": np.arange(3.0), "o": (np.array([None], object), lay)}
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.save(path, state, comm=comm),
        match="rank 0: entry 'o': dtype object holds Python objects",
    )  # fmt: skip
    assert not os.path.exists(path)


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_checkpoint_metadata_is_json(comm: MPI.Intracomm, mpi_tmp_path: Any, value: float) -> None:
    """Metadata holding NaN or Infinity (on one rank): Python's json wrote them as the
    bare words NaN and Infinity, which are not JSON, into the index that strict parsers
    then refuse; now the same error on every rank, no file, and a later save goes on."""
    path = _path(comm, mpi_tmp_path, "meta.ckpt")
    meta = {"loss": value if comm.rank == comm.size - 1 else 1.0}
    raises_everywhere(
        comm, collio.LayoutError,
        lambda: ckpt.save(path, {"x": np.arange(3.0)}, comm=comm, metadata=meta),
        match=f"rank {comm.size - 1}: checkpoint metadata must be JSON values",
    )  # fmt: skip
    assert not os.path.exists(path)
    ckpt.save(path, {"x": np.arange(3.0)}, comm=comm, metadata={"loss": 1.0})
    assert ckpt.info(path).metadata == {"loss": 1.0}
    assert ckpt.load(path, {"x": None}, comm=comm)["x"].tobytes() == np.arange(3.0).tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_datatype_layout_past_the_largest_offset(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A datatype layout whose tiles reach past 2**63 (a double resized to an extent of
    2**62, four of them): its int64 runs wrapped, and the call was refused as bytes
    [-2**63, ...) "written twice by this rank"; now the reach is named, on every rank."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "typed.bin")
    good = collio.layouts.from_datatype(MPI.DOUBLE, disp=8 * r)
    far = MPI.DOUBLE.Create_resized(0, 2**62).Commit()
    try:
        bad = collio.layouts.from_datatype(far, count=4, disp=8 * r)
    finally:
        far.Free()
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.array([r + 0.5]), good)
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        lay, data = (bad, np.zeros(4)) if r == p - 1 else (good, np.array([-1.0]))
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_all(data, lay),
            match=f"rank {p - 1}: datatype reaches byte {8 * (p - 1) + 3 * 2**62 + 8}, past the",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == before == (np.arange(p) + 0.5).tobytes()
        comm.Barrier()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["vector", "subarray"])
@pytest.mark.parametrize("disp", [8.5, "8"])
def test_datatype_disp_must_be_an_integer(
    comm: MPI.Intracomm, mpi_tmp_path: Any, kind: str, disp: Any
) -> None:
    """``from_datatype(..., disp=8.5)``: int() cut it to 8 (and read "8" as 8), so the
    data went elsewhere than asked without a word; now the same error on every rank."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "disp.bin")
    if kind == "vector":
        dt = MPI.DOUBLE.Create_vector(1, 1, 1).Commit()
    else:
        dt = MPI.DOUBLE.Create_subarray([p], [1], [r]).Commit()
    try:
        good = collio.layouts.from_datatype(dt, disp=8 * r if kind == "vector" else 0)
        bad = collio.layouts.from_datatype(dt, disp=disp)
    finally:
        dt.Free()
    data = np.array([r + 0.5])
    want = (np.arange(p) + 0.5).tobytes()
    match = (
        f"count 1 and disp {disp!r} must be integers"
        if kind == "vector"
        else f"offset {disp!r} must be an integer"
    )
    _refused_then_written(comm, path, lambda: bad, good, data, want, match)


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("factory", ["block", "block_cyclic"])
def test_factory_fault_on_one_rank_is_raised_in_the_call(
    comm: MPI.Intracomm, mpi_tmp_path: Any, factory: str
) -> None:
    """``layouts.block``/``block_cyclic`` given a grid that does not fit the ranks on one
    rank: the factory raised there alone, before the call, and the others waited in it
    (or raised a MismatchError when that rank closed the file); now the layout fails its
    check inside the call, the same error on every rank, the file as it was."""
    p = comm.size
    path = _path(comm, mpi_tmp_path, "grid.bin")
    g = np.arange(4.0 * p * 3).reshape(4 * p, 3)

    def make(grid: Any) -> Any:
        if factory == "block":
            return collio.layouts.block(g.shape, "<f8", comm=comm, grid=grid)
        return collio.layouts.block_cyclic(g.shape, "<f8", block=2, comm=comm, grid=grid)

    good = make((p, 1))
    piece = g[good.slices] if factory == "block" else g[np.ix_(*good.indices)]
    data = np.ascontiguousarray(piece)
    match = f"grid ({p + 1}, 1) has {p + 1} places for {p} ranks"
    _refused_then_written(comm, path, lambda: make((p + 1, 1)), good, data, g.tobytes(), match)


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("factory", ["block", "block_cyclic"])
def test_zero_d_shape_is_not_split(comm: MPI.Intracomm, mpi_tmp_path: Any, factory: str) -> None:
    """``block``/``block_cyclic`` of a 0-d global shape: MPI_Dims_create gives the empty
    grid at any size, so every rank got the one element and the write failed as an overlap
    of ranks 0 and 1; now, at more than one rank, a LayoutError on every rank naming the
    shape and the size, the file as it was.  At one rank the element is written, and the
    suggested shape (1,) writes it at any size."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "zero_d.bin")

    def make(shape: Any) -> Any:
        if factory == "block":
            return layouts.block(shape, "<f8", comm=comm)
        return layouts.block_cyclic(shape, "<f8", block=1, grid=(p,) * len(shape), comm=comm)

    one = make((1,))
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.full(one.local_shape, 2.5), one)
        comm.Barrier()
        assert read_file(path) == np.float64(2.5).tobytes()
        comm.Barrier()
        zero = make(())
        if p == 1:
            f.write_all(np.array(-1.5), zero)
            assert f.read_all(zero).tobytes() == np.float64(-1.5).tobytes()
        else:
            raises_everywhere(
                comm, collio.LayoutError, lambda: f.write_all(np.array(float(r)), zero),
                match=f"rank {p - 1}: a 0-d global shape () holds one element and cannot be "
                f"split over {p} ranks; use global shape (1,)",
            )  # fmt: skip
            comm.Barrier()
            assert read_file(path) == np.float64(2.5).tobytes()
            comm.Barrier()
            f.write_all(np.full(one.local_shape, -1.5), one)
    comm.Barrier()
    assert read_file(path) == np.float64(-1.5).tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_strided_memoryview_is_a_layout_error(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A strided memoryview through the view: numpy's BufferError came back as a bare
    CollioError (not a LayoutError, as a strided ndarray is); now a LayoutError on every
    rank, the file as it was."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path, "memoryview.bin")
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(0, MPI.DOUBLE)
        f.write_at_all(r, np.array([r + 0.5]))
        comm.Barrier()
        before = read_file(path)
        comm.Barrier()
        buf = memoryview(np.zeros(4))[::2] if r == p - 1 else np.zeros(1)
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all(p + r, buf),
            match=f"rank {p - 1}: buffer (memoryview) is not contiguous memory",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == before == (np.arange(p) + 0.5).tobytes()
        comm.Barrier()
