"""``write_all_many`` / ``read_all_many``: many arrays in one collective call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import local_piece, raises_everywhere, read_file, reference, segments_for
from mpi4py import MPI

import collio
from collio import layouts
from collio.testing.guarded import guarded_like
from collio.testing.romio import romio_write
from collio.testing.views import romio_view_write

#: Where each item's global array starts in the file (bytes), with gaps between them.
BASES = (0, 20_000, 24_000, 30_000, 36_000, 40_000)
SIZE = 44_000


def _items(comm: MPI.Intracomm) -> list[tuple[str, Any, Any]]:
    """(kind, data, layout) of a batch mixing every layout kind; rank 1 holds nothing of
    the segments and of the last subarray, and the datatype view is a vector of doubles."""
    p, r = comm.size, comm.rank
    out: list[tuple[str, Any, Any]] = []
    g1 = reference((37, 45), "<f8", seed=1)
    lay: Any = layouts.block((37, 45), "<f8", comm=comm, offset=BASES[0])
    out.append(("block", local_piece(g1, lay), lay))
    g2 = reference((7, 9, 11), "<i2", seed=2)
    lay = layouts.block_cyclic(
        (7, 9, 11), "<i2", block=2, grid=layouts.dims_create(p, 3), comm=comm,
        order="F", offset=BASES[1],
    )  # fmt: skip
    out.append(("cyclic", local_piece(g2, lay), lay))
    g3 = reference((10, 4 * p), "<i4", seed=3)
    lay = layouts.Subarray((10, 4 * p), (2, 4 * r), (7, 4), "<i4", order="F", offset=BASES[2])
    out.append(("subarray", local_piece(g3, lay), lay))
    seg = segments_for(comm, 5000, seed=4)
    seg = layouts.Segments(seg.offsets + BASES[3], seg.lengths)
    raw = np.random.default_rng(10 + r).integers(0, 256, seg.nbytes, np.uint8)
    out.append(("segments", raw, seg))
    ft = MPI.DOUBLE.Create_vector(6, 2, 2 * p).Commit()
    try:
        lay = layouts.from_datatype(ft, disp=BASES[4] + 16 * r)
    finally:
        ft.Free()
    out.append(("datatype", np.arange(12, dtype="f8") + 100 * r, lay))
    n = 0 if r == 1 else 17
    lay = layouts.Subarray((17 * p,), (17 * r,), (n,), "<f8", offset=BASES[5])
    out.append(("empty-on-1", np.full(n, r + 0.5), lay))
    return out


def _romio(path: str, kind: str, data: Any, lay: Any, comm: MPI.Intracomm) -> None:
    """Write one item through ROMIO (mpi4py ``MPI.File``)."""
    if kind == "datatype":
        ft = MPI.DOUBLE.Create_vector(6, 2, 2 * comm.size).Commit()
        try:
            romio_view_write(path, BASES[4] + 16 * comm.rank, MPI.DOUBLE, ft, data, comm)
        finally:
            ft.Free()
    else:
        romio_write(path, data, lay, comm)


def _covered(comm: MPI.Intracomm, lays: list[Any]) -> np.ndarray[Any, Any]:
    """Bytes some rank's item covers (ROMIO leaves the rest of a new file undefined)."""
    mine = np.zeros(SIZE, np.uint8)
    for lay in lays:
        r = lay.runs()
        for f, n in zip(r.file.tolist(), r.length.tolist(), strict=True):
            mine[f : f + n] = 1
    every = np.empty_like(mine)
    comm.Allreduce(mine, every, op=MPI.MAX)
    return every.astype(bool)


def _prefill(comm: MPI.Intracomm, paths: list[str]) -> None:
    if comm.rank == 0:
        for path in paths:
            with open(path, "wb") as fh:
                fh.write(b"\xee" * SIZE)
    comm.Barrier()


def _guarded_items(items: list[tuple[str, Any, Any]]) -> list[tuple[Any, Any]]:
    """The items' data in memory with inaccessible pages between them (and in reverse
    address order): a call that touched any byte between them would fault."""
    datas = guarded_like([d for _, d, _ in items])
    return list(zip(datas, [lay for _, _, lay in items], strict=True))


