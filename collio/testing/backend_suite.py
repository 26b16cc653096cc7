"""The conformance suite every collio backend passes (zarr's ``StoreTests`` habit).

A backend's test module subclasses :class:`BackendTests` and provides the
``target`` fixture (a fresh target name every rank agrees on) and, if it needs
them, ``open_options``.  The tests run under plain pytest (one rank) and under
``mpiexec ... pytest --with-mpi`` (many ranks) alike::

    class TestPosix(BackendTests):
        backend = "posix"

        @pytest.fixture
        def target(self, tmp_target):
            return tmp_target
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import layouts

__all__ = ["BackendTests"]

SHAPE = (48, 40)


def _global(dtype: str = "<f8", seed: int = 3) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(int(np.prod(SHAPE))).astype(dtype).reshape(SHAPE)


class BackendTests:
    """Behaviour shared by all backends; subclasses set ``backend`` and fixtures."""

    backend: str = "posix"
    #: Layout kinds the backend accepts in ``write_all`` (byte targets accept all).
    byte_addressable: bool = True

    @pytest.fixture
    def comm(self) -> MPI.Intracomm:
        return MPI.COMM_WORLD

    @pytest.fixture
    def open_options(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def target(self) -> Any:  # pragma: no cover - subclasses provide it
        raise NotImplementedError

    def open(
        self, target: Any, mode: str, comm: MPI.Intracomm, opts: dict[str, Any], **kw: Any
    ) -> Any:
        return collio.open(target, mode, comm=comm, backend=self.backend, **opts, **kw)

    def read_whole(
        self, target: Any, comm: MPI.Intracomm, opts: dict[str, Any]
    ) -> np.ndarray[Any, Any]:
        """The whole global array, read back through collio by rank-0-only layout."""
        lay = layouts.Subarray(SHAPE, (0, 0), SHAPE if comm.rank == 0 else (0, 0), "<f8")
        with self.open(target, "r", comm, opts) as f:
            whole: np.ndarray[Any, Any] = f.read_all(lay)
        out: np.ndarray[Any, Any] = comm.bcast(whole if comm.rank == 0 else None, root=0)
        return out

    # -- capabilities -------------------------------------------------------
    def test_capabilities_are_declared(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        cls = collio.get_backend(self.backend)
        assert cls.alignment >= 1
        assert 1 <= cls.min_request <= cls.max_request
        assert isinstance(cls.partial_write, bool) and isinstance(cls.collective_open, bool)
        with self.open(target, "w", comm, open_options) as f:
            desc = f.backend.describe()
            assert desc["backend"] == cls.name

    # -- round trips --------------------------------------------------------
    @pytest.mark.parametrize("kind", ["colblock", "block", "cyclic"])
    @pytest.mark.parametrize("hints", [{}, {"cb_buffer_size": 2048, "romio_cb_write": "enable"}])
    def test_write_read_roundtrip(
        self, comm: MPI.Intracomm, target: Any, open_options: Any, kind: str, hints: dict[str, Any]
    ) -> None:
        glob = _global()
        if kind == "colblock":
            lay: Any = layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))
            local = glob[lay.slices]
        elif kind == "block":
            lay = layouts.block(SHAPE, "<f8", comm=comm)
            local = glob[lay.slices]
        else:
            lay = layouts.block_cyclic(
                SHAPE, "<f8", block=(5, 3), grid=layouts.dims_create(comm.size, 2), comm=comm
            )
            local = glob[np.ix_(*lay.indices)]
        with self.open(target, "w", comm, open_options, hints=hints) as f:
            f.write_all(np.ascontiguousarray(local), lay)
        with self.open(target, "r", comm, open_options, hints=hints) as f:
            back = f.read_all(lay)
        np.testing.assert_array_equal(back, local)
        np.testing.assert_array_equal(self.read_whole(target, comm, open_options), glob)

    def test_empty_ranks_take_part(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        glob = _global(seed=4)
        full = comm.rank == comm.size - 1
        lay = layouts.Subarray(SHAPE, (0, 0), SHAPE if full else (0, 0), "<f8")
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(glob if full else np.zeros((0, 0)), lay)
        np.testing.assert_array_equal(self.read_whole(target, comm, open_options), glob)

    def test_update_in_place_keeps_the_rest(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        glob = _global(seed=5)
        lay = layouts.block(SHAPE, "<f8", comm=comm)
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        # rewrite every third row only, through a cyclic layout over rows
        rows = np.arange(0, SHAPE[0], 3)
        mine = rows[comm.rank :: comm.size]
        new = glob.copy()
        new[rows] = -1.0
        with self.open(target, "r+", comm, open_options, hints={"cb_buffer_size": 4096}) as f:
            offs = mine * SHAPE[1] * 8
            lay2 = layouts.Segments(offs, np.full(len(mine), SHAPE[1] * 8))
            f.write_all(np.full(len(mine) * SHAPE[1], -1.0).view(np.uint8), lay2)
        np.testing.assert_array_equal(self.read_whole(target, comm, open_options), new)

    def test_missing_target_fails_everywhere(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        with pytest.raises(collio.CollioError) as info:
            self.open(target, "r", comm, open_options)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
