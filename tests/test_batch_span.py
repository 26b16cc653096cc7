"""A batch's memory span: it keeps its items alive and is never touched between them."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
from mpi4py import MPI

import collio
from collio import batch, layouts
from collio.testing.guarded import guarded_like


def _items() -> tuple[list[tuple[Any, Any]], list[bytes]]:
    """Three items whose arrays live only in the returned list, each in its own pages
    of one mapping (unmapped when the last of them goes), and their bytes."""
    datas = guarded_like([np.arange(n, dtype="<f8") + n for n in (3, 600, 40)])
    lays = [layouts.Subarray((d.size,), (0,), (d.size,), "<f8", offset=k * 8192)
            for k, d in enumerate(datas)]  # fmt: skip
    return list(zip(datas, lays, strict=True)), [d.tobytes() for d in datas]


def test_span_holds_the_items_it_covers(tmp_path):
    """Dropping every other reference to the items (temporaries) leaves the span valid:
    were it a bare address range, reading it would touch unmapped memory and fault."""
    with collio.open(str(tmp_path / "x.bin"), "w", comm=MPI.COMM_SELF) as f:
        items, want = _items()
        runs, whole, arrays, _ = batch.gather(f.backend, items, writing=True)
        del items, arrays
        gc.collect()
        got = [whole[m : m + n].tobytes() for m, n in zip(runs.mem, runs.length, strict=True)]
    assert not whole.flags.writeable  # (a write's span: nothing writes through it)
    assert b"".join(got) == b"".join(want)  # runs in file order: the items' order here


def test_read_only_data_and_temporaries(tmp_path):
    """A write's data may be read-only (bytes) or made for the call alone."""
    path = str(tmp_path / "ro.bin")
    seg = layouts.Segments([0, 100], [5, 3])
    lay = layouts.Subarray((4,), (0,), (4,), "<i4", offset=16)
    with collio.open(path, "w", comm=MPI.COMM_SELF) as f:
        f.write_all_many([(b"abcdefgh", seg), (np.arange(4, dtype="<i4") * 7, lay)])
        back = f.read_all_many([seg, lay])
    assert back[0].tobytes() == b"abcdefgh"
    np.testing.assert_array_equal(back[1], [0, 7, 14, 21])
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw[:5] == b"abcde" and raw[100:103] == b"fgh"
    assert raw[16:32] == (np.arange(4, dtype="<i4") * 7).tobytes()  # the Subarray at offset 16