@pytest.mark.mpi
@pytest.mark.parametrize(
    "hints",
    [
        {},
        {"cb_buffer_size": 4096, "cb_nodes": 2},
        {"romio_cb_write": "disable", "romio_cb_read": "disable"},
        {"romio_cb_read": "disable", "mapped_reads": "enable"},
    ],
)
def test_mixed_batch_matches_single_calls_and_romio(comm, mpi_tmp_path, hints):
    items = _items(comm)
    many, single, romio = (str(mpi_tmp_path / f"{n}.bin") for n in ("many", "single", "romio"))
    _prefill(comm, [many, single])
    with collio.open(many, "r+", comm=comm, hints=hints) as f:
        f.write_all_many(_guarded_items(items))
        last = dict(f.stats.last_call)
        outs = guarded_like([np.zeros_like(d) for _, d, _ in items])
        back = f.read_all_many([lay for _, _, lay in items], out=outs)
    for (kind, data, _), got, out in zip(items, back, outs, strict=True):
        assert got is out
        np.testing.assert_array_equal(got, data, err_msg=kind)
    assert last["items"] == len(items)
    want_runs = comm.allreduce(sum(len(lay.runs()) for _, _, lay in items))
    assert 0 < last["runs"] <= want_runs
    _same_as_single_calls_and_romio(comm, items, many, single, romio, hints)


def _same_as_single_calls_and_romio(comm, items, many, single, romio, hints):
    """The batch's file ``many`` equals the same items written one call each (``single``)
    and, where an item covers it, ROMIO's (``romio``); bytes no item covers keep the
    prefill."""
    with collio.open(single, "r+", comm=comm, hints=hints) as f:
        for _, data, lay in items:
            f.write_all(data, lay)
    for kind, data, lay in items:
        _romio(romio, kind, data, lay, comm)
    comm.Barrier()
    ours, theirs = read_file(many), read_file(romio)
    assert ours == read_file(single)
    mask = _covered(comm, [lay for _, _, lay in items])
    a, b = np.frombuffer(ours, np.uint8), np.frombuffer(theirs, np.uint8)
    np.testing.assert_array_equal(a[: len(b)][mask[: len(b)]], b[mask[: len(b)]])
    assert (a[~mask] == 0xEE).all()  # bytes no item covers keep what was there


def _boxes(comm: MPI.Intracomm) -> list[tuple[str, Any, Any]]:
    """The batch's box and block-cyclic items only (each layout shape's runs made once and
    moved to every item of that shape), with two more items of the subarray's shape where
    the segments were, before it in item order and out of file order."""
    items = [it for it in _items(comm) if it[0] not in ("segments", "datatype")]
    p, r = comm.size, comm.rank
    g = reference((10, 4 * p), "<i4", seed=5)
    for at, base in ((1, BASES[3] + 3000), (2, BASES[3])):
        lay = layouts.Subarray((10, 4 * p), (2, 4 * r), (7, 4), "<i4", order="F", offset=base)
        items.insert(at, ("subarray-again", local_piece(g, lay) + at, lay))
    return items


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_buffer_size": 4096, "cb_nodes": 2}])
def test_box_batch_matches_single_calls_and_romio(comm, mpi_tmp_path, hints):
    items = _boxes(comm)
    many, single, romio = (str(mpi_tmp_path / f"{n}.bin") for n in ("many", "single", "romio"))
    _prefill(comm, [many, single])
    with collio.open(many, "r+", comm=comm, hints=hints) as f:
        f.write_all_many(_guarded_items(items))
        outs = guarded_like([np.zeros_like(d) for _, d, _ in items])
        back = f.read_all_many([lay for _, _, lay in items], out=outs)
        fresh = f.read_all_many([lay for _, _, lay in items])
    for (kind, data, _), got, new in zip(items, back, fresh, strict=True):
        np.testing.assert_array_equal(got, data, err_msg=kind)
        np.testing.assert_array_equal(new, data, err_msg=kind)
    _same_as_single_calls_and_romio(comm, items, many, single, romio, hints)


@pytest.mark.mpi
def test_one_plan_over_the_union(comm, mpi_tmp_path):
    """200 small items: one call, its rounds over the union (a window holds many items),
    and the same batch again reuses its plan."""
    n = 200
    lays = [layouts.Subarray((64 * comm.size,), (64 * comm.rank,), (64,), "<f4",
                             offset=k * 256 * comm.size) for k in range(n)]  # fmt: skip
    datas = [np.full(64, k + 0.25 * comm.rank, np.float32) for k in range(n)]
    path = str(mpi_tmp_path / "union.bin")
    with collio.open(path, "w", comm=comm, hints={"romio_cb_write": "enable"}) as f:
        f.write_all_many(list(zip(datas, lays, strict=True)))
        assert f.stats.last_call["rounds"] == 1 and f.stats.collective_calls == 1
        f.write_all_many(list(zip(datas, lays, strict=True)))
        assert f.stats.last_call["plan_reused"]
        outs = [np.zeros(64, np.float32) for _ in range(n)]
        f.read_all_many(lays, out=outs)
    for k in range(n):
        np.testing.assert_array_equal(outs[k], datas[k])
    if comm.rank == 0:
        got = np.fromfile(path, np.float32).reshape(n, comm.size, 64)
        want = np.arange(n)[:, None, None] + 0.25 * np.arange(comm.size)[None, :, None]
        np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))


