"""A model-like state for checkpoint tests and jobs: every layout kind, and what each
rank must get back when another decomposition (and rank count) loads it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..layouts import Subarray, block, block_cyclic, dims_create
from ..layouts.arrays import ArrayLayout, BlockCyclic

__all__ = ["GLOBALS", "expected", "load_spec", "reference", "save_state"]

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
