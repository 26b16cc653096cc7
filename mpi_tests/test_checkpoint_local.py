"""A local file's load: the ranks read it themselves, with no file open unless a piece
needs the two-phase path; its agreements still catch ranks that differ."""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.layouts import Subarray
from collio.testing import checkpoint as model


def _path(comm: MPI.Intracomm, tmp: Any, name: str = "model.ckpt") -> str:
    return str(comm.bcast(os.path.join(str(tmp), name), root=0))


def _flip(path: str, at: int) -> None:
    model.flip(path, at, 0x10)


def _count_opens(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    opened: list[Any] = []
    real = collio.File._open.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, *a: Any, **k: Any) -> Any:
        opened.append(a[1])
        return real(cls, *a, **k)

    monkeypatch.setattr(collio.File, "_open", classmethod(spy))
    return opened


@pytest.mark.mpi
def test_part_of_an_array_reads_the_rest_of_its_extents_back(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of the middle of an array, on one rank: the extents they cut are read back
    by the ranks alone (no file opened), every byte checked; a byte flipped outside the
    rows but in an extent they touch is found on every rank."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=8), comm=comm)
    rows = 512  # (f8 x 1000 a row: 8000 bytes, so rows 100-140 lie inside the first 4 MiB)
    shape = (rows, 1000)
    mine = (100, 40) if comm.rank == 0 else (0, 0)
    lay = Subarray(shape, (mine[0], 0), (mine[1], 1000), "<f8")
    opened = _count_opens(monkeypatch)
    got = ckpt.load(path, {"a": lay}, comm=comm)["a"]
    assert opened == []
    want = model.rows_reference("a", 8)[mine[0] : mine[0] + mine[1]]
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    comm.Barrier()  # (every rank done with its arrays: a mapped one shows the flip)
    if comm.rank == 0:
        _flip(path, ckpt.info(path).file_offset("a", 3 * 8000 + 7))  # row 3: not loaded
    comm.Barrier()
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, {"a": lay}, comm=comm)
    )
    assert err.names == ("a",)
    assert opened == []


@pytest.mark.mpi
def test_row_shards_load_without_a_file_open(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row shards and replicated values: every rank reads its own bytes (no file opened,
    no two-phase call); a 2-D block in the same load opens it, for that array only."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    spec: dict[str, Any] = dict(model.rows_layouts(comm.rank, comm.size))
    spec["rep"] = None
    opened = _count_opens(monkeypatch)
    got = ckpt.load(path, spec, comm=comm)
    assert opened == []
    for name, lay in spec.items():
        if lay is None:
            assert got[name].tobytes() == np.arange(7, dtype="<i8").tobytes()
            continue
        want = np.ascontiguousarray(model.rows_reference(name)[lay.slices])
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)
    if comm.size < 2:
        return
    cols = Subarray((64, 1000), (0, 500 * (comm.rank % 2)), (64 if comm.rank < 2 else 0, 500),
                    "<f8")  # fmt: skip
    got = ckpt.load(path, {"a": cols, "b": spec["b"]}, comm=comm)
    assert len(opened) == 1
    want = np.ascontiguousarray(model.rows_reference("a")[cols.slices])
    assert got["a"].tobytes() == want.tobytes()
    # (b, read by each rank itself in the same call as a, through the file)
    want = np.ascontiguousarray(model.rows_reference("b")[spec["b"].slices])
    assert got["b"].tobytes() == want.tobytes()


