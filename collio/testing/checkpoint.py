"""A model-like state for checkpoint tests and jobs: every layout kind, and what each
rank must get back when another decomposition (and rank count) loads it."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ..layouts import Subarray, block, block_cyclic, dims_create
from ..layouts.arrays import ArrayLayout, BlockCyclic

__all__ = ["GLOBALS", "ROWS", "expected", "flip", "load_spec", "mapped", "one_range",
           "reference", "rows_layouts", "rows_reference", "rows_state", "save_state"]  # fmt: skip

#: name -> (global shape, dtype, order)
GLOBALS: dict[str, tuple[tuple[int, ...], str, str]] = {
    "embed": ((97, 24), "<f4", "C"),
    "attn/q": ((40, 30), "<f8", "C"),
    "ffn/w": ((33, 17), "<i4", "C"),
    "norm": ((50,), "<f2", "C"),
    "fortran": ((18, 26), "<c8", "F"),
    "tiny": ((3,), "<u2", "C"),
    "ffn/w2": ((11, 5), "<i4", "C"),
}
REPLICATED = {"rep/scale": ((5, 3), "<f8"), "rep/step": ((), "<i8")}


def flip(path: str, at: int, mask: int) -> None:
    """Flip the bits ``mask`` of the stored byte at ``at`` (a test damaging a target)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ mask]))


def reference(name: str) -> np.ndarray[Any, Any]:
    """The global value of ``name``, the same on every rank and in every job."""
    allnames = sorted([*GLOBALS, *REPLICATED])
    shape, dtype = (GLOBALS[name][:2]) if name in GLOBALS else REPLICATED[name]
    rng = np.random.default_rng(allnames.index(name) + 11)
    n = int(np.prod(shape, dtype=np.int64))
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, np.uint8)
    out = raw.view(dtype)
    if out.dtype.kind in "fc":  # no NaNs: comparisons stay meaningful
        out = (rng.standard_normal(n) * 100).astype(dtype)
    return out.reshape(shape)


def piece(name: str, lay: ArrayLayout) -> np.ndarray[Any, Any]:
    """This rank's piece of ``name`` under ``lay``, in the layout's memory order."""
    glob = reference(name)
    if isinstance(lay, Subarray):
        got = glob[lay.slices]
    elif isinstance(lay, BlockCyclic):
        got = glob[np.ix_(*lay.indices)]
    else:  # pragma: no cover - the layouts made here are the two kinds
        raise TypeError(type(lay))
    return np.asfortranarray(got) if lay.order == "F" else np.ascontiguousarray(got)


def _rows_but_last(shape: tuple[int, ...], dtype: str, rank: int, size: int) -> Subarray:
    """Row blocks over all ranks but the last (which holds nothing), when there are two."""
    writers = max(size - 1, 1)
    if rank >= writers:
        return Subarray(shape, (0, 0), (0, shape[1]), dtype)
    b = -(-shape[0] // writers)
    start = min(rank * b, shape[0])
    return Subarray(shape, (start, 0), (min(b, shape[0] - start), shape[1]), dtype)


def save_layouts(rank: int, size: int) -> dict[str, ArrayLayout]:
    """The saving job's decomposition of every sharded array."""
    kw: dict[str, Any] = {"rank": rank, "size": size}
    g = GLOBALS
    return {
        "embed": block(g["embed"][0], "<f4", grid=(size, 1), **kw),
        "attn/q": block(g["attn/q"][0], "<f8", grid=dims_create(size, 2), **kw),
        "ffn/w": block_cyclic(g["ffn/w"][0], "<i4", block=(4, 3), grid=(size, 1), **kw),
        "norm": block(g["norm"][0], "<f2", **kw),
        "fortran": block(g["fortran"][0], "<c8", grid=(1, size), order="F", **kw),
        "tiny": block(g["tiny"][0], "<u2", **kw),
        "ffn/w2": _rows_but_last((11, 5), "<i4", rank, size),
    }


def save_state(rank: int, size: int) -> dict[str, Any]:
    """The state ``ckpt.save`` takes, nested: ``{"attn": {"q": ...}, ...}``."""
    flat: dict[str, Any] = {
        name: (piece(name, lay), lay) for name, lay in save_layouts(rank, size).items()
    }
    flat.update({name: reference(name) for name in REPLICATED})
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        head, _, tail = name.partition("/")
        if tail:
            nested.setdefault(head, {})[tail] = value
        else:
            nested[head] = value
    return nested


def load_spec(rank: int, size: int) -> dict[str, Any]:
    """Another decomposition of every array (and None: the whole array on every rank)."""
    kw: dict[str, Any] = {"rank": rank, "size": size}
    g = GLOBALS
    return {
        "embed": block(g["embed"][0], "<f4", grid=(1, size), **kw),
        "attn/q": block_cyclic(
            g["attn/q"][0], "<f8", block=(3, 7), grid=dims_create(size, 2), **kw
        ),
        "ffn/w": block(g["ffn/w"][0], "<i4", grid=(size, 1), **kw),
        "norm": None,
        "fortran": block(g["fortran"][0], "<c8", grid=(size, 1), order="F", **kw),
        "tiny": block(g["tiny"][0], "<u2", **kw),
        "ffn/w2": Subarray((11, 5), (2, 1), (7, 3), "<i4") if rank == 0 else None,
        "rep/scale": None,
        "rep/step": None,
    }


def expected(name: str, lay: ArrayLayout | None) -> np.ndarray[Any, Any]:
    """What a load with ``lay`` (None: the whole array) must return for ``name``."""
    return reference(name) if lay is None else piece(name, lay)


def one_range(name: str, lay: ArrayLayout | None) -> bool:
    """Whether the piece ``lay`` of ``name`` is one range of the stored array's bytes held
    in that order (and not empty), from the elements' global numbers alone."""
    if lay is None:
        return True
    shape = GLOBALS[name][0] if name in GLOBALS else REPLICATED[name][0]
    order: Literal["C", "F"] = "F" if name in GLOBALS and GLOBALS[name][2] == "F" else "C"
    numbers = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape, order=order)
    if isinstance(lay, Subarray):
        got = numbers[lay.slices]
    else:
        assert isinstance(lay, BlockCyclic)
        got = numbers[np.ix_(*lay.indices)]
    flat = got.ravel(order=order)
    return len(flat) > 0 and bool((np.diff(flat) == 1).all())