def _ten(comm: MPI.Intracomm, path: str) -> list[tuple[Any, Any]]:
    items = []
    for k in range(3):
        lay = layouts.Subarray((8 * comm.size,), (8 * comm.rank,), (8,), "<i8",
                               offset=k * 64 * comm.size)  # fmt: skip
        items.append((np.full(8, 10 * k + comm.rank, np.int64), lay))
    with collio.open(path, "w", comm=comm) as f:
        f.write_all_many(items)
    return items


@pytest.mark.mpi
def test_errors_are_agreed_and_write_nothing(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "errors.bin")
    items = _ten(comm, path)
    before = read_file(path)
    last = comm.size - 1
    with collio.open(path, "r+", comm=comm) as f:
        # a different count on one rank: the same MismatchError, naming the counts
        if comm.size > 1:
            short = items[:2] if comm.rank == last else items
            err = raises_everywhere(comm, collio.MismatchError, lambda: f.write_all_many(short))
            assert f"rank {last}: 2" in str(err) and "numbers of items" in str(err)
        # a failing item on one rank: its index, the rank and the values
        bad = list(items)
        if comm.rank == last:
            bad[2] = (np.zeros(8, np.int32), items[2][1])
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all_many(bad),
                          match=f"rank {last}: item 2: data dtype int32")  # fmt: skip
        # one rank passing the same item twice, and items overlapping across ranks
        twice = [*items, items[0]] if comm.rank == last else [*items, (np.zeros(0), _none())]
        raises_everywhere(comm, collio.OverlapError, lambda: f.write_all_many(twice),
                          match="items 0 and 3 both write them")  # fmt: skip
        if comm.size > 1:
            nxt = (comm.rank + 1) % comm.size  # item 3 on rank r: item 0 of rank r + 1
            across = [
                *items,
                (
                    np.zeros(8, np.int64),
                    layouts.Subarray((8 * comm.size,), (8 * nxt,), (8,), "<i8"),
                ),
            ]
            raises_everywhere(comm, collio.OverlapError, lambda: f.write_all_many(across),
                              match="write_all_many: bytes [0, ")  # fmt: skip
        # not a sequence on one rank, layouts of another kind, a wrong out
        odd = iter(items) if comm.rank == last else items
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all_many(odd),
                          match="items must be a sequence")  # fmt: skip
        raises_everywhere(comm, collio.LayoutError,
                          lambda: f.read_all_many([lay for _, lay in items], out=[None]),
                          match="out must be a sequence of 3 arrays")  # fmt: skip
        # a read into one array twice (or into views that share memory), on one rank
        lays3 = [lay for _, lay in items]
        outs = [np.zeros(8, np.int64) for _ in lays3]
        if comm.rank == last:
            whole = np.zeros(12, np.int64)
            outs[0], outs[2] = whole[:8], whole[4:]
        raises_everywhere(comm, collio.LayoutError, lambda: f.read_all_many(lays3, out=outs),
                          match=f"rank {last}: items 0 and 2 read into arrays")  # fmt: skip
        # a write_all beside a write_all_many: a call mismatch
        if comm.size > 1:

            def mixed() -> None:
                if comm.rank == 0:
                    f.write_all(*items[0])
                else:
                    f.write_all_many(items)

            raises_everywhere(comm, collio.MismatchError, mixed, match="write_all_many")
    assert read_file(path) == before  # nothing was written
    with collio.open(path, "r+", comm=comm) as f:  # the file goes on
        f.write_all_many([(d + 1, lay) for d, lay in items])
        back = f.read_all_many([lay for _, lay in items])
    for (d, _), got in zip(items, back, strict=True):
        np.testing.assert_array_equal(got, d + 1)


def _none() -> Any:
    return layouts.Segments([], [])


