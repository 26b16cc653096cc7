"""A writer of version 1 checkpoints (every array stored whole, in order), kept so tests
can check that files saved by earlier collio releases still load.  No MPI."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..checkpoint import format

__all__ = ["write_v1"]


def write_v1(path: str, arrays: Mapping[str, Any], *, block: int = 1 << 12,
             metadata: Any = None) -> None:  # fmt: skip
    """``arrays`` (name -> global array; C order) as a version 1 checkpoint at ``path``:
    each array at its :func:`~collio.checkpoint.format.place` offset, extents every
    ``block`` bytes, the extent table of (start, crc32c) rows, the index, the trailer."""
    import crc32c

    names = sorted(arrays)
    data = [np.ascontiguousarray(arrays[n]) for n in names]
    offsets, end = format.place([a.nbytes for a in data])
    rows: list[tuple[int, int]] = []
    entries = {}
    with open(path, "wb") as fh:
        fh.write(format.HEADER.pack(format.MAGIC, 1))
        for name, arr, off in zip(names, data, offsets.tolist(), strict=True):
            raw = arr.reshape(-1).view(np.uint8)
            starts = list(range(0, arr.nbytes, block))
            entries[name] = {
                "shape": list(arr.shape), "dtype": np.lib.format.dtype_to_descr(arr.dtype),
                "order": "C", "offset": off, "nbytes": arr.nbytes, "replicated": False,
                "extents": [len(rows), len(starts)],
            }  # fmt: skip
            rows += [(s, crc32c.crc32c(raw[s : s + block].tobytes())) for s in starts]
            fh.seek(off)
            fh.write(raw.tobytes())
        table = np.array(rows, format.EXTENT_V1).tobytes()
        doc = json.dumps({
            "format": "collio-checkpoint", "version": 1, "arrays": entries,
            "extent_table": {"offset": end, "count": len(rows), "crc32c": crc32c.crc32c(table)},
            "metadata": metadata,
        }).encode()  # fmt: skip
        fh.seek(end)
        fh.write(table + doc)
        fh.write(format.TRAILER.pack(format.MAGIC, 1, end + len(table), len(doc),
                                     crc32c.crc32c(doc), format.MAGIC))  # fmt: skip
