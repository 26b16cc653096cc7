"""The chunk-major byte space that chunked targets (zarr, chunked HDF5) show the engine.

The one model of a chunk grid in collio: the zarr and HDF5 backends map layouts with
it, and the benchmark's plain-library baselines cut a rank's piece into units with it.

Unit ``u`` (a chunk, or a shard when sharding is on) occupies bytes
``[u * U, (u + 1) * U)`` with ``U`` the byte size of a *full* unit; inside a unit
the elements lie in the layout's order (C or Fortran) over the full unit shape, so
edge units are padded.  Units are numbered in the same order over the unit grid.
With :attr:`ChunkSpace.unit_nbytes` as the engine's alignment, every unit lies in
exactly one aggregator's file domain: one writer per chunk or shard.

Everything here is pure numpy (no I/O, no MPI) and vectorised: no Python loop per
run or element.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..aggregators.domains import file_domains
from ..runs import Runs, sort

if TYPE_CHECKING:
    from ..layouts.arrays import DimSet

__all__ = ["ChunkSpace", "UnitPart", "covered_below"]

I64 = npt.NDArray[np.int64]
#: Above this many units in an extent, domains fall back to even byte shares.
MAX_WEIGHED_UNITS = 1 << 22


@dataclasses.dataclass(frozen=True, slots=True)
class UnitPart:
    """A rank's part of one unit: the unit's ``region`` of the global array, the rank's
    elements in its own buffer (``local`` slices), where they sit inside the unit
    (``inner``: a slice per dimension where contiguous, else an index array), and
    whether the rank holds the whole unit (``full``)."""

    coords: tuple[int, ...]
    region: tuple[slice, ...]
    local: tuple[slice, ...]
    inner: tuple[Any, ...]
    full: bool

    @property
    def box(self) -> bool:
        """The part is one box (every ``inner`` is a slice)."""
        return all(isinstance(i, slice) for i in self.inner)


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkSpace:
    """Chunk-major byte space of an array ``shape`` cut in units of ``unit`` elements.

    Parameters
    ----------
    shape
        The global array's shape.
    unit
        The chunk shape (the shard shape when sharding is on).
    itemsize
        Bytes per element.
    order
        'C' or 'F': the order of units in the grid and of elements in a unit
        (the layout's memory order, so a rank's runs stay long in both).
    """

    shape: tuple[int, ...]
    unit: tuple[int, ...]
    itemsize: int
    order: str = "C"

    # -- sizes (array order) --------------------------------------------------
    @property
    def grid(self) -> tuple[int, ...]:
        """Units per dimension."""
        return tuple(-(-s // u) for s, u in zip(self.shape, self.unit, strict=True))

    @property
    def nunits(self) -> int:
        return math.prod(self.grid)

    @property
    def unit_items(self) -> int:
        return math.prod(self.unit)

    @property
    def unit_nbytes(self) -> int:
        return self.unit_items * self.itemsize

    @property
    def nbytes(self) -> int:
        """Size of the whole space (padded edge units included)."""
        return self.nunits * self.unit_nbytes

    def _space(self, values: Sequence[Any]) -> list[Any]:
        """Per-dimension values in space order (Fortran order reverses the dimensions)."""
        return list(values)[::-1] if self.order == "F" else list(values)

    # -- mapping a layout -----------------------------------------------------
    def runs(self, dims: Sequence[DimSet]) -> Runs:
        """A rank's runs in this space for its per-dimension index sets (array order).

        The rank's buffer holds its elements in global order, in :attr:`order`
        (as :class:`~collio.layouts.ArrayLayout` says).  Runs are cut at gaps and
        unit boundaries of the fastest dimension, then sorted by offset and merged
        within units (a run never spans two units, so runs can be sorted by unit).
        """
        d = self._space(dims)
        u, g = self._space(self.unit), self._space(self.grid)
        counts = [x.count for x in d]
        if not d or min(counts) <= 0:
            return Runs.empty()
        idx = d[-1].indices()
        brk = np.ones(len(idx), bool)
        brk[1:] = (idx[1:] != idx[:-1] + 1) | (idx[1:] % u[-1] == 0)
        starts = np.flatnonzero(brk).astype(np.int64)
        seg_len = np.diff(np.append(starts, len(idx))).astype(np.int64)
        uid = idx[starts] // u[-1]
        inner = idx[starts] % u[-1]
        mem = starts
        gs, us, ls = 1, u[-1], counts[-1]
        for k in range(len(d) - 2, -1, -1):
            gs *= g[k + 1]
            ik = d[k].indices()
            uid = ((ik // u[k]) * gs)[:, None] + uid[None, :]
            inner = ((ik % u[k]) * us)[:, None] + inner[None, :]
            mem = (np.arange(counts[k], dtype=np.int64) * ls)[:, None] + mem[None, :]
            uid, inner, mem = uid.reshape(-1), inner.reshape(-1), mem.reshape(-1)
            us *= u[k]
            ls *= counts[k]
        isz = self.itemsize
        length = np.tile(seg_len * isz, len(uid) // len(seg_len))
        file = (uid * self.unit_items + inner) * isz
        return _merge_within(sort(Runs(file, length, mem * isz)), self.unit_nbytes)

    # -- units ----------------------------------------------------------------
    def coords(self, ids: I64) -> tuple[I64, ...]:
        """Grid coordinates of units (array order)."""
        c = np.unravel_index(np.asarray(ids, np.int64), self._space(self.grid))
        out = [x.astype(np.int64) for x in c]
        return tuple(self._space(out))

    def extents(self, ids: I64) -> I64:
        """Real (unpadded) extent of each unit per dimension: shape ``(len(ids), ndim)``."""
        coords = self.coords(ids)
        cols = [
            np.minimum(u, s - c * u) for c, u, s in zip(coords, self.unit, self.shape, strict=True)
        ]
        return np.stack(cols, axis=1) if cols else np.zeros((len(ids), 0), np.int64)

    def valid_nbytes(self, ids: I64) -> I64:
        """Real bytes of each unit (edge units hold fewer than :attr:`unit_nbytes`)."""
        out: I64 = np.prod(self.extents(ids), axis=1).astype(np.int64) * self.itemsize
        return out

    def region(self, uid: int) -> tuple[slice, ...]:
        """The unit's region of the global array (array order)."""
        coords = [int(c[0]) for c in self.coords(np.array([uid], np.int64))]
        return tuple(
            slice(c * u, min((c + 1) * u, s))
            for c, u, s in zip(coords, self.unit, self.shape, strict=True)
        )

    def view(self, raw: npt.NDArray[np.uint8], dtype: Any, uid: int) -> np.ndarray[Any, Any]:
        """The real elements of unit ``uid`` inside its ``unit_nbytes`` of ``raw`` (a view)."""
        full = raw.view(dtype).reshape(self._space(self.unit))
        if self.order == "F":
            full = full.T
        real = tuple(slice(0, r.stop - r.start) for r in self.region(uid))
        part: np.ndarray[Any, Any] = full[real]
        return part

    def unit_bytes(self, offset: int, nbytes: int, runs: Runs) -> tuple[I64, I64]:
        """Units meeting ``[offset, offset+nbytes)`` and the bytes ``runs`` put in each.

        ``runs`` must be sorted by offset and disjoint (a write's coverage); for a
        read's (possibly overlapping) needs only "more than zero" is meaningful.
        """
        ub = self.unit_nbytes
        u0, u1 = offset // ub, -(-(offset + nbytes) // ub)
        ids = np.arange(u0, u1, dtype=np.int64)
        edges = np.arange(u0, u1 + 1, dtype=np.int64) * ub
        return ids, np.diff(covered_below(runs, edges))

    def touched(self, runs: Runs) -> tuple[I64, I64]:
        """Units that a rank's runs (sorted, disjoint) meet, and the bytes they put in each."""
        if not len(runs):
            z = np.zeros(0, np.int64)
            return z, z
        ub = self.unit_nbytes
        first = runs.file // ub
        n = (runs.file + runs.length - 1) // ub - first + 1
        starts = np.repeat(np.cumsum(n) - n, n)
        ids = np.unique(np.repeat(first, n) + np.arange(int(n.sum()), dtype=np.int64) - starts)
        got = covered_below(runs, (ids + 1) * ub) - covered_below(runs, ids * ub)
        return ids, got

    def _parts(
        self, dims: Sequence[DimSet], ids: I64
    ) -> tuple[list[tuple[I64, I64, I64]], npt.NDArray[np.bool_]]:
        """Per dimension (indices, first and end local position in each unit); box flags."""
        coords = self.coords(ids)
        per: list[tuple[I64, I64, I64]] = []
        ok = np.ones(len(ids), bool)
        for ds, u, n, g, c in zip(dims, self.unit, self.shape, self.grid, coords, strict=True):
            idx = ds.indices()
            if not len(idx):
                return [], np.zeros(len(ids), bool)
            cut = np.minimum(np.arange(g + 1, dtype=np.int64) * u, n)
            pos = np.searchsorted(idx, cut).astype(np.int64)
            lo, hi = pos[:-1], pos[1:]
            span = idx[np.maximum(hi - 1, 0)] - idx[np.minimum(lo, len(idx) - 1)] + 1
            ok &= ((hi == lo) | (span == hi - lo))[c]
            per.append((idx, lo[c], hi[c]))
        return per, ok

    def box_flags(self, dims: Sequence[DimSet], ids: I64) -> npt.NDArray[np.bool_]:
        """Whether a rank's elements in each unit form one box (one region assignment)."""
        return self._parts(dims, ids)[1] if len(ids) else np.zeros(0, bool)

    def boxes(
        self, dims: Sequence[DimSet], ids: I64
    ) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]] | None:
        """A rank's elements in each unit as one box: (global slices, local slices).

        None when in some unit they are not a box (a block-cyclic rank with two
        blocks in one chunk): such units cannot be stored by one region assignment.
        """
        if not len(ids):
            return []
        per, ok = self._parts(dims, ids)
        if not ok.all():
            return None
        out = []
        for k in range(len(ids)):
            gs = tuple(slice(int(i[lo[k]]), int(i[hi[k] - 1]) + 1) for i, lo, hi in per)
            ls = tuple(slice(int(lo[k]), int(hi[k])) for _, lo, hi in per)
            out.append((gs, ls))
        return out

    def unit_at(self, start: Sequence[int]) -> int:
        """The unit whose region starts at element ``start`` (array order; HDF5's chunk offset)."""
        pos = [int(s) // u for s, u in zip(start, self.unit, strict=True)]
        return int(np.ravel_multi_index(self._space(pos), self._space(self.grid)))

    # -- a rank's parts, for the plain-library baselines (one library call per unit) ----
    def touched_by(self, dims: Sequence[DimSet]) -> I64:
        """The units (sorted ids) that a rank's per-dimension index sets meet."""
        per = [np.unique(d.indices() // u) for d, u in zip(dims, self.unit, strict=True)]
        if not per or not all(len(p) for p in per):
            return np.zeros(0, np.int64)
        mesh = [m.reshape(-1) for m in np.meshgrid(*per, indexing="ij")]
        flat = np.ravel_multi_index(tuple(self._space(mesh)), self._space(self.grid))
        return np.sort(flat).astype(np.int64)

    def parts(self, dims: Sequence[DimSet]) -> list[UnitPart]:
        """The rank's part of every unit it meets, in unit order."""
        ids = self.touched_by(dims)
        per, _ = self._parts(dims, ids) if len(ids) else ([], None)
        out = []
        for k, uid in enumerate(ids.tolist()):
            region = self.region(uid)
            local, inner, full = [], [], True
            for (idx, lo, hi), r in zip(per, region, strict=True):
                a, b = int(lo[k]), int(hi[k])
                at = idx[a:b] - r.start
                box = int(at[-1]) - int(at[0]) == b - a - 1
                local.append(slice(a, b))
                inner.append(slice(int(at[0]), int(at[-1]) + 1) if box else at)
                full &= b - a == r.stop - r.start
            coords = tuple(int(c[0]) for c in self.coords(np.array([uid], np.int64)))
            out.append(UnitPart(coords, region, tuple(local), tuple(inner), full))
        return out

    def misaligned(self, dims: Sequence[DimSet]) -> str | None:
        """How a rank's piece covers a unit only in part, or None when it covers each whole
        (then, with the ranks tiling the array, no unit has two writers)."""
        if any(d.count <= 0 for d in dims):
            return None  # an empty piece meets no unit
        for k, (d, u, n) in enumerate(zip(dims, self.unit, self.shape, strict=True)):
            idx = d.indices()
            ids, counts = np.unique(idx // u, return_counts=True)
            extent = np.minimum((ids + 1) * u, n) - ids * u
            bad = np.flatnonzero(counts != extent)
            if len(bad):
                i, c = int(bad[0]), int(ids[bad[0]])
                return (
                    f"along dimension {k} it holds {int(counts[i])} of the {int(extent[i])} "
                    f"indices [{c * u}, {c * u + int(extent[i])}) of unit {c}"
                )
        return None

    # -- domains --------------------------------------------------------------
    def extent(self, lo: int, hi: int) -> tuple[int, int]:
        """``[lo, hi)`` widened to whole units."""
        ub = self.unit_nbytes
        return (lo // ub) * ub, -(-hi // ub) * ub

    def weights(self, first: int, end: int, only: npt.NDArray[np.bool_] | None = None) -> I64:
        """Real bytes of units ``[first, end)``; zero for those ``only`` (over all units) omits."""
        ids = np.arange(first, end, dtype=np.int64)
        w = self.valid_nbytes(ids)
        if only is not None:
            w = np.where(only[ids], w, 0)
        return w

    def domain_bounds(
        self,
        lo: int,
        hi: int,
        naggs: int,
        align: int,
        only: npt.NDArray[np.bool_] | None = None,
        shares: npt.NDArray[np.float64] | None = None,
    ) -> I64:
        """Cut ``[lo, hi)`` at multiples of ``align`` into ``naggs`` shares of real bytes.

        Padded edge units weigh what they hold, so the aggregator owning the last
        row of units is not short of work; with ``only`` (a flag per unit), only the
        flagged units weigh (e.g. those some rank touches).  ``shares`` (one weight
        per domain) makes the shares unequal; default equal.  Falls back to even
        byte shares when ``align`` is not a whole number of units, the extent has
        very many units or nothing weighs.
        """
        ub = self.unit_nbytes
        if naggs < 2 or hi <= lo or align % ub or (hi - lo) // ub > MAX_WEIGHED_UNITS:
            return file_domains(lo, hi, naggs, align)
        first = lo // ub
        w = self.weights(first, -(-hi // ub), only)
        if not w.any():
            return file_domains(lo, hi, naggs, align)
        cum = np.concatenate(([0], np.cumsum(w))).astype(np.int64)
        cand = np.arange(-(-lo // align) * align, hi, align, dtype=np.int64)
        cand = cand[cand > lo]
        if not len(cand):
            return np.array([lo] + [hi] * naggs, np.int64)
        wc = cum[cand // ub - first]
        if shares is not None and float(shares.sum()) > 0:
            frac = np.cumsum(shares)[:-1] / float(shares.sum())
            targets = np.floor(int(cum[-1]) * frac).astype(np.int64)
        else:
            targets = (int(cum[-1]) * np.arange(1, naggs, dtype=np.int64)) // naggs
        j = np.searchsorted(wc, targets)
        jl = np.maximum(j - 1, 0)
        jr = np.minimum(j, len(cand) - 1)
        left = (j == len(cand)) | ((j > 0) & (targets - wc[jl] <= wc[jr] - targets))
        cuts = np.where(left, cand[jl], cand[jr])
        bounds = np.concatenate(([lo], cuts, [hi])).astype(np.int64)
        return np.maximum.accumulate(np.clip(bounds, lo, hi)).astype(np.int64)

    def assignment(
        self, bounds: I64, only: npt.NDArray[np.bool_] | None = None
    ) -> list[dict[str, Any]]:
        """Per domain: its units ``[first, end)`` and their (weighing) real bytes, for stats."""
        ub = self.unit_nbytes
        first, end = bounds[:-1] // ub, -(-bounds[1:] // ub)
        if not len(first):
            return []
        base, top = int(first[0]), int(end[-1])
        if top - base > MAX_WEIGHED_UNITS:
            real = (end - first) * ub
        else:
            w = self.weights(base, top, only)
            cum = np.concatenate(([0], np.cumsum(w))).astype(np.int64)
            real = cum[end - base] - cum[first - base]
        return [
            {"units": [a, b], "nbytes": n}
            for a, b, n in zip(first.tolist(), end.tolist(), real.tolist(), strict=True)
        ]


def _merge_within(runs: Runs, unit_nbytes: int) -> Runs:
    """:func:`~collio.runs.merge` (runs sorted, non-empty) that never joins across units."""
    if len(runs) < 2:
        return runs
    f, n, m = runs.file, runs.length, runs.mem
    joined = (f[1:] == (f + n)[:-1]) & (m[1:] == (m + n)[:-1])
    joined &= f[1:] // unit_nbytes == f[:-1] // unit_nbytes
    if not joined.any():
        return runs
    starts = np.flatnonzero(np.concatenate(([True], ~joined)))
    lengths = np.add.reduceat(n, starts).astype(np.int64)
    return Runs(f[starts], lengths, m[starts])


def covered_below(runs: Runs, x: I64) -> I64:
    """Bytes of ``runs`` (sorted by offset, disjoint) below each offset in ``x``."""
    if not len(runs):
        return np.zeros(len(x), np.int64)
    before = np.concatenate(([0], np.cumsum(runs.length))).astype(np.int64)
    i = np.searchsorted(runs.file, x, side="right") - 1
    ic = np.maximum(i, 0)
    part = np.clip(x - runs.file[ic], 0, runs.length[ic])
    out: I64 = np.where(i >= 0, before[ic] + part, 0).astype(np.int64)
    return out
