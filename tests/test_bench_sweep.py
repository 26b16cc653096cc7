"""collio-bench --sweep end to end: small jobs under mpiexec (with timeouts)."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import textwrap

import numpy as np
import pytest

import collio
from collio.bench.cli import build_parser
from collio.bench.sweep.config import config
from collio.bench.sweep.report import summarize
from collio.bench.sweep.run import Budget, Result
from collio.bench.sweep.work import Step, expected
from collio.testing.jobs import MPIEXEC, mpiexec

BENCH = [sys.executable, "-m", "collio.bench"]
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
APIS = ["collio", "mpiio", "mpiio-tuned"]
HAS_MANY = hasattr(collio.File, "write_all_many") and hasattr(collio.File, "read_all_many")


@needs_mpiexec
def test_sweep_verifies_every_api_size_and_pattern_and_saves(tmp_path):
    out, png, prefix = tmp_path / "s.json", tmp_path / "s.png", tmp_path / "f"
    args = [*BENCH, "--sweep", "8,4k", "-i", "2", "--batch", "3", "-o", str(prefix)]
    proc = mpiexec([*args, "--json", str(out), "--plot", str(png)], n=3, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Time per call, ms" in proc.stdout and "all right" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "sweep" and doc["nranks"] == 3 and doc["errors"] == 0
    assert doc["apis"] == APIS and doc["sizes"] == [8, 4096] and doc["fsync"] is False
    got = {(r["kind"], r["pattern"], r["op"], r["size"], r["api"]): r for r in doc["results"]}
    batch_apis = [*(["collio-many"] if HAS_MANY else []), *APIS, "ceiling"]
    assert doc["batch_apis"] == batch_apis and doc["batch_sizes"] == [8, 4096]
    assert doc["call_apis"] == [*APIS, "ceiling"]
    want = {
        ("call", p, o, s, a)
        for p, o, s, a in itertools.product(
            ("contiguous", "strided"), ("write", "read"), (8, 4096), [*APIS, "ceiling"]
        )
    }
    want |= {("batch", p, o, s, a) for p, o, s, a in itertools.product(
             ("contiguous", "strided"), ("write", "read"), (8, 4096), batch_apis)}  # fmt: skip
    want |= {("file", None, o, None, a) for o in ("open", "sync", "close") for a in APIS}
    assert set(got) == want
    for key, r in got.items():
        assert (
            r["calls"] == 2
            and len(r["times"]) == 2
            and r["count"] == (3 if key[0] == "batch" else 1)
        )
        assert 0 < r["min"] <= r["median"] <= r["max"]
        if key[4] == "ceiling" and key[2] == "write":  # (its own layout: checked by reading)
            assert r["verified"] == 0 and r["errors"] is None and r["family"] == "ceiling", key
        elif key[0] != "file":  # the first call of every API, size and pattern, byte for byte
            assert r["verified"] == 1 and r["errors"] == 0, key
        assert (r["ratio"] is not None) is (r["family"] == "collio"), key
    best = min(got["call", "strided", "read", 4096, a]["median"] for a in ("mpiio", "mpiio-tuned"))
    mine = got["call", "strided", "read", 4096, "collio"]
    assert mine["ratio"] == pytest.approx(mine["median"] / best)
    assert got["call", "strided", "write", 4096, "collio"]["path"] == "two-phase"
    assert got["call", "contiguous", "write", 8, "collio"]["path"] == "direct"
    if not HAS_MANY:
        assert "write_all_many" in doc["unavailable"]["collio-many"]
        assert "# collio-many: not run: collio.File has no write_all_many" in proc.stdout
    assert doc["hints_used"]["mpiio-tuned"]["cb_nodes"] == "3"
    assert doc["hints_used"]["mpiio-tuned"]["cb_config_list"] == "*:*"
    assert doc["hints_used"]["collio"]["cb_nodes"] == 3
    assert doc["machine"]["nodes"] == 1 and "single_copy" in doc["machine"]
    assert doc["command"][:3] == ["collio-bench", "--sweep", "8,4k"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.glob("f.*")) == []  # every API's file removed without -k


BROKEN = textwrap.dedent(
    """
    import sys
    from mpi4py import MPI
    from collio.bench.cli import main
    from collio.bench.sweep import callers

    write, read = callers.RomioCaller.write, callers.RomioCaller.read

    def bad_write(self, arg):  # mpiio leaves each rank's first element out
        offset, buf = arg
        if self.name != "mpiio":
            return write(self, arg)
        self.fh.Write_at_all(offset + 8, [buf[0][8:], MPI.BYTE])

    def no_read(self, arg):  # mpiio-tuned reads nothing at all
        if self.name != "mpiio-tuned":
            read(self, arg)

    callers.RomioCaller.write, callers.RomioCaller.read = bad_write, no_read
    sys.exit(main(sys.argv[1:]))
    """
)


@needs_mpiexec
def test_sweep_counts_wrong_elements_and_fails(tmp_path):
    """-W / -R check every call: a missing element per rank and step, and reads that never
    happened, are counted exactly, and the exit status says so."""
    script, out = tmp_path / "broken.py", tmp_path / "b.json"
    script.write_text(BROKEN)
    args = [sys.executable, str(script), "--sweep", "64", "--sweep-patterns", "contiguous"]
    args += ["--batch", "0", "--calls", "none", "-i", "3", "-W", "-R", "--json", str(out)]
    proc = mpiexec([*args, "-o", str(tmp_path / "f")], n=2, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "WRONG" in proc.stdout
    doc = json.loads(out.read_text())
    errors = {(r["api"], r["op"]): (r["errors"], r["verified"]) for r in doc["results"]}
    assert errors == {
        ("collio", "write"): (0, 3), ("collio", "read"): (0, 3),
        ("mpiio", "write"): (2 * 3, 3), ("mpiio", "read"): (2 * 3, 3),  # (it reads its file)
        ("mpiio-tuned", "write"): (0, 3), ("mpiio-tuned", "read"): (8 * 2 * 3, 3),
        ("ceiling", "write"): (None, 0), ("ceiling", "read"): (0, 3),  # (its own layout)
    }  # fmt: skip


SHORT = textwrap.dedent(
    """
    import sys
    from mpi4py import MPI
    from collio.bench.cli import main
    from collio.bench.sweep import callers

    each = callers.CeilingCaller._each

    def short_on_rank_1(self, move, offset, bufs):  # rank 1's third request writes nothing
        self.calls = getattr(self, "calls", 0) + 1
        if MPI.COMM_WORLD.rank == 1 and self.calls == 3:
            move = lambda fd, part, at: 0  # noqa: E731
        each(self, move, offset, bufs)

    callers.CeilingCaller._each = short_on_rank_1
    sys.exit(main(sys.argv[1:]))
    """
)


@needs_mpiexec
def test_a_ceiling_request_short_on_one_rank_fails_the_sweep_on_every_rank(tmp_path):
    """The ceiling agrees its outcome as collio's calls do: a short request on one rank is an
    error on every rank (no rank left in the allreduce), and the sweep exits with it."""
    script = tmp_path / "short.py"
    script.write_text(SHORT)
    args = [sys.executable, str(script), "--sweep", "64", "--sweep-patterns", "contiguous"]
    args += ["--batch", "0", "--calls", "none", "-i", "5", "-o", str(tmp_path / "f")]
    proc = mpiexec(args, n=3, timeout=120)
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "ceiling: short request at byte" in proc.stderr, proc.stderr[-3000:]
    assert "rank 1" in proc.stderr, proc.stderr[-3000:]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--sweep", *argv])


def test_config_defaults_and_refusals():
    cfg, skipped = config(_args(), [])
    assert cfg.sizes == (8, 4096, 65536, 1 << 20, 8 << 20, 128 << 20)
    assert cfg.batch_sizes == (8, 4096, 65536, 1 << 20)  # a batch of 200 up to 256 MiB per rank
    assert cfg.patterns == ("contiguous", "strided") and cfg.runs == 64 and cfg.batch == 200
    assert cfg.apis == tuple(APIS) and cfg.fsync is False and cfg.read
    assert cfg.calls == ("open", "sync", "close") and cfg.budget == Budget(5, 50, 0.5)
    assert (skipped == {}) is HAS_MANY
    cfg, _ = config(_args("1m", "-e", "-i", "7", "--calls", "none", "--batch", "0", "-w"), [])
    assert cfg.fsync and cfg.budget == Budget(7, 7, 0.0) and cfg.calls == () and not cfg.read
    assert cfg.batch_sizes == ()
    for argv, msg in ((("100",), "multiples of 8"), (("1k", "--runs", "3"), "multiple of 24"),
                      (("8", "--compare", "posix"), "not 'posix'"),
                      (("8", "--compare", "collio-many"), "the batch call"),
                      (("8", "-r"), "reads the steps it wrote"),
                      (("8", "--sweep-patterns", "diagonal"), "known: contiguous, strided"),
                      (("8", "--calls", "seek"), "known: open, sync, close")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            config(_args(*argv), [])


def test_steps_tile_the_file_and_follow_each_other():
    """Every step's pieces cover it exactly once, and the data is the file's own values."""
    for pattern, size in (("contiguous", 64), ("strided", 4096), ("strided", 8)):
        work = Step(pattern, size, 3)
        file = np.zeros(2 * work.step_elements)
        for rank, step in itertools.product(range(3), range(2)):
            lay = work.layout(rank, step)
            assert lay.local_shape == work.local_shape
            data = work.first(rank).reshape(-1) + step * work.step_elements
            runs = lay.runs()
            pieces = zip(runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True)
            for f, n, m in pieces:
                file[f // 8 : (f + n) // 8] += data[m // 8 : (m + n) // 8]
        assert np.array_equal(file, expected(0, file.size)), (pattern, size)
    assert Step("strided", 4096, 3).rows == 64 and Step("strided", 8, 3).rows == 1


def test_ratios_are_over_the_better_romio_of_the_same_size():
    def res(api: str, family: str, t: float, size: int = 8) -> Result:
        return Result("call", "contiguous", "write", size, api, family, 1, [t, t * 3, t / 2],
                      0, 1, None)  # fmt: skip

    rows = summarize([res("collio", "collio", 2.0), res("mpiio", "romio", 0.5),
                      res("mpiio-tuned", "romio", 0.25), res("collio", "collio", 1.0, 16),
                      res("mpiio", "romio", 2.0, 16)])  # fmt: skip
    assert [r["ratio"] for r in rows] == [8.0, None, None, 0.5, None]
    assert rows[0]["median"] == 2.0 and rows[0]["min"] == 1.0 and rows[0]["max"] == 6.0
