"""collio: two-phase collective I/O for Python, on mpi4py and numpy.

Ranks hold pieces of one global array (column blocks, block-cyclic tiles, 3-D
subdomains, raw byte runs); collio shuffles the pieces to a few aggregators with
MPI so that storage sees few, large, sequential requests.

>>> import collio
>>> from collio import layouts
>>> lay = layouts.block((4096, 4096), "f8")
>>> with collio.open("matrix.bin", "w") as f:
...     f.write_all(local, lay)

``import collio`` imports numpy and mpi4py only; h5py, zarr and boto3 are imported
by their backends when used.
"""

from __future__ import annotations

from . import layouts
from ._version import __version__
from .backends import get_backend, known_backends, register_backend
from .engine import release_buffers
from .errors import (
    BackendError,
    BackendUnavailableError,
    ChecksumError,
    CollioError,
    CommitError,
    ConcurrentCallError,
    HintError,
    LayoutError,
    MismatchError,
    ModeError,
    NotFoundError,
    OverlapError,
)
from .file import File, open
from .hints import Hints, HintWarning
from .npy import load_npy, save_npy
from .stats import Stats

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ChecksumError",
    "CollioError",
    "CommitError",
    "ConcurrentCallError",
    "File",
    "HintError",
    "HintWarning",
    "Hints",
    "LayoutError",
    "MismatchError",
    "ModeError",
    "NotFoundError",
    "OverlapError",
    "Stats",
    "__version__",
    "get_backend",
    "known_backends",
    "layouts",
    "load_npy",
    "open",
    "register_backend",
    "release_buffers",
    "save_npy",
]
