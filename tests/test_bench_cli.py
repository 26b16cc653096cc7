"""collio-bench end to end: jobs under mpiexec (with timeouts)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from collio.bench.apis import Api, get_api, known_apis, register_api, split_runs
from collio.bench.report import summarize
from collio.bench.run import Row
from collio.hints import Hints
from collio.runs import Runs
from collio.testing.jobs import MPIEXEC, mpiexec

BENCH = [sys.executable, "-m", "collio.bench"]
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
ALL = "collio,mpiio,mpiio-tuned,mpiio-indep,posix,ceiling,collio-mpiio,collio-mpi"


@needs_mpiexec
def test_compare_all_apis_verifies_and_saves(tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    args = ["-n", "3", *BENCH, "-i", "2", "--size", "192", "-W", "-R", "--compare", ALL]
    proc = mpiexec([*args, "--json", str(out), "--plot", str(png), "-o", str(tmp_path / "f")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Summary of all tests:" in proc.stdout and "# iteration 2/2" in proc.stdout
    doc = json.loads(out.read_text())
    apis = ALL.split(",")
    assert doc["apis"] == apis and doc["nranks"] == 3 and doc["bytes"] == 192 * 192 * 8
    assert doc["errors"] == 0 and len(doc["rows"]) == 2 * len(apis) * 2
    verified = [r for r in doc["rows"] if r["errors"] >= 0]
    assert len(verified) == 2 * (len(apis) - 1) * 2 and all(r["errors"] == 0 for r in verified)
    summary = {(s["op"], s["api"]): s for s in doc["summary"]}
    assert set(summary) == {(op, a) for op in ("write", "read") for a in apis}
    assert summary[("write", "collio")]["ratio"] == 1.0
    for s in summary.values():
        assert s["min"] <= s["median"] <= s["max"] and s["iterations"] == 2
    assert doc["hints_used"]["mpiio-tuned"]["cb_nodes"] == "3"
    assert doc["hints_used"]["mpiio-tuned"]["cb_config_list"] == "*:*"
    assert doc["hints_used"]["collio"]["cb_nodes"] == 3
    assert len(doc["peak_rss"]) == 3 and all(r["collio"] > 0 for r in doc["peak_rss"])
    pairs = zip(doc["extra_rss"], doc["peak_rss"], strict=True)
    assert all(0 <= e["posix"] <= p["posix"] for e, p in pairs)
    assert doc["data_bytes"] == [192 * 64 * 8] * 3 and doc["collio_aggregators"] == [0, 1, 2]
    assert "Peak RSS per rank" in proc.stdout and "Hints used" in proc.stdout
    check = doc["memory_check"]
    assert check["limit"] == 2 * (16 << 20) + (100 << 20) and check["ok"] is True
    assert "collio aggregators' RSS growth: at most" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "f").exists()  # removed without -k


@needs_mpiexec
def test_ior_pattern_transfers_and_hints(tmp_path):
    out = tmp_path / "ior.json"
    args = ["-n", "2", *BENCH, "--pattern", "ior", "-s", "8", "-b", "8k", "-t", "4k", "-i", "1"]
    args += ["--compare", "posix,collio,mpiio", "-W", "-R", "-w", "-r"]
    args += ["--hints", "cb_buffer_size=4k,romio_ds_write=disable"]
    proc = mpiexec([*args, "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["shape"] == [8, 2, 8192] and doc["transfers"] == 2 * 8 * 2
    assert doc["errors"] == 0 and doc["hints_used"]["collio"]["cb_buffer_size"] == 4096
    assert doc["hints_used"]["mpiio"]["cb_buffer_size"] == "4096"
    assert doc["hints_used"]["mpiio"]["romio_ds_write"] == "disable"
    assert [r["api"] for r in doc["rows"]] == ["posix"] * 2 + ["collio"] * 2 + ["mpiio"] * 2
    assert all(r["errors"] == 0 for r in doc["rows"])  # every row verified (-1: unchecked)


@needs_mpiexec
def test_failure_on_every_rank_is_reported_not_hung(tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_text("a file where a directory should be")
    args = ["-n", "2", *BENCH, "-a", "posix", "-i", "1", "-o", str(target / "f"), "-w"]
    proc = mpiexec(args, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "collio-bench: error: posix write: rank 0:" in proc.stderr
    assert "rank 1: not a directory" in proc.stderr


PLUGIN_JOB = textwrap.dedent(
    """
    import sys
    import collio
    from collio.bench.apis import register_api
    from collio.bench.builtin import CollioApi
    from collio.bench.cli import main

    class MemoryApi(CollioApi):
        name = "collio-memory"
        backend = "memory"

        def target(self):
            return "mem://bench"

        def written(self):
            with collio.open(self.target(), "r", comm=self.job.comm) as f:
                return f.read_all(self.job.layout)

    register_api("collio-memory", MemoryApi)
    sys.exit(main(sys.argv[1:]))
    """
)


BROKEN_JOB = textwrap.dedent(
    """
    import os
    import sys
    from collio.bench.apis import register_api
    from collio.bench.builtin import PosixApi
    from collio.bench.cli import main

    class BrokenApi(PosixApi):
        name = "broken"

        def transfer(self, writing):
            if writing:  # the right size, one wrong byte per rank (in its own element)
                super().transfer(True)
                os.pwrite(self.fd, b"\\xff", 8 * self.job.comm.rank)
            # reading: nothing is read at all

    register_api("broken", BrokenApi)
    sys.exit(main(sys.argv[1:]))
    """
)


@needs_mpiexec
def test_wrong_bytes_and_missed_reads_are_counted_and_fail_the_job(tmp_path):
    """-W and -R see a changed byte and a read that never happened; the exit status says so."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_JOB)
    out = tmp_path / "b.json"
    args = ["-n", "2", sys.executable, str(script), "-a", "broken", "-W", "-R", "--size", "64"]
    proc = mpiexec([*args, "-i", "1", "--json", str(out), "-o", str(tmp_path / "f")])
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    errors = {r["op"]: r["errors"] for r in doc["rows"]}
    assert errors == {"write": 2, "read": 64 * 64}  # (a zero-filled buffer would pass at 0)