@pytest.mark.mpi
def test_read_back_at_another_rank_count(comm, mpi_tmp_path):
    """A batch written by every rank, read by all but the last in one call."""
    shapes = [(37, 45), (16, 8), (5,)]
    globs = [reference(s, "<f8", seed=k) for k, s in enumerate(shapes)]
    offs = np.cumsum([0] + [g.nbytes for g in globs])
    path = str(mpi_tmp_path / "count.bin")

    def batch(c: MPI.Intracomm) -> list[Any]:
        return [
            layouts.block(s, "<f8", comm=c, offset=int(o))
            for s, o in zip(shapes, offs[:-1], strict=True)
        ]

    with collio.open(path, "w", comm=comm) as f:
        lays = batch(comm)
        f.write_all_many([(local_piece(g, lay), lay) for g, lay in zip(globs, lays, strict=True)])
    sub = comm.Split(0 if comm.rank < max(comm.size - 1, 1) else MPI.UNDEFINED, comm.rank)
    if sub == MPI.COMM_NULL:
        return
    try:
        with collio.open(path, "r", comm=sub) as f:
            lays = batch(sub)
            back = f.read_all_many(lays)
        for g, lay, got in zip(globs, lays, back, strict=True):
            np.testing.assert_array_equal(got, local_piece(g, lay))
    finally:
        sub.Free()


@pytest.mark.mpi
def test_zarr_batch_of_items_each_rank_stores_alone(comm, mpi_tmp_path):
    """Chunk-aligned items (every chunk one rank's box): the batch is stored and read back
    whole, though no single item's layout describes the call's runs; items of different
    memory orders are refused on every rank."""
    zarr = pytest.importorskip("zarr")
    p, r = comm.size, comm.rank
    path = str(mpi_tmp_path / "many.zarr")
    if r == 0:
        zarr.create_array(path, shape=(8 * p, 4), chunks=(4, 4), dtype="<f8", fill_value=0)
    comm.Barrier()
    lays = [layouts.Subarray((8 * p, 4), (8 * r + 4 * k, 0), (4, 4), "<f8") for k in (0, 1)]
    datas = guarded_like([np.full((4, 4), 10.0 * r + k) for k in (1, 2)])
    with collio.open(path, "r+", comm=comm) as f:
        f.write_all_many(list(zip(datas, lays, strict=True)))
        back = f.read_all_many(lays)
        fortran = layouts.Subarray((8 * p, 4), (8 * r, 0), (4, 4), "<f8", order="F")
        raises_everywhere(comm, collio.LayoutError,
                          lambda: f.write_all_many([(datas[0], lays[0]), (datas[1].T, fortran)]),
                          match="share one order")  # fmt: skip
    for got, want in zip(back, datas, strict=True):
        np.testing.assert_array_equal(got, want)
    # every element of the stored array: rank r's rows 8r..8r+3 hold 10r+1, 8r+4..8r+7 10r+2
    rows = np.repeat(10.0 * np.arange(p)[:, None] + [1, 2], 4).reshape(-1)
    want = np.repeat(rows[:, None], 4, axis=1)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)


@pytest.mark.mpi
def test_box_batch_signatures_agree_across_the_checks(comm, mpi_tmp_path):
    """Ranks whose items take the per-item checks (the last rank's data is not contiguous)
    agree with ranks whose box items share templates; an item whose global array differs
    on one rank is named on every rank."""
    path = str(mpi_tmp_path / "sigs.bin")
    items = _ten(comm, path)
    last = comm.size - 1
    mine = list(items)
    if comm.rank == last:
        mine = [(np.repeat(d, 2)[::2], lay) for d, lay in items]  # (strided views)
        assert not mine[0][0].flags.c_contiguous
    with collio.open(path, "r+", comm=comm) as f:
        f.write_all_many([(d + 5, lay) for d, lay in mine])
        back = f.read_all_many([lay for _, lay in items])
        if comm.size > 1:
            odd = list(items)
            if comm.rank == last:
                d, lay = items[1]
                wide = layouts.Subarray((8 * comm.size + 1,), (8 * comm.rank,), (8,), "<i8",
                                        offset=lay.offset)  # fmt: skip
                odd[1] = (d, wide)
            raises_everywhere(comm, collio.MismatchError, lambda: f.write_all_many(odd),
                              match="disagree on the global array of item 1")  # fmt: skip
            # (item 1 as byte runs on the last rank: named as such, not left out)
            runs = list(items)
            if comm.rank == last:
                d, lay = items[1]
                r = lay.runs()
                runs[1] = (d.view(np.uint8), layouts.Segments(r.file.tolist(), r.length.tolist()))
            err = raises_everywhere(comm, collio.MismatchError, lambda: f.write_all_many(runs))
            assert str(err).endswith(
                f"of item 1: rank 0 has global shape ({8 * comm.size},) dtype <i8 order C offset "
                f"{items[1][1].offset}; rank {last}: byte runs (Segments or a view), no global "
                "array"
            ), str(err)
        # (the refused batches held the items' old values: none of them was written)
        kept = f.read_all_many([lay for _, lay in items])
    for (d, _), got, now in zip(items, back, kept, strict=True):
        np.testing.assert_array_equal(got, d + 5)
        np.testing.assert_array_equal(now, d + 5)
