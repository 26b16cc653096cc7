"""zarr arrays written by collio under mpiexec, read back here by plain zarr.

The writers are a separate mpiexec job; this process only uses zarr itself, so
what is checked is what any zarr reader sees.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from zarr_cases import BY_NAME, CASES, NRANKS, chunk_keys  # noqa: E402

MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_job(script, *args, n=NRANKS, timeout=300, env=None):
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, full.get("PYTHONPATH", "")])
    cmd = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(HERE, script), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def stored_units(path: str) -> set[tuple[int, ...]]:
    """Grid coordinates of the chunk (or shard) objects present under ``path/c``."""
    out = set()
    base = os.path.join(path, "c")
    for root, _, files in os.walk(base):
        rel = os.path.relpath(root, base)
        parts = [] if rel == "." else rel.split(os.sep)
        out |= {tuple(int(p) for p in [*parts, f]) for f in files}
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("zarr-job")
    run_job("zarr_job.py", d, *[c.name for c in CASES])
    with open(d / "results.json") as fh:
        return d, json.load(fh)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_plain_zarr_reads_what_collio_wrote(job, name):
    d, results = job
    case = BY_NAME[name]
    arr = zarr.open_array(str(d / f"{name}.zarr"), mode="r")
    want, mask = case.expected()
    np.testing.assert_array_equal(arr[...], want)
    assert results[name]["readback"]
    # exactly the units some rank touched exist; untouched ones keep the fill value, unstored
    unit = arr.shards or arr.chunks
    assert stored_units(str(d / f"{name}.zarr")) == chunk_keys(case.shape, unit, mask)


def test_each_chunk_is_written_and_read_once(job):
    _, results = job
    r = results["misaligned"]  # 100 chunks, each stored and decoded once
    assert r["write_ops"] == 100 and r["fill_reads"] == 0 and r["read_ops"] == 100
    # 333/667 is skewed (one rank holds 4/9 of the array): had each rank stored the 81
    # chunks it alone touches, that rank would do far more than a quarter, so every
    # chunk goes through the aggregators, 25 each
    assert [d["nbytes"] for d in r["domains"]] == [2_000_000] * 4
    # the r+ update's even 2 x 2 cut (row 455, column 453) shares 17 chunks: only they
    # go through the aggregators; the others are stored by the one rank in them, and
    # the shared ones go to the aggregators with the least of their own (water filling)
    u = results["update"]
    shared = np.array([d["nbytes"] for d in u["domains"]])
    assert shared.sum() == 17 * 80_000
    own = np.array(u["kept"])[u["aggregators"]]
    assert own.min() > 0 and own.max() > own.min()  # 400/333 rows/columns: uneven
    light, heavy = shared[own == own.min()], shared[own == own.max()]
    assert light.min() >= 7 * 80_000 and heavy.max() <= 80_000, (own, shared)
    assert results["update"]["fill_reads"] == 4  # the shared ones on the box's border
    # the box [150, 620) x [230, 710) meets 6 x 6 chunks; the 4 x 4 inside it are whole.
    # Its cut (row 361, column 530) is balanced, so ranks keep the chunks they alone
    # touch (zarr merges a partial one itself); the 11 chunks of chunk row 3 and chunk
    # column 5 go through aggregators, and the 4 of them on the border are read, merged
    # and rewritten by their aggregator
    p = results["partial"]
    assert p["write_ops"] == 36 and p["fill_reads"] == 4


def test_only_unshared_chunks_skip_the_shuffle(job):
    _, results = job
    assert results["aligned"]["direct_calls"] == 2  # write and read: every chunk has one rank
    assert results["1d"]["direct_calls"] == 0  # 100003 / 4 ranks is not a multiple of 4096
    assert results["misaligned"]["direct_calls"] == 0 and results["sharded"]["direct_calls"] == 0


def test_shards_have_one_writer_each(job):
    d, results = job
    assert results["sharded"]["write_ops"] == 16  # 4 x 4 shards, not 256 inner chunks
    arr = zarr.open_array(str(d / "sharded.zarr"), mode="r")
    assert arr.shards == (200, 200) and arr.chunks == (50, 50)


def test_negative_control_plain_zarr_loses_shard_data_collio_does_not(tmp_path):
    run_job("zarr_race_job.py", tmp_path)
    with open(tmp_path / "race.json") as fh:
        race = json.load(fh)
    glob = np.arange(400 * 400, dtype="<i4").reshape(400, 400) + 1
    plain = zarr.open_array(str(tmp_path / race["plain"]), mode="r")[...]
    assert race["lost"] and not np.array_equal(plain, glob)
    lost_quadrants = sum(
        not np.array_equal(plain[i : i + 200, j : j + 200], glob[i : i + 200, j : j + 200])
        for i in (0, 200) for j in (0, 200)
    )  # fmt: skip
    assert lost_quadrants >= 1
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "collio.zarr"))[...], glob)
