"""The ``-O key=value`` options of the zarr, S3, HDF5 and bare APIs (no optional imports here).

One namespace for all APIs of a run, so that ``--compare collio-zarr,zarr-plain
-O chunks=256,codec=zstd`` gives both the same array; each API reads the keys it
knows, and a key no API of the run reads is an error.
"""

from __future__ import annotations

from ..hints import parse_size

__all__ = ["ARRAY", "BARE", "HDF5", "OPTION_HELP", "S3", "ZARR", "parse_shape", "size_option"]

ARRAY = {
    "chunks": "chunk edge or shape, e.g. 512 or 512x256 (zarr: 512 in 2-D, 64 in 3-D; "
    "hdf5: contiguous unless given or a codec is)",
    "codec": "compression: zarr none|zstd|blosc|gzip; hdf5 none|gzip|lzf (none)",
    "level": "the codec's level (zstd 1, blosc 5, gzip 1)",
}
ZARR = {**ARRAY, "shards": "zarr shard edge or shape, a multiple of chunks (0: none)"}
HDF5 = dict(ARRAY)
S3 = {
    "endpoint": "S3 store URL (also --s3-endpoint; default: a local moto server)",
    "bucket": "bucket (collio-bench; rank 0 creates it)",
    "part_size": "multipart part size (default: what collio plans from cb_buffer_size)",
    "max_concurrency": "requests in flight per process (8)",
    "get_size": "one-process reads: bytes per ranged GET (64m)",
    "get_threads": "one-process reads: GETs at once (4)",
}
BARE = {"window": "bare: bytes per aggregator per round (4m)"}
OPTION_HELP = {**ZARR, **S3, **BARE}


def parse_shape(text: str, ndim: int, what: str) -> tuple[int, ...]:
    """``512`` (an edge) or ``512x256`` (a shape) for an array of ``ndim`` dimensions."""
    parts = [p for p in text.lower().split("x") if p]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"-O {what}={text!r}: give an edge (512) or a shape (512x256)") from None
    if len(values) == 1:
        values *= ndim
    if len(values) != ndim or any(v < 0 for v in values):
        raise ValueError(f"-O {what}={text!r}: the array has {ndim} dimensions")
    return values


def size_option(options: dict[str, str], key: str, default: int) -> int:
    """A byte count or number option (``16m``, ``8``)."""
    return parse_size(options[key], key) if key in options else default
