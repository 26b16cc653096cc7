"""The conformance suite every collio backend passes (in the manner of zarr's ``StoreTests``).

A backend's test module subclasses :class:`~collio.testing.target_suites.ByteBackendTests`
(targets that hold bytes: files, memory, objects) or
:class:`~collio.testing.target_suites.ArrayBackendTests` (targets that hold an array:
zarr, an HDF5 dataset); both add, to the tests here, those of what their targets hold.
It names the backend, and supplies two fixtures and one hook:

``target``
    A fresh target, absent until the test writes it, named alike on every rank.
``open_options``
    ``collio.open``'s extra keywords for the backend (default none).
``stored(target, open_options)``
    Called on rank 0 only: what the target holds, read WITHOUT collio (a plain file
    read, boto3 GET, zarr, h5py), or None when there is no target.  Byte targets return
    ``bytes``, array targets the global array.  The suite checks collio against it.

The tests run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi`` at any N
(1 included)::

    class TestPosix(ByteBackendTests):
        backend = "posix"

        @pytest.fixture
        def target(self, mpi_tmp_path):
            return str(mpi_tmp_path / "conformance.bin")

        def stored(self, target, open_options):
            return pathlib.Path(target).read_bytes() if os.path.exists(target) else None

What each capability promises (:class:`collio.backends.Backend`) is tested where the
backend declares it: ``partial_write`` (holes in a round keep the bytes written
before), ``sparse`` (bytes never written read as zeros), ``atomic`` or an accepted
``atomic_commit`` hint (nothing visible before close; a failed call leaves the old
target).  Byte targets also read zeros past their end and hold exactly the bytes ROMIO
(mpi4py's ``MPI.File``) writes for the same decomposition.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import Backend

from .guarded import guarded_like

__all__ = ["F8", "SHAPE", "BackendTests", "global_array"]

#: The suite's global array: float64, rows and columns that no rank count divides.
SHAPE = (48, 40)
F8 = "<f8"


def global_array(seed: int = 3) -> np.ndarray[Any, Any]:
    """A deterministic global array every rank can build (distinct values, no NaNs)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(int(np.prod(SHAPE))).reshape(SHAPE)


def _layout(kind: str, comm: MPI.Intracomm, order: str = "C") -> Any:
    if kind == "colblock":
        return layouts.block(SHAPE, F8, comm=comm, grid=(1, comm.size), order=order)
    if kind == "block":
        return layouts.block(SHAPE, F8, comm=comm, order=order)
    grid = layouts.dims_create(comm.size, 2)
    return layouts.block_cyclic(SHAPE, F8, block=(5, 3), grid=grid, comm=comm, order=order)


def _piece(glob: np.ndarray[Any, Any], lay: Any) -> np.ndarray[Any, Any]:
    """The rank's piece of ``glob``, in the layout's memory order."""
    if isinstance(lay, layouts.BlockCyclic):
        piece = glob[np.ix_(*lay.indices)]
    elif isinstance(lay, layouts.Subarray):
        piece = glob[lay.slices]
    else:
        piece = glob[np.ix_(*(d.indices() for d in lay.dims))]
    return np.asfortranarray(piece) if lay.order == "F" else np.ascontiguousarray(piece)


def _rows(comm: MPI.Intracomm, first: int, step: int) -> Any:
    """Rows ``first, first + step, ...`` of the global array, dealt round robin to the ranks."""
    count = len(range(first, SHAPE[0], step))
    mine = len(range(comm.rank, count, comm.size))
    dims = [
        layouts.DimSet(first + step * comm.rank, 1, step * comm.size, mine),
        layouts.DimSet.interval(0, SHAPE[1]),
    ]
    return layouts.ArrayLayout(SHAPE, dims, F8)


def _same_everywhere(comm: MPI.Intracomm, exc: BaseException) -> str:
    texts = comm.allgather((type(exc).__name__, str(exc)))
    assert texts == [texts[0]] * comm.size, texts
    return str(texts[0][1])


