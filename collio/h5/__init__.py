"""HDF5 through h5py: collective dataset writes and reads with the ordinary h5py wheel.

Importing this module registers the h5py driver ``"collio"``::

    import collio.h5
    f = h5py.File("out.h5", "w", driver="collio", comm=comm)   # every rank
    grp = f.create_group("run")                                # same calls everywhere
    d = collio.h5.create_dataset(grp, "x", (4096, 4096), "f8")
    collio.h5.write_all(d, local, layout)                      # two-phase, collective
    collio.h5.collective(d)[lay.slices] = local                # the same, h5py style
    collio.h5.close(f)                                         # collective: agree, fsync

Metadata operations (groups, datasets, attributes) are collective in the sense of
parallel HDF5: every rank makes the same calls in the same order.  Rank 0's library
writes the real file; the others keep replicas in memory built by the same calls.
Every collective collio call starts with one agreement, as :class:`collio.File`'s do,
that checks that all ranks made the same call (on the same file and dataset) and wrote
the same metadata (a digest of every byte each library wrote), and raises the same
:class:`~collio.errors.MismatchError` on every rank when they did not.
``import collio`` does not import h5py; ``import collio.h5`` does.
"""

from __future__ import annotations

from typing import Any

import h5py

from .api import (
    Collective,
    File,
    close,
    collective,
    create_dataset,
    flush,
    info,
    read_all,
    stats,
    write_all,
)
from .driver import set_fapl
from .many import read_many, write_many

__all__ = [
    "Collective",
    "File",
    "close",
    "collective",
    "create_dataset",
    "flush",
    "info",
    "read_all",
    "read_many",
    "register",
    "stats",
    "write_all",
    "write_many",
]

DRIVER = "collio"


def register(name: str = DRIVER) -> None:
    """Register the h5py driver (done on import): ``h5py.File(..., driver=name, comm=comm)``."""
    h5py.register_driver(name, set_fapl)


def _registered(name: str = DRIVER) -> Any:
    return name in h5py.registered_drivers()


register()