def mappable(path: str, name: str, lay: ArrayLayout | None) -> bool:
    """Whether the piece ``lay`` of ``name`` (one range of its array) can be mapped from the
    checkpoint file at ``path``: one range of the file, or runs each at the same offset
    within a page in the file as in the array (:meth:`collio.checkpoint.Info.file_runs`)."""
    import mmap

    from ..checkpoint import info
    from ..checkpoint.save import span_of

    meta = info(path)
    lo, hi = (0, int(meta[name]["nbytes"])) if lay is None else span_of(lay)[:2]
    runs = meta.file_runs(name, lo, hi)
    at = lo + np.concatenate([[0], np.cumsum([n for _, n in runs])[:-1]])
    congruent = ((f - a) % mmap.PAGESIZE == 0 for (f, _), a in zip(runs, at, strict=True))
    return len(runs) == 1 or all(congruent)


def stored(path: str, name: str) -> bytes:
    """The bytes of array ``name`` as the file at ``path`` stores them (its runs joined)."""
    from ..checkpoint import info

    with open(path, "rb") as fh:
        out = []
        for off, n in info(path).file_runs(name):
            fh.seek(off)
            out.append(fh.read(n))
    return b"".join(out)


def mapped(arr: Any) -> bool:
    """Whether ``arr`` is a view of a checkpoint file's map (:mod:`collio.checkpoint.filemap`)."""
    from ..checkpoint.filemap import FileMap

    base = arr
    while base is not None:
        if isinstance(base, FileMap):
            return True
        base = getattr(base, "base", None)
    return False


#: A state of row shards only (every piece one range of its array, the ranks' pieces of
#: every array interleaved in the file): the save's direct path.  name -> (shape, dtype)
ROWS: dict[str, tuple[tuple[int, ...], str]] = {
    "a": ((64, 1000), "<f8"),
    "b": ((37, 333), "<i4"),
    "c": ((1001,), "<u1"),
    "d": ((5, 2, 3), "<f4"),
}


def rows_reference(name: str, scale: int = 1) -> np.ndarray[Any, Any]:
    """The global value of row-state array ``name`` (``scale`` times the rows)."""
    shape, dtype = ROWS[name]
    shape = (shape[0] * scale, *shape[1:])
    rng = np.random.default_rng(sorted(ROWS).index(name) + 101)
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return rng.integers(0, 256, n, np.uint8).view(dtype).reshape(shape)


def rows_layouts(rank: int, size: int, scale: int = 1) -> dict[str, ArrayLayout]:
    """Row blocks of every row-state array over ``size`` ranks."""
    out: dict[str, ArrayLayout] = {}
    for name, (shape, dtype) in ROWS.items():
        shape = (shape[0] * scale, *shape[1:])
        grid = (size,) + (1,) * (len(shape) - 1)
        out[name] = block(shape, dtype, grid=grid, rank=rank, size=size)
    return out


def rows_state(rank: int, size: int, scale: int = 1) -> dict[str, Any]:
    """This rank's row shards of the row state, and one replicated value."""
    state: dict[str, Any] = {}
    for name, lay in rows_layouts(rank, size, scale).items():
        assert isinstance(lay, Subarray)
        state[name] = (np.ascontiguousarray(rows_reference(name, scale)[lay.slices]), lay)
    state["rep"] = np.arange(7, dtype="<i8")
    return state


def shifted_rows(rank: int, size: int) -> Subarray:
    """Row blocks of row-state array ``a`` cut 3 rows off the saving job's edges (a save
    by :func:`rows_state` at ``size`` ranks): every extent the save cut at its edges lies
    across two pieces of this load."""
    rows, cols = ROWS["a"][0]
    edges = [0, *[min(rows, rows * r // size + 3) for r in range(1, size)], rows]
    lo, hi = edges[rank], edges[rank + 1]
    return Subarray((rows, cols), (lo, 0), (hi - lo, cols), "<f8")


def flip_past_first_edge(comm: Any, path: str) -> None:
    """Collective: once every rank is done with its arrays (a mapped one would show the
    flip), rank 0 flips a bit of row-state array ``a`` in the checkpoint at ``path``
    just past the first piece edge of a save by :func:`rows_state` at ``comm``'s size
    (mid-array at one rank): a byte of an extent a :func:`shifted_rows` load holds in
    two ranks' pieces."""
    from ..checkpoint import info

    comm.Barrier()
    if comm.Get_rank() == 0:
        shape, dtype = ROWS["a"]
        edge = int(np.prod(shape)) * np.dtype(dtype).itemsize // max(comm.Get_size(), 2)
        flip(path, info(path).file_offset("a", edge + 5), 1)
    comm.Barrier()
