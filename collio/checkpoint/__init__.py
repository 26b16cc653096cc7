"""Checkpoints: a job's named distributed arrays in ONE file or ONE S3 object.

>>> import collio.checkpoint as ckpt
>>> ckpt.save("step100.ckpt", {"w": (w_local, layouts.block(w_shape, "f4", grid=(4, 1)))})
>>> state = ckpt.load("step100.ckpt", {"w": layouts.block(w_shape, "f4", grid=(3, 1))})

Each saving rank's pieces of row-sharded (and replicated) arrays are stored one after
another in its own region of the file, so a save is one range written per rank; other
arrays are stored whole.  The index maps every array's bytes to the file, so a load at
any rank count reads the ranges it needs, and :func:`info` or a one-rank load needs no MPI.
Every extent has a CRC-32 checksum, verified at every load.  A save commits as a
whole (a temporary renamed, one multipart upload completed) once every rank agreed.
The format is in docs/checkpoint-format.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpi4py import MPI

from .asyncsave import SaveHandle, async_save, raise_untold, settle
from .load import Info, info, load
from .save import maps_later, prepare
from .writer import write

__all__ = ["Info", "SaveHandle", "async_save", "info", "load", "save"]


def save(
    target: Any,
    state: Mapping[str, Any],
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    metadata: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Collective over `comm`: save ``state`` to ``target`` (a path or ``s3://bucket/key``).

    ``state`` maps names to ``(piece, layout)`` (this rank's piece of a global array,
    any collio array layout) or to a plain array that is the same on every rank
    (stored once, by one rank); nested mappings are flattened with ``/`` (one holding no
    array has no name to store, and is not stored).  Pieces are
    numpy arrays or CPU objects with ``__array_interface__`` or ``__dlpack__``, used
    without a copy.  ``metadata`` (JSON values) travels along.  Any rank's error (a bad
    entry, a full disk, a refused upload) is raised on every rank alike and leaves the
    previous checkpoint at ``target`` as it was.  The :func:`async_save` running on
    ``comm`` (or writing ``target`` in this process) finishes first; one on ``comm``
    that failed with its handle never waited for is raised here instead of saving.
    """
    base = MPI.COMM_WORLD if comm is None else comm
    # (the communicator's async save first, whose error is raised here if nobody was
    # told of it; and one of another communicator writing the same target, so that this
    # save is the one left)
    raise_untold(base)
    settle(target)
    plan = prepare(base, state, metadata, huge=maps_later(target, options))
    write(base, target, plan, hints, dict(options))
