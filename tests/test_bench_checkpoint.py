"""The checkpoint benchmark's controls: the ratios beside the compute slowdown and the
background threads' CPU, printed and returned for the JSON, from the job's medians."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from collio.bench.checkpoint import BLOCKED, CPU, _controls, _permute
from collio.testing.jobs import MPIEXEC, mpiexec


def test_controls_are_ratios_of_the_medians_and_the_threads_cpu_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    med = {
        "compute alone": 0.050,
        "compute during I/O": 0.060,
        "compute during plain write": 0.055,
        f"{CPU}I/O": 0.004,
        f"{CPU}plain write": 0.002,
        f"{BLOCKED}I/O": 0.003,
    }  # (no thread copy this job: its rows are left out, not made up)
    got = {c["control"]: c for c in _controls(med)}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert set(got) == {
        "compute slowdown during a plain write thread",
        "compute during async I/O vs during a plain write",
        f"{CPU}I/O",
        f"{CPU}plain write",
        f"{BLOCKED}I/O",
    }
    assert got[f"{BLOCKED}I/O"]["seconds"] == 0.003
    assert got[f"{BLOCKED}I/O"]["of_loop"] == pytest.approx(0.003 / 0.060)
    assert got["compute slowdown during a plain write thread"]["ratio"] == pytest.approx(1.1)
    assert got["compute during async I/O vs during a plain write"]["ratio"] == pytest.approx(
        0.060 / 0.055
    )
    assert got[f"{CPU}I/O"]["seconds"] == 0.004
    assert got[f"{CPU}I/O"]["of_cores"] == pytest.approx(0.004 / (0.060 * (cores or 1)))
    assert got[f"{CPU}plain write"]["of_cores"] == pytest.approx(0.002 / (0.055 * (cores or 1)))
    out = capsys.readouterr().out
    assert "controls (no targets):" in out
    assert "compute slowdown during a plain write thread" in out and " 1.100" in out
    assert "4.0 ms" in out and "thread copy" not in out
    assert "3.0 ms, 5.0% of the loop" in out


@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_a_test_directory_that_cannot_be_made_fails_every_rank(tmp_path: Any) -> None:
    """``-o`` naming no directory: rank 0 cannot make the job's directory in it, and
    every rank raises that error (the job ends instead of the others waiting for it)."""
    where = str(tmp_path / "absent" / "deeper")
    proc = mpiexec(
        [sys.executable, "-m", "collio.bench", "--pattern", "checkpoint", "--size", "1MiB",
         "-i", "1", "-o", where], n=2, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.count("collio-bench checkpoint: rank 0: no such file") == 2, proc.stderr


def test_the_compute_loops_take_every_order_by_turns() -> None:
    """Over six iterations each of the three loops (alone, during the async save, beside
    a control) comes first twice and follows each other one twice: none is measured after
    the async save's I/O more often than another."""
    names = ["compute alone", "async_save", "compute during plain write"]
    orders = [_permute(names, k) for k in range(6)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert len({tuple(o) for o in orders}) == 6
    for a in names:
        assert sum(o[0] == a for o in orders) == 2
        for b in names:
            if a != b:
                assert sum(o[i + 1] == a and o[i] == b for o in orders for i in range(2)) == 2
    assert _permute(names, 7) == orders[1]