@pytest.mark.mpi
def test_ranks_passing_other_arguments_raise_everywhere(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """One rank's other hints, or a load that maps (which opens the file) beside the
    others' local reads: the same MismatchError on every rank, and the job goes on."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    spec = {"b": model.rows_layouts(comm.rank, comm.size)["b"]}
    last = comm.rank == comm.size - 1
    hints = {"cb_buffer_size": 1 << 20} if last else None
    raises_everywhere(
        comm,
        collio.MismatchError,
        lambda: ckpt.load(path, spec, comm=comm, hints=hints),
        match=f"rank {comm.size - 1} passes other hints or options than rank 0",
    )
    mapped = {"mapped_reads": "enable"} if last else None
    raises_everywhere(
        comm, collio.MismatchError, lambda: ckpt.load(path, spec, comm=comm, hints=mapped),
        match="different collective operations",
    )  # fmt: skip
    other = {"checkpoint_map": "enable" if last else "disable"}
    raises_everywhere(
        comm, collio.MismatchError, lambda: ckpt.load(path, spec, comm=comm, hints=other),
        match=f"rank {comm.size - 1} passes other hints or options than rank 0",
    )  # fmt: skip
    raises_everywhere(
        comm, collio.HintError,
        lambda: ckpt.load(path, spec, comm=comm, hints={"checkpoint_map": "always"}),
        match="checkpoint_map",
    )  # fmt: skip
    # a hint one rank cannot parse: its error on every rank, none left in an agreement
    bad = {"cb_buffer_size": "abc"} if last else None
    raises_everywhere(
        comm, collio.HintError, lambda: ckpt.load(path, spec, comm=comm, hints=bad),
        match=f"rank {comm.size - 1}: hint cb_buffer_size='abc' is not a size",
    )  # fmt: skip
    got = ckpt.load(path, spec, comm=comm)["b"]
    lay = spec["b"]
    want = np.ascontiguousarray(model.rows_reference("b")[lay.slices]).tobytes()
    assert got.tobytes() == want
    # the same arguments spelled otherwise on one rank (the backend named, an option as
    # an int, a hint as a string) are the same load, as a collio file's open finds them
    spelled: dict[str, Any] = {"backend": "posix", "writeback": 1} if last else {}
    size = "1048576" if last else 1 << 20
    got = ckpt.load(path, spec, comm=comm, hints={"cb_buffer_size": size}, **spelled)["b"]
    assert got.tobytes() == want


@pytest.mark.mpi
def test_rows_left_out_at_the_saving_split_are_read_back_and_checked(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saving split with the last rank's rows left out: every rank checks its own
    pieces alone (no spans gathered), the extents nobody loaded are read back and
    checked, and a byte flipped in them is found on every rank."""
    import sys

    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=8), comm=comm)
    lay = model.rows_layouts(comm.rank, comm.size, scale=8)["a"]
    assert isinstance(lay, Subarray)
    last = comm.rank == comm.size - 1
    mine = Subarray(lay.global_shape, lay.start, (0, 1000), "<f8") if last else lay
    loader = sys.modules["collio.checkpoint.load"]
    gathers: list[Any] = []
    real = loader._all_spans
    monkeypatch.setattr(loader, "_all_spans", lambda *a: gathers.append(a) or real(*a))
    got = ckpt.load(path, {"a": mine}, comm=comm)["a"]
    assert gathers == []
    want = np.ascontiguousarray(model.rows_reference("a", 8)[mine.slices])
    assert got.tobytes() == want.tobytes()
    comm.Barrier()  # (every rank done with its arrays: a mapped one shows the flip)
    if comm.rank == 0:  # a byte of the last rank's rows, which no rank loads
        info = ckpt.info(path)["a"]
        _flip(path, ckpt.info(path).file_offset("a", info["nbytes"] - 8000 + 3))
    comm.Barrier()
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, {"a": mine}, comm=comm)
    )
    assert err.names == ("a",)
    assert gathers == []


MAP = {"checkpoint_map": "enable"}


def _rows_spec(comm: MPI.Intracomm) -> dict[str, Any]:
    spec: dict[str, Any] = dict(model.rows_layouts(comm.rank, comm.size))
    spec["rep"] = None
    return spec


def _want(name: str, lay: Any) -> bytes:
    if lay is None:
        return np.arange(7, dtype="<i8").tobytes()
    return np.ascontiguousarray(model.rows_reference(name)[lay.slices]).tobytes()


