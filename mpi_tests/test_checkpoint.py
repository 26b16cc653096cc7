"""``collio.checkpoint``: save, load in other decompositions, checksums, commit, async."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts
from collio.checkpoint import format
from collio.checkpoint.filemap import Reader
from collio.checkpoint.load import CHUNK
from collio.testing import checkpoint as model


def _path(comm: MPI.Intracomm, tmp: Any, name: str = "model.ckpt") -> str:
    return str(comm.bcast(os.path.join(str(tmp), name), root=0))


def _check_loaded(
    comm: MPI.Intracomm, got: dict[str, Any], spec: dict[str, Any], maps: bool | None = None,
    path: str = "",
) -> None:  # fmt: skip
    """Every array byte for byte; with ``maps``, mapped exactly where its piece is one range
    of the file (of its array, within one of the array's chunks)."""
    assert sorted(got) == sorted(spec)
    for name, lay in spec.items():
        want = model.expected(name, lay)
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        assert got[name].tobytes(order="A") == want.tobytes(order="A"), (comm.rank, name)
        if maps is not None:
            one = model.one_range(name, lay) and model.mappable(path, name, lay)
            assert model.mapped(got[name]) == (maps and one), (comm.rank, name, one)


@pytest.mark.mpi
@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_save_then_load_in_other_decompositions(
    comm: MPI.Intracomm, mpi_tmp_path: Any, maps: str
) -> None:
    """Every decomposition, mapped (pieces that are one range) or read into new arrays."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm, metadata={"step": 7})
    hints = {"checkpoint_map": maps}
    spec = model.load_spec(comm.rank, comm.size)
    got = ckpt.load(path, spec, comm=comm, hints=hints)
    _check_loaded(comm, got, spec, maps == "enable", path)
    same = {n: lay for n, lay in model.save_layouts(comm.rank, comm.size).items()}
    got = ckpt.load(path, same, comm=comm, hints=hints)
    _check_loaded(comm, got, same, maps == "enable", path)
    if maps == "enable":  # (the saving decomposition: every piece that is one range mapped)
        ones = [n for n, lay in same.items() if model.one_range(n, lay)]
        assert ones and all(model.mapped(got[n]) for n in ones), (comm.rank, ones)


@pytest.mark.mpi
def test_layers_of_repeated_shapes_load_in_other_decompositions(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A model's layers repeat a few shapes, and a load works out each distinct shape's
    pieces once: arrays of two shapes, interleaved in name order (and a third shape
    between them), saved as row blocks, loaded as column blocks, as 2-D blocks, into
    the job's arrays and whole, byte for byte."""
    path = _path(comm, mpi_tmp_path)
    p, r = comm.size, comm.rank
    shapes = {f"layer{k}/{w}": s for k in range(3) for w, s in (("a", (12, 8)), ("b", (7, 10)))}
    shapes["layer1/c"] = (5, 9)
    ref = {
        n: (np.arange(np.prod(s), dtype="<f8") * (i + 1)).reshape(s)
        for i, (n, s) in enumerate(sorted(shapes.items()))
    }

    def part(n: str, lay: Any) -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(ref[n][lay.slices])

    rows = {n: layouts.block(s, "<f8", grid=(p, 1), rank=r, size=p) for n, s in shapes.items()}
    ckpt.save(path, {n: (part(n, lay), lay) for n, lay in rows.items()}, comm=comm)
    for grid in ((1, p), layouts.dims_create(p, 2)):
        spec = {n: layouts.block(s, "<f8", grid=grid, rank=r, size=p) for n, s in shapes.items()}
        got = ckpt.load(path, spec, comm=comm)
        for n, lay in spec.items():
            assert got[n].tobytes() == part(n, lay).tobytes(), (r, n, grid)
        into = {n: (np.zeros(lay.local_shape), lay) for n, lay in spec.items()}
        got = ckpt.load(path, into, comm=comm)
        for n, lay in spec.items():
            assert got[n] is into[n][0] and got[n].tobytes() == part(n, lay).tobytes(), (r, n)
    got = ckpt.load(path, dict.fromkeys(shapes), comm=comm)
    assert all(got[n].tobytes() == ref[n].tobytes() for n in shapes), r


@pytest.mark.mpi
def test_file_holds_each_array_at_its_runs(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """info needs no MPI, and the bytes at each array's file runs are the global array."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm, metadata={"step": 7})
    if comm.rank == 0:
        meta = ckpt.info(path)
        assert meta.metadata == {"step": 7}
        names = sorted([*model.GLOBALS, *model.REPLICATED])
        assert sorted(meta) == names
        for name in names:
            want = model.reference(name)
            entry = meta[name]
            assert entry["shape"] == want.shape and entry["dtype"] == want.dtype
            raw = model.stored(path, name)
            order = entry["order"]
            assert raw == want.tobytes(order=order), name
    comm.Barrier()


@pytest.mark.mpi
@pytest.mark.parametrize(("name", "maps"), [("attn/q", "disable"), ("ffn/w", "enable"),
                                            ("norm", "enable")])  # fmt: skip
def test_flipped_byte_names_the_array_on_every_rank(
    comm: MPI.Intracomm, mpi_tmp_path: Any, name: str, maps: str
) -> None:
    """A flipped byte of a block-cyclic piece (read), of row blocks saved block-cyclic
    (mapped, extents across pieces checked from the parts) or of a whole array on every
    rank (mapped on each, each extent checked by one rank): the same error everywhere,
    and the other arrays load."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    if comm.rank == 0:
        entry = ckpt.info(path)[name]
        model.flip(path, ckpt.info(path).file_offset(name, entry["nbytes"] // 2), 0x10)
    comm.Barrier()
    spec = model.load_spec(comm.rank, comm.size)
    hints = {"checkpoint_map": maps}
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, spec, comm=comm, hints=hints)
    )
    assert err.names == (name,) and f"'{name}'" in str(err)
    intact = {n: lay for n, lay in spec.items() if n != name}
    _check_loaded(comm, ckpt.load(path, intact, comm=comm, hints=hints), intact)


@pytest.mark.mpi
@pytest.mark.parametrize("damage", ["truncate", "garbage", "index"])
def test_damaged_target_is_an_agreed_error(
    comm: MPI.Intracomm, mpi_tmp_path: Any, damage: str
) -> None:
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    if comm.rank == 0:
        size = os.path.getsize(path)
        if damage == "truncate":
            os.truncate(path, size - 100)
        elif damage == "garbage":
            with open(path, "wb") as fh:
                fh.write(os.urandom(size))
        else:  # one byte of the JSON index
            with open(path, "r+b") as fh:
                fh.seek(size - 80)
                fh.write(b"~")
    comm.Barrier()
    spec = {"embed": model.load_spec(comm.rank, comm.size)["embed"]}
    raises_everywhere(comm, collio.ChecksumError, lambda: ckpt.load(path, spec, comm=comm))


@pytest.mark.mpi
def test_failing_save_keeps_the_previous_checkpoint(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    state = model.save_state(comm.rank, comm.size)
    if comm.rank == comm.size - 1:  # one rank's bad entry: a piece of the wrong shape
        data, lay = state["embed"]
        state["embed"] = (np.zeros((data.shape[0] + 1, 24), "<f4"), lay)
    raises_everywhere(comm, collio.LayoutError, lambda: ckpt.save(path, state, comm=comm))
    if comm.size > 1:
        state = model.save_state(comm.rank, comm.size)
        state["extra"] = np.zeros(3) if comm.rank == 0 else np.zeros(4)  # ranks disagree
        raises_everywhere(comm, collio.MismatchError, lambda: ckpt.save(path, state, comm=comm))
    if comm.rank == 0:
        assert read_file(path) == before
        assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    spec = model.load_spec(comm.rank, comm.size)
    _check_loaded(comm, ckpt.load(path, spec, comm=comm), spec)


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_metadata_differing_between_ranks_is_refused(
    comm: MPI.Intracomm, mpi_tmp_path: Any, how: str
) -> None:
    """Metadata that differs between ranks: rank 0's was stored without a word; now the
    same MismatchError on every rank naming the ranks that differ and both values, the
    previous checkpoint as it was.  Equal mappings in another key order agree."""
    r, p = comm.rank, comm.size
    path = _path(comm, mpi_tmp_path)
    a = np.arange(12.0).reshape(3, 4)
    ckpt.save(path, {"a": a}, comm=comm, metadata={"step": 1})
    before = read_file(path) if r == 0 else b""

    def save(meta: Any) -> None:
        if how == "save":
            ckpt.save(path, {"a": a + 1}, comm=comm, metadata=meta)
        else:
            ckpt.async_save(path, {"a": a + 1}, comm=comm, metadata=meta).wait()

    if p > 1:
        odd = [k for k in range(p) if k % 2]
        named = "; ".join(
            f'rank {k}: metadata {{"step": 3}} differs from rank 0\'s {{"step": 2}}' for k in odd
        )
        error = raises_everywhere(
            comm, collio.MismatchError, lambda: save({"step": 2 + r % 2}),
            match=f"checkpoint.save: {named}",
        )  # fmt: skip
        assert error.ranks == tuple(odd)
        raises_everywhere(
            comm, collio.MismatchError, lambda: save(None if r == p - 1 else {"step": 2}),
            match=f'rank {p - 1}: metadata null differs from rank 0\'s {{"step": 2}}',
        )  # fmt: skip
        if r == 0:
            assert read_file(path) == before
            assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
        assert ckpt.info(path, comm=comm).metadata == {"step": 1}
        np.testing.assert_array_equal(ckpt.load(path, {"a": None}, comm=comm)["a"], a)
    save({"x": 1, "step": 4} if r % 2 else {"step": 4, "x": 1})
    assert ckpt.info(path, comm=comm).metadata == {"step": 4, "x": 1}
    np.testing.assert_array_equal(ckpt.load(path, {"a": None}, comm=comm)["a"], a + 1)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_mappings_without_arrays_are_not_stored(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A checkpoint stores arrays by their '/' names: a nested mapping holding none
    (``{"opt": {}}``, an optimizer before its first step) has no name there, as the README
    and the format say; info lists the arrays alone, a load naming it is the same
    LayoutError on every rank, and the arrays beside it load byte for byte."""
    path = _path(comm, mpi_tmp_path)
    rows = layouts.block((4 * comm.size, 3), "<i4", comm=comm, grid=(comm.size, 1))
    g = np.arange(12 * comm.size, dtype="<i4").reshape(4 * comm.size, 3)
    step = np.arange(5.0)
    state = {"opt": {}, "model": {"w": (g[rows.slices], rows), "extra": {"none": {}}}, "s": step}
    ckpt.save(path, state, comm=comm)
    assert sorted(ckpt.info(path, comm=comm)) == ["model/w", "s"]
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, {"opt": None}, comm=comm),
        match="array 'opt' is not in the checkpoint",
    )  # fmt: skip
    back = ckpt.load(path, {"model/w": None, "s": None}, comm=comm)
    assert back["model/w"].tobytes() == g.tobytes() and back["s"].tobytes() == step.tobytes()


@pytest.mark.mpi
def test_unknown_name_or_other_shape_raises_everywhere(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, {"nope": None}, comm=comm), match="nope"
    )
    lay = layouts.block((97, 25), "<f4", comm=comm)
    raises_everywhere(
        comm,
        collio.LayoutError,
        lambda: ckpt.load(path, {"embed": lay}, comm=comm),
        match="(97, 25)",
    )
    lay = layouts.block((97, 24), "<f8", comm=comm)
    raises_everywhere(comm, collio.LayoutError, lambda: ckpt.load(path, {"embed": lay}, comm=comm))


@pytest.mark.mpi
def test_specs_naming_other_arrays_on_one_rank_raise_everywhere(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    names = sorted(ckpt.info(path)) if comm.rank == 0 else None
    names = comm.bcast(names)
    last = comm.rank == comm.size - 1
    more = {n: None for n in names[:3]} if last else {n: None for n in names[:2]}
    raises_everywhere(
        comm, collio.MismatchError, lambda: ckpt.load(path, more, comm=comm), match="3 arrays"
    )
    other = {names[2]: None} if last else {names[1]: None}  # as many, not the same
    raises_everywhere(
        comm, collio.MismatchError, lambda: ckpt.load(path, other, comm=comm), match="other arrays"
    )
    got = ckpt.load(path, {names[1]: None}, comm=comm)  # the process goes on
    whole = ckpt.load(path, {names[1]: None}, comm=MPI.COMM_SELF)
    assert got[names[1]].tobytes() == whole[names[1]].tobytes()


@pytest.mark.mpi
def test_async_save_holds_the_values_at_the_call(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    path = _path(comm, mpi_tmp_path)
    state = model.save_state(comm.rank, comm.size)
    h = ckpt.async_save(path, state, comm=comm, metadata={"step": 1})
    for part in (state["embed"][0], state["attn"]["q"][0], state["rep"]["scale"]):
        part[...] = -1  # overwritten at once: the checkpoint keeps the values at the call
    total = 0.0
    for _ in range(20):  # the user's own collectives on their communicator, meanwhile
        total += comm.allreduce(1.0)
    assert total == 20 * comm.size
    other = _path(comm, mpi_tmp_path, "other.bin")  # and collio's, on the same communicator
    with collio.open(other, "w", comm=comm) as f:
        f.write_all(np.full(4, comm.rank, "<i8"), layouts.block((4 * comm.size,), "<i8", comm=comm))
    h.wait()
    assert h.done()
    spec = model.load_spec(comm.rank, comm.size)
    # the first save's own content, before later saves replace it: the values at the call
    _check_loaded(comm, ckpt.load(path, spec, comm=comm), spec)
    again = ckpt.async_save(path, model.save_state(comm.rank, comm.size), comm=comm)
    third = ckpt.async_save(path, model.save_state(comm.rank, comm.size), comm=comm)  # waits
    assert again.done()
    third.wait()
    _check_loaded(comm, ckpt.load(path, spec, comm=comm), spec)


@pytest.mark.mpi
def test_async_save_error_is_raised_by_wait(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    path = _path(comm, mpi_tmp_path, "missing-dir/model.ckpt")
    h = ckpt.async_save(path, model.save_state(comm.rank, comm.size), comm=comm)
    raises_everywhere(comm, collio.BackendError, h.wait)
    assert h.done()


@pytest.mark.mpi
def test_torch_cpu_tensor(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    path = _path(comm, mpi_tmp_path)
    lay = layouts.block((64, 8), "<f4", grid=(comm.size, 1), comm=comm)
    glob = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
    local = glob[lay.slices].contiguous()
    ckpt.save(path, {"w": (local, lay), "b": torch.ones(3)}, comm=comm)
    got = ckpt.load(path, {"w": None, "b": None}, comm=comm)
    assert got["w"].tobytes() == glob.numpy().tobytes()
    assert got["b"].tobytes() == np.ones(3, "<f4").tobytes()


@pytest.mark.mpi
def test_benchmark_stops_every_rank_when_the_resharded_load_fails(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The benchmark times a load on all ranks but the last: when it fails there, every
    rank of the job raises that error (the last one does not wait in the timing's
    allreduce for ranks that never come), and the job goes on."""
    from collio.bench.checkpoint import _timed

    missing = _path(comm, mpi_tmp_path, "missing.ckpt")
    sub = comm.Split(0 if comm.rank < max(comm.size - 1, 1) else MPI.UNDEFINED, comm.rank)

    def load_sub() -> None:
        if sub != MPI.COMM_NULL:
            ckpt.load(missing, {"w": None}, comm=sub)

    try:
        err = raises_everywhere(comm, collio.CollioError, lambda: _timed(comm, load_sub))
    finally:
        if sub != MPI.COMM_NULL:
            sub.Free()
    assert "missing.ckpt" in str(err) and "rank 0" in str(err)
    assert _timed(comm, lambda: None) >= 0.0


@pytest.mark.mpi
def test_benchmark_ranks_done_first_wait_without_a_core(comm: MPI.Intracomm) -> None:
    """The benchmark's figure is the slowest rank's time, the same on every rank, and
    the ranks done first wait sleeping: a rank outside the resharded load must not
    take a core from the ranks still loading (on a machine with fewer cores than
    ranks it would measure them on one core less)."""
    import time

    from collio.bench.checkpoint import _timed

    slow = 0.3
    cpu = time.process_time()
    got = _timed(comm, lambda: time.sleep(slow) if comm.rank == 0 else None)
    cpu = time.process_time() - cpu
    assert got >= slow
    assert comm.allgather(got) == [got] * comm.size
    if comm.rank != 0:
        assert cpu < slow / 3, f"rank {comm.rank} used {cpu:.3f} s of CPU waiting {slow} s"


@pytest.mark.mpi
def test_benchmark_save_without_checksums_differs_in_them_alone(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The benchmark's save without checksums (what they cost a save) writes the same
    data at the same places, only its checksums are zeros: every load of it is refused,
    the same error on every rank naming every array with bytes; the switch is back on."""
    from collio.bench.checkpoint import _Run
    from collio.checkpoint import writer

    state = model.save_state(comm.rank, comm.size)
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, state, comm=comm)
    run = _Run.__new__(_Run)  # (its save alone: no model state, no timing)
    run.comm, run.state, run.path, run.hints = comm, state, path, {}
    run._unchecked()
    assert writer.CHECKSUMS
    bare = path + ".unchecked"
    failed = None
    if comm.rank == 0:  # (its failure told to every rank: none is left in a collective)
        try:
            a, b = ckpt.info(path), ckpt.info(bare)
            fa, fb = read_file(path), read_file(bare)
            assert fa is not None and fb is not None and fa != fb
            # (the same bytes up to the extent table; the JSON index after it may differ
            # in length, by the digits of the table's checksum)
            _, _, off, n, _, _ = format.TRAILER.unpack(fa[-format.TRAILER.size :])
            end = json.loads(fa[off : off + n])["extent_table"]["offset"]
            assert fa[:end] == fb[:end]
            for name in a:
                assert a.file_runs(name) == b.file_runs(name), name
                for off, n in a.file_runs(name):
                    assert fa[off : off + n] == fb[off : off + n], name
        except AssertionError as exc:
            failed = f"rank 0: {exc!r}"
    failed = comm.bcast(failed)
    assert failed is None, failed
    spec = model.load_spec(comm.rank, comm.size)
    err = raises_everywhere(comm, collio.ChecksumError, lambda: ckpt.load(bare, spec, comm=comm))
    full = {n for n in spec if ckpt.info(path)[n]["nbytes"] > 0}
    assert set(err.names) == full


@pytest.mark.mpi
def test_benchmark_verified_ceiling_read_sums_the_bytes_read(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The benchmark's verified ceiling read, whole or by chunk: the rank's share of the
    file in the buffer, and the save's checksum (zlib's CRC-32) of exactly those bytes;
    its mapped ceiling: the checksum of the same bytes."""
    from zlib import crc32

    from collio.bench import ckpt_peers as peers

    total = 3 * (1 << 20) + 12345  # (shares of odd sizes: a short last chunk)
    path = _path(comm, mpi_tmp_path, "ceiling.bin")
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(np.random.default_rng(7).integers(0, 256, total, np.uint8).tobytes())
    comm.Barrier()
    whole = read_file(path)
    assert whole is not None
    off, n = peers.share(total, comm)
    want = whole[off : off + n]
    for chunk in (0, 1 << 18, 4096):
        buf = np.zeros(n, np.uint8)
        got = peers.ceiling_read_crc(path, buf, total, comm, chunk)
        assert buf.tobytes() == want, chunk
        assert got == crc32(want), chunk
    # (the mapped ceiling: the same share's checksum, from a map at a share's unaligned start)
    assert peers.ceiling_map(path, total, comm) == crc32(want)
    assert peers.ceiling_map(path, 0, comm) == 0


@pytest.mark.mpi
def test_benchmark_controls_write_the_shares_and_agree(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The benchmark's controls: the plain write thread puts each rank's share at its
    offset, byte for byte, with no MPI in the thread; the loop beside a control thread
    gives every rank the same figures, and a control that fails on one rank raises on
    every rank (none waits in the figures' allreduce), the job going on."""
    import concurrent.futures

    from collio.bench import ckpt_peers as peers
    from collio.bench.checkpoint import BLOCKED, CPU, _Run

    total = 3 * (1 << 20) + 4321
    off, n = peers.share(total, comm)
    mine = np.random.default_rng(comm.rank).integers(0, 256, n, np.uint8)
    run = _Run.__new__(_Run)  # (its controls alone: no model state, no calibration)
    run.comm, run.work, run.reps = comm, np.ones(1 << 10), 1
    run.plain = _path(comm, mpi_tmp_path, "plain.bin")
    run.control = concurrent.futures.ThreadPoolExecutor(1)
    try:
        run._empty_plain()
        got = run._beside(
            "plain write",
            lambda: (time.sleep(0.05), peers.plain_write(run.plain, mine, total, comm.rank,
                                                          comm.size)),
            run._empty_plain,
        )  # fmt: skip
        assert set(got) == {
            "compute during plain write",
            f"{CPU}plain write",
            f"{BLOCKED}plain write",
        }
        assert comm.allgather(got) == [got] * comm.size
        assert got[f"{CPU}plain write"] >= 0.0
        # (the loop's blocked time is a part of the loop's own)
        assert 0.0 <= got[f"{BLOCKED}plain write"] <= got["compute during plain write"]
        every = comm.gather(mine.tobytes())
        failed = None
        if comm.rank == 0:
            stored = read_file(run.plain)
            if stored != b"".join(every or []):
                failed = f"the plain write's file differs ({len(stored or b'')} of {total} bytes)"
        failed = comm.bcast(failed)
        assert failed is None, failed

        def fail_on_last() -> None:
            time.sleep(0.05)
            if comm.rank == comm.size - 1:
                raise OSError(28, "no space left (one rank)")

        err = raises_everywhere(comm, collio.CollioError, lambda: run._beside("x", fail_on_last))
        assert f"rank {comm.size - 1}" in str(err)
        after = run._beside("thread copy", lambda: time.sleep(0.05))  # (the job goes on)
        assert set(after) == {
            "compute during thread copy",
            f"{CPU}thread copy",
            f"{BLOCKED}thread copy",
        }
    finally:
        run.control.shutdown()


def _record_paths(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, str]]:
    """The checkpoint's batch calls as they run: (call, disjoint, the path the call took)."""
    seen: list[tuple[str, bool, str]] = []
    for name in ("write_all_many", "read_all_many"):
        real = getattr(collio.File, name)

        def wrapped(self: collio.File, *a: Any, _f: Any = real, _n: str = name, **kw: Any) -> Any:
            out = _f(self, *a, **kw)
            seen.append((_n, bool(kw.get("_disjoint")), self.stats.last_call["path"]))
            return out

        monkeypatch.setattr(collio.File, name, wrapped)
    return seen


@pytest.mark.mpi
def test_row_shards_are_written_and_read_by_each_rank_directly(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row shards interleave the ranks in the file; each rank writes and reads its own
    pieces (no exchange), and the file holds every array whole, byte for byte."""
    path = _path(comm, mpi_tmp_path)
    seen = _record_paths(monkeypatch)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    if comm.size > 1:
        assert seen == [("write_all_many", True, "direct")], seen
    if comm.rank == 0:
        for name in model.ROWS:
            want = model.rows_reference(name)
            assert model.stored(path, name) == want.tobytes(), name
        assert model.stored(path, "rep") == np.arange(7, dtype="<i8").tobytes()
    seen.clear()
    spec: dict[str, Any] = dict(model.rows_layouts(comm.rank, comm.size))
    spec["rep"] = None
    got = ckpt.load(path, spec, comm=comm)
    assert seen == [], seen  # (each rank reads its own pieces itself: no call, no exchange)
    for name, lay in model.rows_layouts(comm.rank, comm.size).items():
        want = model.rows_reference(name)[lay.slices]  # type: ignore[attr-defined]
        assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), (comm.rank, name)
    assert got["rep"].tobytes() == np.arange(7, dtype="<i8").tobytes()


@pytest.mark.mpi
def test_mixed_state_takes_both_paths(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row shards direct, 2-D blocks and block-cyclic pieces through the exchange."""
    path = _path(comm, mpi_tmp_path)
    seen = _record_paths(monkeypatch)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    calls = [(c, d, p) for c, d, p in seen if c == "write_all_many"]
    if comm.size > 1:
        assert calls[:2] == [("write_all_many", True, "direct"),
                             ("write_all_many", False, "two-phase")], seen  # fmt: skip
    else:  # (one rank holds every array whole: one range each)
        assert calls == [("write_all_many", True, "direct")], seen
    spec = model.load_spec(comm.rank, comm.size)
    _check_loaded(comm, ckpt.load(path, spec, comm=comm), spec)


@pytest.mark.mpi
def test_overlapping_row_pieces_are_refused_everywhere(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Two ranks claiming the same rows (the sizes still adding up) never take the
    direct path: the exchange refuses them on every rank, the old checkpoint stays."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    state = model.rows_state(comm.rank, comm.size)
    rows = 8 * comm.size
    r = 0 if comm.rank < 2 else comm.rank  # ranks 0 and 1 both claim rows 0..7
    lay = layouts.Subarray((rows, 4), (8 * r, 0), (8, 4), "<f8")
    state["a"] = (np.zeros((8, 4)), lay)
    err = raises_everywhere(comm, collio.OverlapError, lambda: ckpt.save(path, state, comm=comm))
    assert "entry 'a': the ranks' pieces overlap" in str(err), str(err)  # (named, not bytes alone)
    assert "ranks 0 and 1" in str(err), str(err)
    if comm.rank == 0:
        assert read_file(path) == before
        assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    comm.Barrier()


@pytest.mark.mpi
def test_extents_across_pieces_are_checked_from_the_parts(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load in another row split checks the extents that straddle its pieces from
    every rank's part in memory (no byte read twice), and a flipped byte there is
    found on every rank."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    reads: list[Any] = []
    real = collio.File.read_all
    monkeypatch.setattr(
        collio.File, "read_all", lambda s, *a, **k: reads.append(a) or real(s, *a, **k)
    )
    lay = model.shifted_rows(comm.rank, comm.size)
    got = ckpt.load(path, {"a": lay}, comm=comm)["a"]
    assert got.tobytes() == model.rows_reference("a")[lay.slices].tobytes()
    assert reads == []  # (verified from memory: nothing read back)
    model.flip_past_first_edge(comm, path)
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, {"a": lay}, comm=comm)
    )
    assert err.names == ("a",)


@pytest.mark.mpi
def test_pieces_read_in_steps_are_checked_whole(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """Pieces of several read steps each (checksummed step by step as they are read): a
    load in the saving split gives every byte, and a byte flipped in the last step of the
    last rank's piece is found on every rank."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=8), comm=comm)
    spec = model.rows_layouts(comm.rank, comm.size, scale=8)
    assert spec["a"].nbytes > 3 * CHUNK
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = model.rows_reference(name, 8)[lay.slices]  # type: ignore[attr-defined]
        assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), (comm.rank, name)
    comm.Barrier()  # (every rank done with its arrays: a mapped one shows the flip)
    if comm.rank == 0:
        entry = ckpt.info(path)["a"]
        model.flip(path, ckpt.info(path).file_offset("a", entry["nbytes"] - 1000), 0x02)
    comm.Barrier()
    err = raises_everywhere(
        comm, collio.ChecksumError, lambda: ckpt.load(path, dict(spec), comm=comm)
    )
    assert err.names == ("a",)
    rest = {n: lay for n, lay in spec.items() if n != "a"}
    assert sorted(ckpt.load(path, rest, comm=comm)) == sorted(rest)


@pytest.mark.mpi
def test_local_reads_short_are_read_again(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: Any
) -> None:
    """A local load reads each step of its pieces by its own ``preadv`` into the caller's
    memory, the file's reader called only for a step read short (as at the file's end),
    which it reads again: every byte still arrives; and a byte flipped in a step is
    still found on every rank."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=8), comm=comm)
    spec = model.rows_layouts(comm.rank, comm.size, scale=8)
    real, calls = os.preadv, []

    def short(fd: int, bufs: Any, offset: int) -> int:
        # (each step's own call: one buffer of the caller's memory; the first read short)
        if len(bufs) == 1 and isinstance(bufs[0], memoryview):
            calls.append(len(bufs[0]))
            if len(calls) == 1 and len(bufs[0]) > 1:
                return real(fd, [bufs[0][: len(bufs[0]) // 2]], offset)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", short)
    again = []
    read_at = Reader.read_at
    monkeypatch.setattr(Reader, "read_at", lambda r, o, b: again.append(len(b)) or read_at(r, o, b))
    outs = {n: np.full(lay.local_shape, 0x5A, lay.dtype) for n, lay in spec.items()}
    got = ckpt.load(path, {n: (outs[n], lay) for n, lay in spec.items()}, comm=comm)
    monkeypatch.undo()
    # (the pieces' steps each by the load's own preadv; only the short one by the reader)
    assert len(calls) > len(spec)
    assert again == [calls[0]], (again[:3], calls[:3])
    for name, lay in spec.items():
        want = model.rows_reference(name, 8)[lay.slices]  # type: ignore[attr-defined]
        assert got[name] is outs[name]
        assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), (comm.rank, name)
    comm.Barrier()
    if comm.rank == 0:
        entry = ckpt.info(path)["a"]
        model.flip(path, ckpt.info(path).file_offset("a", entry["nbytes"] // 2 + 7), 0x10)
    comm.Barrier()
    err = raises_everywhere(
        comm, collio.ChecksumError,
        lambda: ckpt.load(path, {n: (outs[n], lay) for n, lay in spec.items()}, comm=comm),
    )  # fmt: skip
    assert err.names == ("a",)


def _outs(spec: dict[str, Any], fill: int = 0x5A) -> dict[str, Any]:
    """Arrays of the shapes ``spec`` loads, every byte ``fill`` (a job's state in memory)."""
    outs = {}
    for name, lay in spec.items():
        want = model.expected(name, lay)
        out = np.empty_like(want, order="F" if want.flags.f_contiguous and want.ndim > 1 else "C")
        out.reshape(-1, order="A").view(np.uint8)[:] = fill  # (a view in memory order)
        outs[name] = out
    return outs


@pytest.mark.mpi
@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_load_in_place_fills_the_callers_arrays(
    comm: MPI.Intracomm, mpi_tmp_path: Any, maps: str
) -> None:
    """``(out, layout)`` in the spec reads into ``out`` (two-phase and direct pieces, a
    Fortran-order one, the whole array, a 0-d value; copied out of a map of the file or
    read) and the result holds ``out``."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    hints = {"checkpoint_map": maps}
    for spec in (model.load_spec(comm.rank, comm.size), model.save_layouts(comm.rank, comm.size)):
        outs = _outs(spec)
        got = ckpt.load(path, {n: (outs[n], lay) for n, lay in spec.items()}, comm=comm,
                        hints=hints)  # fmt: skip
        assert all(got[n] is outs[n] and not model.mapped(got[n]) for n in spec)
        _check_loaded(comm, got, spec)
    # in place and new arrays in one load; the rows state goes direct
    rows = _path(comm, mpi_tmp_path, "rows.ckpt")
    ckpt.save(rows, model.rows_state(comm.rank, comm.size), comm=comm)
    lays = model.rows_layouts(comm.rank, comm.size)
    a = np.full(lays["a"].local_shape, -1.0)
    got = ckpt.load(rows, {"a": (a, lays["a"]), "b": lays["b"]}, comm=comm)
    assert got["a"] is a and a.tobytes() == model.rows_reference("a")[lays["a"].slices].tobytes()
    assert got["b"].tobytes() == model.rows_reference("b")[lays["b"].slices].tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (lambda out: np.empty((out.shape[0] + 1, *out.shape[1:]), out.dtype), "shape"),
        (lambda out: np.empty(out.shape, np.float64), "dtype"),
        (lambda out: np.empty((out.shape[0], 2 * out.shape[1]), out.dtype)[:, ::2], "contiguous"),
        (lambda out: np.frombuffer(bytes(out.nbytes), out.dtype).reshape(out.shape), "read-only"),
    ],
)
def test_load_into_an_array_that_does_not_fit_raises_everywhere(
    comm: MPI.Intracomm, mpi_tmp_path: Any, bad: Any, words: str
) -> None:
    """One rank's ``out`` of the wrong shape, dtype, memory order or a read-only one: the
    same LayoutError on every rank, naming the array, before any byte is read; the
    other ranks' arrays keep their bytes."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    spec = model.load_spec(comm.rank, comm.size)
    outs = _outs(spec)
    last = comm.size - 1
    if comm.rank == last:
        outs["embed"] = bad(outs["embed"])
    err = raises_everywhere(
        comm,
        collio.LayoutError,
        lambda: ckpt.load(path, {n: (outs[n], lay) for n, lay in spec.items()}, comm=comm),
    )
    assert "'embed'" in str(err) and words in str(err) and f"rank {last}" in str(err), str(err)
    if comm.rank != last:
        assert all((o.reshape(-1, order="A").view(np.uint8) == 0x5A).all() for o in outs.values())


@pytest.mark.mpi
@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_load_in_place_still_checks_every_byte(
    comm: MPI.Intracomm, mpi_tmp_path: Any, maps: str
) -> None:
    """A flipped byte, in the caller's array that holds it once loaded too."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.save_state(comm.rank, comm.size), comm=comm)
    at = ckpt.info(path).file_offset("ffn/w", 3)
    if comm.rank == 0:
        model.flip(path, at, 0x40)
    comm.Barrier()
    for spec in (model.load_spec(comm.rank, comm.size), model.save_layouts(comm.rank, comm.size)):
        outs = _outs(spec)
        into = {n: (outs[n], lay) for n, lay in spec.items()}
        err = raises_everywhere(
            comm, collio.ChecksumError,
            lambda into=into: ckpt.load(path, into, comm=comm, hints={"checkpoint_map": maps}),
        )  # fmt: skip
        assert err.names == ("ffn/w",)
        for name in set(spec) - {"ffn/w"}:  # (the others hold their bytes)
            want = model.expected(name, spec[name])
            assert outs[name].tobytes(order="A") == want.tobytes(order="A"), (comm.rank, name)


@pytest.mark.mpi
@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_arrays_of_no_bytes_load_alone_and_beside_others(
    comm: MPI.Intracomm, mpi_tmp_path: Any, maps: str
) -> None:
    """An array with a dimension of length 0 saves and loads, alone (no byte of the file
    to read) or beside one that has bytes, at another decomposition."""
    path = _path(comm, mpi_tmp_path)
    full = np.arange(6 * 5, dtype=">i4").reshape(6, 5)
    saved = {
        "empty": layouts.block((0, 4), "f8", comm=comm),
        "full": layouts.block(full.shape, ">i4", comm=comm, grid=(comm.size, 1)),
    }
    state = {
        "empty": (np.empty(saved["empty"].local_shape, "f8"), saved["empty"]),
        "full": (np.ascontiguousarray(full[saved["full"].slices]), saved["full"]),
    }
    ckpt.save(path, state, comm=comm)
    hints = {"checkpoint_map": maps}
    empty = layouts.block((0, 4), "f8", comm=comm, grid=(1, comm.size))
    got = ckpt.load(path, {"empty": empty}, comm=comm, hints=hints)
    assert got["empty"].shape == empty.local_shape and got["empty"].dtype == np.float64
    lay = layouts.block(full.shape, ">i4", comm=comm, grid=(1, comm.size))
    got = ckpt.load(path, {"empty": empty, "full": lay}, comm=comm, hints=hints)
    assert got["empty"].shape == empty.local_shape and got["empty"].dtype == np.float64
    want = np.ascontiguousarray(full[lay.slices])
    assert got["full"].dtype == want.dtype and got["full"].tobytes() == want.tobytes()


@pytest.mark.mpi
def test_entries_with_layouts_from_mpi_datatypes(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """Pieces described by MPI datatypes (a subarray of column blocks, a darray of
    cyclic rows), saved and loaded back whole and in the other's decomposition, byte
    for byte."""
    path = _path(comm, mpi_tmp_path)
    shape = (12, 10)
    g = np.arange(120, dtype="<f8").reshape(shape)
    cols = layouts.block(shape, "<f8", grid=(1, comm.size), comm=comm)
    sub = MPI.DOUBLE.Create_subarray(list(shape), list(cols.local_shape), list(cols.start))
    darr = MPI.DOUBLE.Create_darray(
        comm.size, comm.rank, list(shape), [MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_NONE],
        [2, MPI.DISTRIBUTE_DFLT_DARG], [comm.size, 1],
    )  # fmt: skip
    sub.Commit()
    darr.Commit()
    try:
        by_sub, by_darr = layouts.from_datatype(sub), layouts.from_datatype(darr)
        packed = bytearray(darr.Pack_size(1, MPI.COMM_SELF))
        n = darr.Pack(g, packed, 0, MPI.COMM_SELF)
        rows = np.frombuffer(bytes(packed[:n]), "<f8").reshape(by_darr.local_shape)
        state = {"a": (np.ascontiguousarray(g[cols.slices]), by_sub), "b": (rows, by_darr)}
        ckpt.save(path, state, comm=comm)
        whole = ckpt.load(path, {"a": None, "b": None}, comm=comm)
        assert whole["a"].tobytes() == g.tobytes() and whole["b"].tobytes() == g.tobytes()
        other = ckpt.load(path, {"a": by_darr, "b": by_sub}, comm=comm)
        assert other["a"].tobytes() == rows.tobytes(), comm.rank
        assert other["b"].tobytes() == np.ascontiguousarray(g[cols.slices]).tobytes(), comm.rank
    finally:
        sub.Free()
        darr.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("meta", [[1, 2], {1: "one"}, "step 3"])
def test_metadata_that_is_not_a_json_object_is_refused(
    comm: MPI.Intracomm, mpi_tmp_path: Any, meta: Any
) -> None:
    """Metadata is a JSON object: a list, a string or a key that is not a string (JSON
    would store it as one, and it would come back other than given) raises the same
    LayoutError on every rank, also when the last rank alone passes it; nothing saved."""
    path = _path(comm, mpi_tmp_path)
    a = np.arange(6.0)
    for mine in (meta, meta if comm.rank == comm.size - 1 else {"step": 3}):

        def save(m: Any = mine) -> None:
            ckpt.save(path, {"a": a}, comm=comm, metadata=m)

        raises_everywhere(
            comm, collio.LayoutError, save, match="metadata must be a mapping with string keys"
        )
        assert not comm.bcast(os.path.exists(path), root=0)


@pytest.mark.parametrize("call", ["save", "async_save"])
def test_a_replicated_value_that_differs_between_ranks_is_refused_naming_them(
    comm: MPI.Intracomm, mpi_tmp_path: Any, call: str
) -> None:
    """A plain array is stored once, from one rank: ranks holding other bytes of it (a
    replica that drifted) would lose theirs without a word.  Every rank raises the same
    LayoutError naming the entry and which ranks hold which values (``async_save`` before
    it returns), and the checkpoint saved before stays."""
    p, r = comm.size, comm.rank
    if p == 1:
        pytest.skip("one rank holds one value")
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "c.ckpt"), root=0))
    ckpt.save(path, {"norm": np.arange(6.0), "step": np.int64(3)}, comm=comm)
    drift = np.arange(6.0)
    if r == p - 1:
        drift[5] = np.nextafter(5.0, 6.0)  # (one ulp: bytes, not closeness, are compared)
    state = {"norm": drift, "step": np.int64(4)}
    fn = ckpt.save if call == "save" else ckpt.async_save
    err = raises_everywhere(comm, collio.LayoutError, lambda: fn(path, state, comm=comm))
    assert "entry 'norm' is replicated" in str(err)
    others = ", ".join(map(str, range(p - 1)))
    want = f"2 values (rank{'s' if p > 2 else ''} {others} | rank {p - 1})"
    assert want in str(err), str(err)
    got = ckpt.load(path, {"norm": None, "step": None}, comm=comm)
    assert got["norm"].tolist() == list(range(6)) and got["step"].tolist() == 3
    assert sorted(os.listdir(os.path.dirname(path))) == ["c.ckpt"]