def test_default_iterations_are_whole_balanced_cycles():
    from collio.bench.cli import _workload, build_parser
    from collio.bench.main import _config

    for apis, want in (("collio,mpiio,mpiio-tuned,posix,ceiling", 10), ("collio,posix", 6)):
        args = build_parser().parse_args(["--compare", apis, "--size", "64"])
        cfg = _config(args, _workload, [], apis, 2)
        assert cfg.iterations == want
    args = build_parser().parse_args(["--compare", "collio,posix", "-i", "3", "--size", "64"])
    assert _config(args, _workload, [], "collio,posix", 2).iterations == 3


@needs_mpiexec
def test_an_api_plugs_in_with_one_module(tmp_path):
    """Another backend's API: a subclass registered by name, run, verified and compared."""
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN_JOB)
    out = tmp_path / "p.json"
    args = ["-n", "2", sys.executable, str(script), "--compare", "collio-memory,collio"]
    proc = mpiexec([*args, "-i", "2", "--size", "96", "-W", "-R", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["apis"] == ["collio-memory", "collio"] and doc["errors"] == 0
    rows = [r for r in doc["rows"] if r["api"] == "collio-memory"]
    assert len(rows) == 4 and all(r["errors"] == 0 for r in rows)
    assert doc["hints_used"]["collio-memory"]["cb_nodes"] == 2


def test_split_runs_cuts_at_transfer_size():
    runs = Runs(np.array([0, 100]), np.array([10, 25]), np.array([0, 10]))
    cut = split_runs(runs, 10)
    assert cut.file.tolist() == [0, 100, 110, 120] and cut.length.tolist() == [10, 10, 10, 5]
    assert cut.mem.tolist() == [0, 10, 20, 30]
    assert split_runs(runs, 0) is runs


def test_summary_medians_and_ratios():
    rows = [Row(a, "write", i, bw, 1.0, 0, 0, 0, 1.0, 0) for a, bws in
            (("x", (100, 300, 200)), ("y", (50, 60, 400))) for i, bw in enumerate(bws)]  # fmt: skip
    s = {d["api"]: d for d in summarize(rows, ["x", "y"])}
    assert s["x"]["median"] == 200 and s["y"]["median"] == 60 and s["y"]["ratio"] == 0.3
    assert s["y"]["max"] == 400 and s["y"]["min"] == 50 and s["x"]["errors"] == 0


def test_api_registry_is_lazy_and_extensible():
    class Fake(Api):
        name = "fake"

    assert {
        "collio",
        "collio-mpiio",
        "mpiio",
        "mpiio-tuned",
        "mpiio-indep",
        "posix",
        "ceiling",
    } <= set(known_apis())
    register_api("fake", Fake)
    assert get_api("fake") is Fake and "fake" in known_apis()
    register_api("fake2", "collio.bench.builtin:PosixApi")
    assert get_api("fake2").__name__ == "PosixApi"
    with pytest.raises(ValueError, match="unknown API 'nope'"):
        get_api("nope")


@needs_mpiexec
def test_direct_apis_verify_and_report_the_hint(tmp_path):
    """``collio-direct`` (hint direct_write) writes the layout's bytes; ``ceiling-direct``
    writes its shares with O_DIRECT; ``collio-noflush`` (hint early_flush=false) the
    layout's bytes; ``collio-shuffle`` (hint mapped_reads=disable) reads through the
    shuffle; all read back right (-W -R)."""
    out = tmp_path / "d.json"
    args = ["-n", "2", *BENCH, "-i", "2", "--size", "1024", "-W", "-R"]
    args += ["--compare", "collio-direct,ceiling-direct,collio,collio-noflush,collio-shuffle"]
    args += ["--hints", "min_rounds=1"]
    proc = mpiexec([*args, "--json", str(out), "-o", str(tmp_path / "f")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == 0
    checked = [r for r in doc["rows"] if r["api"] != "ceiling-direct"]
    assert checked and all(r["errors"] == 0 for r in checked)
    probe = tmp_path / "probe"
    probe.touch()
    from collio.backends.posix import direct_possible

    used = doc["hints_used"]
    assert used["collio-direct"]["direct_write"] is direct_possible(str(probe))
    assert used["collio"]["direct_write"] is False
    assert used["collio"]["early_flush"] is True and used["collio-noflush"]["early_flush"] is False
    assert used["collio"]["mapped_reads"] == "automatic"
    assert used["collio-shuffle"]["mapped_reads"] == "disable"
    from collio.backends.filereads import maps_for

    fd = os.open(probe, os.O_RDONLY)
    try:
        local = maps_for(Hints(), fd)  # (the bench's file sits beside the probe)
    finally:
        os.close(fd)
    assert used["collio"]["reads_mapped"] is local
    assert used["collio-shuffle"]["reads_mapped"] is False
    assert f"reads_mapped={local}" in proc.stdout
    assert "direct_write=" in proc.stdout  # in the text summary's hints