def _maps_of(path: str) -> list[str]:
    """This process's maps of ``path`` (``/proc/self/maps`` lines; a replaced file's end
    in ``(deleted)``)."""
    with open("/proc/self/maps") as fh:
        return [line.rstrip("\n") for line in fh if line.rstrip("\n").endswith(
            (path, path + " (deleted)"))]  # fmt: skip


@pytest.mark.mpi
def test_writes_to_mapped_arrays_never_reach_the_file(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A mapped array is the process's own: written all over, it keeps what was written,
    while the file and a second load hold the saved bytes."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else None
    spec = _rows_spec(comm)
    got = ckpt.load(path, spec, comm=comm, hints=MAP)
    for arr in got.values():
        arr.view(np.uint8)[...] = 0x5A
    again = ckpt.load(path, spec, comm=comm, hints=MAP)
    comm.Barrier()
    for name, lay in spec.items():
        assert model.mapped(got[name]) == (got[name].size > 0), (comm.rank, name)
        assert again[name].tobytes() == _want(name, lay), (comm.rank, name)
        assert got[name].tobytes() == b"\x5a" * len(_want(name, lay)), (comm.rank, name)
    if comm.rank == 0:
        assert read_file(path) == before


@pytest.mark.mpi
def test_save_over_mapped_arrays_keeps_their_values(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A save to the path of a mapped checkpoint replaces the file (rename): the mapped
    arrays keep the old bytes, a new load gets the new ones; one map per load and rank,
    no descriptor held, each map gone with the last array over it."""
    path = _path(comm, mpi_tmp_path)
    old = model.rows_state(comm.rank, comm.size)
    ckpt.save(path, old, comm=comm)
    spec = _rows_spec(comm)
    fds = len(os.listdir("/proc/self/fd"))
    got = ckpt.load(path, spec, comm=comm, hints=MAP)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert len(_maps_of(path)) == 1
    new = {name: (np.invert(v[0].view(np.uint8)).view(v[0].dtype), v[1])
           for name, v in old.items() if isinstance(v, tuple)}  # fmt: skip
    new["rep"] = np.arange(7, 14, dtype="<i8")
    ckpt.save(path, new, comm=comm)
    for name, lay in spec.items():
        assert got[name].tobytes() == _want(name, lay), (comm.rank, name)
    assert [m.endswith("(deleted)") for m in _maps_of(path)] == [True]
    fresh = ckpt.load(path, spec, comm=comm, hints=MAP)
    for name, lay in spec.items():
        want = np.arange(7, 14, dtype="<i8").tobytes() if lay is None else bytes(
            255 - b for b in _want(name, lay))  # fmt: skip
        assert fresh[name].tobytes() == want, (comm.rank, name)
    keep = fresh["a"]
    del got, fresh
    gc.collect()
    assert [m.endswith("(deleted)") for m in _maps_of(path)] == [False]  # (keep's)
    del keep
    gc.collect()
    assert _maps_of(path) == []
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.mpi
def test_mapped_loads_with_empty_ranks_check_every_extent(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Rows over all ranks but the last, which asks for empty pieces only (another split
    than the save's: extents across pieces checked from the parts, each in its map or,
    where a piece crosses the saving ranks' regions, read): the bytes, and a byte
    flipped in any piece found on every rank."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=8), comm=comm)
    writers = max(comm.size - 1, 1)
    spec: dict[str, Any] = {}
    for name, lay in model.rows_layouts(min(comm.rank, writers - 1), writers, 8).items():
        assert isinstance(lay, Subarray)
        if comm.rank >= writers:
            lay = Subarray(lay.global_shape, (0,) * len(lay.start), (0, *lay.shape[1:]),
                           lay.dtype)  # fmt: skip
        spec[name] = lay
    got = ckpt.load(path, spec, comm=comm, hints=MAP)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name, 8)[lay.slices]).tobytes()
        assert got[name].tobytes() == want, (comm.rank, name)
        one = len(want) > 0 and model.mappable(path, name, lay)
        assert model.mapped(got[name]) == one, (comm.rank, name)
    del got
    comm.Barrier()  # (every rank done with its arrays: a mapped one shows the flip)
    if comm.rank == 0:  # in the last writer's rows of b
        info = ckpt.info(path)["b"]
        _flip(path, ckpt.info(path).file_offset("b", info["nbytes"] - 5))
    comm.Barrier()
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, spec, comm=comm, hints=MAP)
    )
    assert err.names == ("b",)


def _save_rows_load_fewer(comm: MPI.Intracomm, path: str, per_rank: int) -> tuple[Any, ...]:
    """Collective: save ``per_rank`` rows of 4 KiB per rank of two arrays ("w", "v": each
    rank's rows of both in its own region of the file); return the whole "w", the row
    bounds of a split over one rank fewer, this rank's block of that split and the spec
    loading it (the last rank loads the last block again)."""
    p, r = comm.size, comm.rank
    whole = np.arange(per_rank * p * 1024, dtype="<f4").reshape(per_rank * p, 1024)
    lay = Subarray(whole.shape, (per_rank * r, 0), (per_rank, 1024), "<f4")
    mine_rows = whole[per_rank * r : per_rank * (r + 1)]
    ckpt.save(path, {"w": (mine_rows.copy(), lay), "v": (-mine_rows, lay)}, comm=comm)
    n = max(p - 1, 1)
    rows = [per_rank * p * k // n for k in range(n + 1)]
    mine = min(r, n - 1)
    spec = {"w": Subarray(whole.shape, (rows[mine], 0), (rows[mine + 1] - rows[mine], 1024),
                          "<f4")}  # fmt: skip
    return whole, rows, mine, spec


@pytest.mark.mpi
def test_pieces_across_the_saving_ranks_regions_map_in_place(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Rows of one page each, saved by every rank (each rank's rows in its own region of
    the file), loaded in other row blocks (split over one rank fewer): a piece across
    regions is mapped part by part in place, byte for byte, and a byte flipped in its
    second part is found on every rank."""
    path = _path(comm, mpi_tmp_path)
    p, r = comm.size, comm.rank
    whole, rows, mine, spec = _save_rows_load_fewer(comm, path, 12)
    got = ckpt.load(path, spec, comm=comm, hints=MAP)["w"]
    assert got.tobytes() == whole[rows[mine] : rows[mine + 1]].tobytes()
    lo = rows[mine] * 4096
    runs = ckpt.info(path).file_runs("w", lo, rows[mine + 1] * 4096)
    assert model.mapped(got) and len(runs) == (1 if p == 1 else 2), runs
    del got
    comm.Barrier()  # (every rank done with its arrays: a mapped one shows the flip)
    if r == 0 and p > 1:  # (rank 0's piece: its second part, in rank 1's region)
        at = ckpt.info(path).file_offset("w", rows[1] * 4096 - 5)
        _flip(path, at)
    comm.Barrier()
    if p > 1:
        err = raises_everywhere(
            comm, collio.ChecksumError, lambda: ckpt.load(path, spec, comm=comm, hints=MAP)
        )
        assert err.names == ("w",)


@pytest.mark.mpi
def test_long_parts_of_pieces_across_regions_lie_on_the_files_huge_page_grid(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Rows of 3 MiB per saving rank (each rank's rows of two arrays in its region)
    loaded over one rank fewer: each piece across regions is right byte for byte, and
    its longest part lies at the same offset modulo a huge page in memory as in the
    file (the kernel may then map it a huge page at a time)."""
    from collio.checkpoint.filemap import HUGE

    path = _path(comm, mpi_tmp_path)
    p = comm.size
    whole, rows, mine, spec = _save_rows_load_fewer(comm, path, 768)
    got = ckpt.load(path, spec, comm=comm, hints=MAP)["w"]
    assert got.tobytes() == whole[rows[mine] : rows[mine + 1]].tobytes()
    runs = ckpt.info(path).file_runs("w", rows[mine] * 4096, rows[mine + 1] * 4096)
    if p > 1:
        k = max(range(len(runs)), key=lambda j: runs[j][1])
        at, length = runs[k]
        within = sum(n for _, n in runs[:k])  # (where that part starts in the piece)
        assert length >= HUGE and model.mapped(got)
        assert (got.ctypes.data + within - at) % HUGE == 0, (got.ctypes.data, runs)
    del got
    comm.Barrier()


#: Arrays whose row shards are 2 MiB or more on every saving rank (``PLACE_MIN``): "a"'s
#: rows of 4000 bytes start its pieces off the page grid, "b"'s (uneven) off the huge
#: page grid; "small"'s pieces between them keep the page grid.
LARGE = {"a": ((601, 1000), "<f4"), "small": ((3, 5), "<f8"), "b": ((640, 1024), "<f4")}


def _save_large_rows(comm: MPI.Intracomm, path: str) -> dict[str, Any]:
    """Collective: save :data:`LARGE` in row shards over every rank; the whole arrays."""
    from collio import layouts

    p, r = comm.size, comm.rank
    whole, state = {}, {}
    for i, (name, ((rows, cols), dtype)) in enumerate(LARGE.items()):
        shape = (rows * p + (3 if name == "b" else 0), cols)
        whole[name] = (np.arange(shape[0] * cols, dtype=dtype) * (i + 1)).reshape(shape)
        lay = layouts.block(shape, dtype, grid=(p, 1), rank=r, size=p)
        state[name] = (whole[name][lay.start[0] : lay.start[0] + lay.shape[0]].copy(), lay)
    ckpt.save(path, state, comm=comm)
    return whole


def _fewer_rows(comm: MPI.Intracomm, whole: dict[str, Any]) -> dict[str, Any]:
    """Row blocks over one rank fewer (the last rank loads the last block again)."""
    from collio import layouts

    n = max(comm.size - 1, 1)
    return {
        name: layouts.block(w.shape, w.dtype, grid=(n, 1), rank=min(comm.rank, n - 1), size=n)
        for name, w in whole.items()
    }


@pytest.mark.mpi
@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_large_row_shards_load_in_other_decompositions(
    comm: MPI.Intracomm, mpi_tmp_path: Any, maps: str
) -> None:
    """Row shards of 2 MiB or more per saving rank (placed for huge pages, the gaps
    before them holes) load byte for byte in row blocks over one rank fewer, in row
    blocks shifted by one, in column blocks and whole, mapped or read."""
    from collio import layouts

    path = _path(comm, mpi_tmp_path)
    whole = _save_large_rows(comm, path)
    p, r = comm.size, comm.rank
    shifted = {
        n: layouts.block(w.shape, w.dtype, grid=(p + 1, 1), rank=r + 1, size=p + 1)
        for n, w in whole.items()
    }
    cols = {
        n: layouts.block(w.shape, w.dtype, grid=(1, p), rank=r, size=p) for n, w in whole.items()
    }
    hints = {"checkpoint_map": maps}
    for spec in (_fewer_rows(comm, whole), shifted, cols, dict.fromkeys(whole)):
        got = ckpt.load(path, spec, comm=comm, hints=hints)
        for name, lay in spec.items():
            want = whole[name] if lay is None else whole[name][lay.slices]
            assert got[name].tobytes() == want.tobytes(), (r, name, lay)
        del got


@pytest.mark.mpi
def test_large_pieces_lie_on_the_huge_page_grid_of_their_arrays(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Each saving rank's piece of 2 MiB or more starts at the same offset modulo a huge
    page in the file as in its array (the smaller ones on a page boundary), so a piece
    loaded across several saving ranks' pieces is mapped with every part at the same
    offset modulo a huge page in memory as in the file."""
    from collio.checkpoint.format import ALIGN, HUGE_PAGE, PLACE_MIN

    path = _path(comm, mpi_tmp_path)
    whole = _save_large_rows(comm, path)
    info = ckpt.info(path)
    p = comm.size
    for name, w in whole.items():
        row = w.shape[1] * w.itemsize
        edges = [w.shape[0] * k // p * row for k in range(p + 1)]  # (block's row split)
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            at = info.file_offset(name, lo)
            if hi - lo >= PLACE_MIN and lo % ALIGN == 0:
                assert at % HUGE_PAGE == lo % HUGE_PAGE, (name, lo, at)
            else:
                assert at % ALIGN == 0, (name, lo, at)
    spec = _fewer_rows(comm, whole)
    got = ckpt.load(path, spec, comm=comm, hints=MAP)
    for name, lay in spec.items():
        assert got[name].tobytes() == whole[name][lay.slices].tobytes(), name
        if name != "b":  # (pieces of "a" across saving ranks share pages: read; "small"'s
            continue  # are off the huge page grid)
        lo = lay.start[0] * whole[name].shape[1] * whole[name].itemsize
        runs = info.file_runs(name, lo, lo + got[name].nbytes)
        if len(runs) < 2:  # (one range of the file: mapped whole, where the kernel chose)
            continue
        assert model.mapped(got[name]), name
        within = 0
        for at, length in runs:
            if length >= HUGE_PAGE:
                assert (got[name].ctypes.data + within - at) % HUGE_PAGE == 0, (name, runs)
            within += length
    del got
    comm.Barrier()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("hints", [None, MAP])
def test_dtypes_without_a_buffer_load_and_are_checked(
    comm: MPI.Intracomm, mpi_tmp_path: Any, hints: Any
) -> None:
    """Datetimes, which the buffer protocol refuses (their bytes are checksummed through
    numpy's byte view instead), row shards in 'C' and 'F' order beside them: loaded
    into the job's arrays, into new (or mapped) ones and whole on every rank, byte for
    byte; a byte flipped in the datetimes raises on every rank, naming them."""
    from collio import layouts

    path = _path(comm, mpi_tmp_path)
    p, r = comm.size, comm.rank
    t = (np.arange(8 * p * 3, dtype="<i8") * 977).astype("<M8[s]").reshape(8 * p, 3)
    d = np.arange(5, dtype="<i8").astype("<m8[ns]")
    f = np.asfortranarray(np.arange(6.0 * 4 * p).reshape(6, 4 * p))
    lt = layouts.block(t.shape, t.dtype, comm=comm, grid=(p, 1))
    lf = layouts.block(f.shape, f.dtype, comm=comm, grid=(1, p), order="F")
    state = {"t": (np.ascontiguousarray(t[lt.slices]), lt), "d": d,
             "f": (np.asfortranarray(f[lf.slices]), lf)}  # fmt: skip
    ckpt.save(path, state, comm=comm)
    want = {"t": t[lt.slices].tobytes(), "d": d.tobytes(), "f": f[lf.slices].tobytes("F")}
    into = {"t": np.zeros_like(state["t"][0]), "d": np.zeros_like(d),
            "f": np.zeros_like(state["f"][0], order="F")}  # fmt: skip
    spec = {"t": (into["t"], lt), "d": (into["d"], None), "f": (into["f"], lf)}
    got = ckpt.load(path, spec, comm=comm, hints=hints)
    assert all(got[k] is into[k] for k in into)
    assert {k: v.tobytes("A") for k, v in got.items()} == want
    new = ckpt.load(path, {"t": lt, "d": None, "f": lf}, comm=comm, hints=hints)
    assert {k: v.tobytes("A") for k, v in new.items()} == want
    whole = ckpt.load(path, {"t": None, "f": None}, comm=comm, hints=hints)
    assert whole["t"].tobytes() == t.tobytes() and whole["f"].tobytes("F") == f.tobytes("F")
    del new, whole  # (mapped arrays would show the flip)
    gc.collect()
    comm.Barrier()
    if r == 0:
        _flip(path, ckpt.info(path).file_offset("t", t.nbytes - 3))  # (the last rank's rows)
    comm.Barrier()
    for spec_ in (spec, {"t": lt, "d": None}, {"t": None}):
        err = raises_everywhere(
            comm, collio.ChecksumError, lambda s=spec_: ckpt.load(path, s, comm=comm, hints=hints)
        )
        assert err.names == ("t",)
