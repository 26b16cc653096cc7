"""collio-bench's ``bare`` API (two-phase without collio) and ``--flatten-speed``."""

from __future__ import annotations

import json
import sys

import pytest

from collio.bench.bare import BareApi
from collio.bench.flatten import flatten_speed
from collio.bench.patterns import make_workload
from collio.testing.jobs import MPIEXEC, mpiexec

BENCH = [sys.executable, "-m", "collio.bench"]


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
def test_bare_writes_and_reads_the_layout_beside_collio(tmp_path):
    """Every iteration verified (-W -R): the bare pipeline places each rank's column block
    where collio does, in four rounds of 64 KiB per aggregator."""
    out = tmp_path / "bare.json"
    args = [*BENCH, "--compare", "bare,collio,ceiling", "--size", "256", "-i", "2", "-W", "-R"]
    args += ["-O", "window=64k", "--json", str(out), "-o", str(tmp_path / "f")]
    proc = mpiexec(args, n=2, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == 0 and doc["apis"] == ["bare", "collio", "ceiling"]
    bare = [r for r in doc["rows"] if r["api"] == "bare"]
    assert len(bare) == 4 and all(r["errors"] == 0 for r in bare)  # checked, nothing wrong
    assert doc["hints_used"]["bare"]["bare_window"] == 64 << 10


@pytest.mark.parametrize(
    ("pattern", "size", "window", "text"),
    [("cyclic", "256", "64k", "colblock only"), ("colblock", "256x250", "64k", "split over"),
     ("colblock", "256", "3000", "whole windows")],
)  # fmt: skip
def test_bare_refuses_what_it_cannot_do_before_any_io(pattern, size, window, text):
    work = make_workload(pattern, 2, size=size)
    with pytest.raises(ValueError, match=text):
        BareApi.check(work, {"window": window}, True)


def test_flatten_speed_counts_the_runs_it_timed():
    t = flatten_speed(runs=10_000, repeat=1)
    assert t["subarray_runs"] == 100 * 100  # 100 x 100 rows of 32 contiguous doubles
    assert t["darray_runs"] == 400 * 400 // 16  # CYCLIC(4) on 2 x 2: n/2 rows of n/8 runs
    assert t["subarray_s"] > 0 and t["darray_s"] > 0
