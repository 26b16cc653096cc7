"""Several contiguous datasets of one file in one collective call: ``write_many``, ``read_many``.

A contiguous dataset is a byte range of the file, so a batch of pieces of several
datasets is a batch of the file's bytes: each item's layout is placed at its
dataset's offset (:class:`_Placed`) and the whole batch is one two-phase call on the
file (:func:`collio.engine.write_many`), after one metadata checkpoint for all of its
datasets.  Chunked datasets each have a chunk space of their own and are refused:
write them with :func:`~collio.h5.write_all`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import engine
from ..backends.hdf5.dataset import allocate_contiguous, storage_kind
from ..backends.hdf5.storage import check_dataset_layout
from ..comms import exclusive
from ..errors import LayoutError, ModeError
from ..layouts.base import Layout
from ..layouts.strided import Blocks
from ..runs import Runs, read_only
from .session import Session, session_of

__all__ = ["read_many", "write_many"]


class _Placed(Layout):
    """A dataset's layout at the dataset's file offset (None: not allocated, reads the
    fill value); checked against the dataset inside the call."""

    __slots__ = ("inner", "dset", "at")

    def __init__(self, inner: Any, dset: Any, at: int | None) -> None:
        super().__init__()
        self.inner, self.dset, self.at = inner, dset, at

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.inner.dtype  # type: ignore[no-any-return]

    @property
    def local_shape(self) -> tuple[int, ...]:
        return self.inner.local_shape  # type: ignore[no-any-return]

    @property
    def order(self) -> str:
        return self.inner.order  # type: ignore[no-any-return]

    def validate(self) -> None:
        if not isinstance(self.inner, Layout):
            raise LayoutError(f"layout must be a collio layout, not {type(self.inner).__name__}")
        self.inner.validate()
        check_dataset_layout(self.dset, self.inner)

    def signature(self) -> tuple[Any, ...] | None:
        return self.inner.signature()  # type: ignore[no-any-return]

    def blocks(self) -> Blocks:
        return self.inner.blocks()  # type: ignore[no-any-return]

    def runs(self) -> Runs:
        if self._runs is None:
            if self.at is None:
                self._runs = Runs.empty()
            else:
                r = self.inner.runs()
                self._runs = read_only(Runs(r.file + self.at, r.length.copy(), r.mem.copy()))
        return self._runs

    def as_bytes(self, data: Any) -> npt.NDArray[np.uint8]:
        return self.inner.as_bytes(data)  # type: ignore[no-any-return]

    def allocate(self, out: Any = None) -> tuple[np.ndarray[Any, Any], npt.NDArray[np.uint8]]:
        arr, view = self.inner.allocate(out)
        if self.at is None:  # never written: the fill value, as read_all gives
            fill = self.dset.fillvalue
            arr[...] = fill if fill is not None else 0
        return arr, view


def write_many(file: Any, items: Sequence[tuple[Any, Any, Layout]]) -> None:
    """Collective over `comm`: write pieces of several contiguous datasets in one call.

    ``items`` are ``(dataset, data, layout)`` triples, each what
    :func:`~collio.h5.write_all` takes, all datasets of ``file``; every rank passes the
    same datasets in the same order.  One metadata checkpoint, then one two-phase call
    over the union of every item's bytes in the file.
    """
    s = session_of(file)
    with exclusive(s.comm, "write_all_many"):
        placed = _checkpoint(s, file, [(it[0], it[2]) for it in items], writing=True)
        pairs = [(it[1], lay) for it, lay in zip(items, placed, strict=True)]
        _on_file(s, lambda ctx: engine.write_many(ctx, pairs))


def read_many(
    file: Any, items: Sequence[tuple[Any, Layout]], out: Sequence[Any] | None = None
) -> list[Any]:
    """Collective over `comm`: read pieces of several contiguous datasets in one call.

    ``items`` are ``(dataset, layout)`` pairs; returns one array per item (``out[k]``
    filled when given).  Datasets never written read as their fill value.
    """
    s = session_of(file)
    with exclusive(s.comm, "read_all_many"):
        placed = _checkpoint(s, file, list(items), writing=False)
        got: list[Any] = _on_file(s, lambda ctx: engine.read_many(ctx, placed, out))
        return got


def _checkpoint(
    s: Session, file: Any, pairs: list[tuple[Any, Any]], *, writing: bool
) -> list[_Placed]:
    """Collective: the batch's metadata checkpoint (as a single call's, with every
    dataset's storage in its key); allocates the contiguous datasets a write needs."""
    call = "write_all_many" if writing else "read_all_many"
    box: list[list[_Placed]] = []

    def key() -> tuple[Any, ...]:
        if writing and s.mode == "r":
            raise ModeError(f"write_all_many on {s.path!r} opened read-only")
        box.append([_placed(k, d, lay) for k, (d, lay) in enumerate(pairs)])
        return tuple((p.dset.name, p.at, tuple(p.dset.shape), p.dset.dtype.str) for p in box[0])

    def allocate() -> bool:
        late = [p for p in box[0] if p.at is None] if writing else []
        for p in late:  # (every rank alike, after the head: see api._call)
            allocate_contiguous(p.dset)
            p.at = int(p.dset.id.get_offset())
            s.vfile.forget(p.at, p.at + p.dset.dtype.itemsize)
        return bool(late)

    s.checkpoint(file, call=call, key=key, then=allocate)
    return box[0]


def _placed(k: int, dset: Any, layout: Any) -> _Placed:
    """Local: item ``k``'s layout placed at its dataset (a chunked one is refused)."""
    kind = storage_kind(dset)
    if kind != "contiguous":
        raise LayoutError(
            f"item {k}: dataset {dset.name!r} is {kind}: write_many and read_many take "
            "contiguous datasets (write chunked ones with write_all)"
        )
    return _Placed(layout, dset, dset.id.get_offset())


def _on_file(s: Session, act: Any) -> Any:
    """Collective: ``act`` on the file's bytes (no dataset bound: the items are placed)."""
    s.backend.bind(None, 0)
    try:
        return act(s.core.context(s.backend))
    finally:
        s.backend.unbind()
