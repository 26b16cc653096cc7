"""A small two-phase call takes fewer aggregators (hint ``cb_min_domain``).

A column-strided array of a few KiB per rank goes two-phase; spread over every
aggregator, each rank would send each of them a message.  Below ``cb_min_domain`` bytes
per aggregator the call gives domains to fewer of them (the same choice on every rank,
from the agreed extent), reported in ``stats.last_call["aggregators"]``, and writes the
bytes numpy and ROMIO write.
"""

from __future__ import annotations

import numpy as np
import pytest

import collio
from collio.testing.romio import romio_read, romio_write

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 64, 16  # each rank's column block: 64 runs of 64 bytes (int32)
HINTS = {"mapped_reads": "disable"}


def _layout(comm):
    p, r = comm.size, comm.rank
    shape = (ROWS, COLS * p)
    return collio.layouts.Subarray(shape, (0, COLS * r), (ROWS, COLS), "<i4"), shape


def _global(shape, seed):
    return (
        np.random.default_rng(seed).integers(-(2**31), 2**31, shape, dtype=np.int64).astype("<i4")
    )


def _run(comm, path, hints, seed):
    """Write and read back the column blocks; the aggregators the write took."""
    lay, shape = _layout(comm)
    glob = _global(shape, seed)
    local = np.ascontiguousarray(glob[:, COLS * comm.rank : COLS * (comm.rank + 1)])
    with collio.open(path, "w", comm=comm, hints={**HINTS, **hints}) as f:
        f.write_all(local, lay)
        last = dict(f.stats.last_call)
        back = f.read_all(lay)
        read_aggs = f.stats.last_call["aggregators"]
        naggs = len(f.stats.aggregators)
    np.testing.assert_array_equal(back, local)
    return glob, local, last, read_aggs, naggs


@pytest.mark.mpi
def test_a_small_strided_call_takes_fewer_aggregators(comm, mpi_tmp_path):
    mine, theirs = str(mpi_tmp_path / "collio.bin"), str(mpi_tmp_path / "romio.bin")
    glob, local, last, read_aggs, naggs = _run(comm, mine, {}, seed=7)
    assert last["direct"] == (comm.size == 1), last  # (interleaved columns: two-phase)
    if not last["direct"]:
        # 4 KiB per rank is far below 1 MiB per aggregator: one aggregator
        assert last["aggregators"] == read_aggs == 1, (last, read_aggs)
        assert naggs == comm.size  # (the file's aggregators stay all ranks)
    lay, _ = _layout(comm)
    romio_write(theirs, local, lay, comm)
    comm.Barrier()
    with open(mine, "rb") as fh:
        ours = fh.read()
    with open(theirs, "rb") as fh:
        assert ours == fh.read()
    assert ours == glob.tobytes()
    np.testing.assert_array_equal(romio_read(mine, lay, comm), local)


@pytest.mark.mpi
@pytest.mark.parametrize("min_domain", [0, 4096, 1 << 30])
def test_the_hint_sets_how_many_aggregators_take_domains(comm, mpi_tmp_path, min_domain):
    path = str(mpi_tmp_path / f"hint-{min_domain}.bin")
    glob, _, last, read_aggs, naggs = _run(comm, path, {"cb_min_domain": min_domain}, seed=3)
    if not last["direct"]:
        span = ROWS * COLS * 4 * comm.size
        want = naggs if min_domain == 0 else max(1, min(naggs, span // min_domain))
        assert last["aggregators"] == read_aggs == want, (min_domain, last)
    with open(path, "rb") as fh:
        assert fh.read() == glob.tobytes()