@pytest.mark.mpi
class BackendTests:
    """What every backend does with array layouts; use a subclass below."""

    backend: ClassVar[str] = ""

    @pytest.fixture
    def comm(self) -> MPI.Intracomm:
        return MPI.COMM_WORLD

    @pytest.fixture
    def open_options(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def target(self) -> Any:  # pragma: no cover - subclasses provide it
        raise NotImplementedError("a backend's test class provides the target fixture")

    def stored(self, target: Any, open_options: dict[str, Any]) -> Any:
        """Rank 0 only: the target's content read without collio, or None if absent."""
        raise NotImplementedError("a backend's test class reads the target without collio")

    def as_array(self, content: Any) -> np.ndarray[Any, Any]:
        """The global array in what :meth:`stored` returned."""
        raise NotImplementedError

    # -- helpers --------------------------------------------------------------
    def backend_class(self) -> type[Backend]:
        return collio.get_backend(self.backend)

    def open(
        self, target: Any, mode: str, comm: MPI.Intracomm, opts: dict[str, Any], **kw: Any
    ) -> Any:
        return collio.open(target, mode, comm=comm, backend=self.backend, **opts, **kw)

    def bypass(self, target: Any, comm: MPI.Intracomm, opts: dict[str, Any]) -> Any:
        """Collective: :meth:`stored` on rank 0, seen by every rank (its error too)."""
        got: tuple[Any, str | None] = (None, None)
        if comm.rank == 0:
            try:
                got = (self.stored(target, opts), None)
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                got = (None, f"{type(exc).__name__}: {exc}")
        content, error = comm.bcast(got, root=0)
        assert error is None, f"reading the target without collio failed: {error}"
        return content

    def assert_stored(
        self, target: Any, comm: MPI.Intracomm, opts: dict[str, Any], want: Any
    ) -> None:
        """The target holds the global array ``want`` (read without collio)."""
        content = self.bypass(target, comm, opts)
        assert content is not None, "the target does not exist"
        np.testing.assert_array_equal(self.as_array(content), want)

    def write(
        self, target: Any, comm: MPI.Intracomm, opts: dict[str, Any], glob: Any, **kw: Any
    ) -> None:
        lay = _layout("block", comm)
        with self.open(target, "w", comm, opts, **kw) as f:
            f.write_all(_piece(glob, lay), lay)

    # -- round trips ----------------------------------------------------------
    @pytest.mark.parametrize("kind", ["colblock", "block", "cyclic"])
    @pytest.mark.parametrize("hints", [{}, {"cb_buffer_size": 2048, "romio_cb_write": "enable"}])
    def test_write_read_roundtrip(
        self, comm: MPI.Intracomm, target: Any, open_options: Any, kind: str, hints: Any
    ) -> None:
        glob = global_array()
        lay = _layout(kind, comm)
        with self.open(target, "w", comm, open_options, hints=hints) as f:
            f.write_all(_piece(glob, lay), lay)
        self.assert_stored(target, comm, open_options, glob)
        other = _layout("colblock" if kind != "colblock" else "cyclic", comm)
        with self.open(target, "r", comm, open_options, hints=hints) as f:
            np.testing.assert_array_equal(f.read_all(lay), _piece(glob, lay))
            np.testing.assert_array_equal(f.read_all(other), _piece(glob, other))

    def test_empty_ranks_take_part(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        glob = global_array(seed=4)
        full = comm.rank == comm.size - 1
        lay = layouts.Subarray(SHAPE, (0, 0), SHAPE if full else (0, 0), F8)
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(glob if full else np.zeros((0, 0)), lay)
        self.assert_stored(target, comm, open_options, glob)

    def test_update_in_place_keeps_the_rest(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """'r+' rewrites every third row; the other rows keep what the first open wrote."""
        glob = global_array(seed=5)
        self.write(target, comm, open_options, glob)
        lay = _rows(comm, 0, 3)
        new = glob.copy()
        new[0::3] = -1.0
        with self.open(target, "r+", comm, open_options, hints={"cb_buffer_size": 4096}) as f:
            f.write_all(np.full(lay.local_shape, -1.0), lay)
        self.assert_stored(target, comm, open_options, new)

    def test_missing_target_fails_everywhere(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        with pytest.raises(collio.CollioError) as info:
            self.open(target, "r", comm, open_options)
        _same_everywhere(comm, info.value)
        assert self.bypass(target, comm, open_options) is None  # nor was it created

    # -- what the capabilities promise ----------------------------------------
    def test_partial_write_keeps_the_bytes_in_holes(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """``partial_write``: a later call in the same open writes rows with holes between
        them, through small two-phase rounds; the holes keep the first call's bytes."""
        if not self.backend_class().partial_write:
            pytest.skip("partial_write is False: later calls may not write into earlier windows")
        glob = global_array(seed=6)
        first, later = _layout("colblock", comm), _rows(comm, 1, 4)
        new = glob.copy()
        new[1::4] = 7.0
        hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable"}
        with self.open(target, "w", comm, open_options, hints=hints) as f:
            f.write_all(_piece(glob, first), first)
            f.write_all(np.full(later.local_shape, 7.0), later)
            np.testing.assert_array_equal(f.read_all(first), _piece(new, first))
        self.assert_stored(target, comm, open_options, new)

    def test_sparse_never_written_bytes_read_as_zeros(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """``sparse``: only rows from 20 on are written; rows 0-19 read as zeros, through
        collio and without it."""
        if not self.backend_class().sparse:
            pytest.skip("sparse is False: never-written elements read as the fill value")
        glob = global_array(seed=7)
        lower = layouts.block((SHAPE[0] - 20, SHAPE[1]), F8, comm=comm, grid=(comm.size, 1))
        lay = layouts.Subarray(SHAPE, (20 + lower.start[0], 0), lower.shape, F8)
        want = glob.copy()
        want[:20] = 0.0
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(_piece(glob, lay), lay)
        self.assert_stored(target, comm, open_options, want)
        whole = _layout("cyclic", comm)
        with self.open(target, "r", comm, open_options) as f:
            np.testing.assert_array_equal(f.read_all(whole), _piece(want, whole))

    def test_atomic_commit_is_invisible_until_close(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """``atomic`` backends, or the hint ``atomic_commit`` where accepted: before close
        the target is absent (then the old version); a failed call discards the open's
        writes.  A backend that refuses the hint refuses it on every rank, creating nothing."""
        cls = self.backend_class()
        hints = {} if cls.atomic else {"atomic_commit": True}
        lay = _layout("colblock", comm)
        old, new = global_array(seed=8), global_array(seed=9)
        try:
            f = self.open(target, "w", comm, open_options, hints=hints)
        except collio.ModeError as exc:
            assert not cls.atomic and "atomic_commit" in _same_everywhere(comm, exc)
            assert self.bypass(target, comm, open_options) is None
            return
        with f:
            f.write_all(_piece(old, lay), lay)
            assert self.bypass(target, comm, open_options) is None
        self.assert_stored(target, comm, open_options, old)
        with self.open(target, "w", comm, open_options, hints=hints) as f:
            f.write_all(_piece(new, lay), lay)
            self.assert_stored(target, comm, open_options, old)
        self.assert_stored(target, comm, open_options, new)
        with self.open(target, "w", comm, open_options, hints=hints) as f:
            f.write_all(_piece(old, lay), lay)
            bad = comm.rank == comm.size - 1
            with pytest.raises(collio.LayoutError) as info:
                f.write_all(np.zeros((1, 1)) if bad else _piece(old, lay), lay)
            _same_everywhere(comm, info.value)
        self.assert_stored(target, comm, open_options, new)

    @pytest.mark.parametrize("who", ["first", "last"])
    def test_with_block_raising_on_one_rank(
        self, comm: MPI.Intracomm, target: Any, open_options: Any, who: str
    ) -> None:
        """One rank's ``with`` block raises after every rank wrote; the others' end
        normally.  Nothing hangs, and every rank learns the same outcome: an atomic
        target (``atomic``, or ``atomic_commit`` where accepted) commits nothing, the
        raising rank raises its own error and every other rank the same ``CommitError``
        naming it; any other target keeps what was written, the others' close succeeds.
        The ranks go on with the next open."""
        cls = self.backend_class()
        old, new = global_array(seed=17), global_array(seed=18)
        lay = _layout("colblock", comm)
        hints: dict[str, Any] = {} if cls.atomic else {"atomic_commit": True}
        try:
            self.write(target, comm, open_options, old, hints=hints)
        except collio.ModeError:  # (refused on every rank, nothing created)
            hints = {}
            self.write(target, comm, open_options, old)
        atomic = cls.atomic or bool(hints)
        bad = 0 if who == "first" else comm.size - 1

        class Refused(Exception):
            pass

        got: tuple[str, str] = ("ok", "")
        try:
            with self.open(target, "w", comm, open_options, hints=hints) as f:
                f.write_all(_piece(new, lay), lay)
                if comm.rank == bad:
                    raise Refused("rank's own check failed")
        except Exception as exc:  # noqa: BLE001 - compared across ranks below
            got = (type(exc).__name__, str(exc))
        every = comm.allgather(got)
        others = [g for r, g in enumerate(every) if r != bad]
        assert every[bad] == ("Refused", "rank's own check failed"), every
        if atomic:
            want = ("CommitError", "close, nothing committed: rank "
                    f"{bad}: its with block raised Refused: rank's own check failed")  # fmt: skip
            assert others == [want] * (comm.size - 1), every
        else:
            assert others == [("ok", "")] * (comm.size - 1), every
        self.assert_stored(target, comm, open_options, old if atomic else new)
        self.write(target, comm, open_options, new, hints=hints)
        self.assert_stored(target, comm, open_options, new)

    # -- many arrays in one call ------------------------------------------------
    def test_batch_in_one_call(self, comm: MPI.Intracomm, target: Any, open_options: Any) -> None:
        """``write_all_many``/``read_all_many``: every third row from rows 1, 2 and 3, each
        set an item, and row 0 an item empty on every rank but the last, in one call each; a batch
        with one bad item on one rank raises on every rank, naming it, and writes nothing.

        The items' arrays (and the read's ``out``) lie between inaccessible pages: the
        call may touch no byte between them (the process would fault)."""
        glob = global_array(seed=15)
        lays = [_rows(comm, 3, 3), _rows(comm, 2, 3), _rows(comm, 1, 3)]
        last = comm.rank == comm.size - 1  # row 0: only the last rank holds a piece
        tail = layouts.Subarray(SHAPE, (0, 0), (1, SHAPE[1]) if last else (0, 0), F8)
        every = [*lays, tail]
        items = list(zip(guarded_like([_piece(glob, lay) for lay in every]), every, strict=True))
        with self.open(target, "w", comm, open_options) as f:
            f.write_all_many(items)
            assert f.stats.last_call["items"] == 4
        self.assert_stored(target, comm, open_options, glob)
        new = -glob
        new[0] = glob[0]
        bad = [(_piece(new, lay), lay) for lay in lays]
        atomic = self.backend_class().atomic
        with self.open(target, "r+", comm, open_options) as f:
            if last:
                bad[1] = (np.zeros(3), lays[1])
            with pytest.raises(collio.LayoutError) as info:
                f.write_all_many(bad)
            text = _same_everywhere(comm, info.value)
            assert f"rank {comm.size - 1}: item 1: data shape (3,)" in text, text
            if not atomic:  # (an atomic target refuses writes after a failed one)
                back = f.read_all_many([*lays, tail])
                for (want, _), got in zip(items, back, strict=True):
                    np.testing.assert_array_equal(got, want)
                f.write_all_many([(_piece(new, lay), lay) for lay in lays])
        self.assert_stored(target, comm, open_options, glob if atomic else new)
        with self.open(target, "r", comm, open_options) as f:
            outs = guarded_like([np.empty(lay.local_shape) for lay in lays])
            back = f.read_all_many(lays, out=outs)
            for lay, got, out in zip(lays, back, outs, strict=True):
                assert got is out
                np.testing.assert_array_equal(got, _piece(glob if atomic else new, lay))
