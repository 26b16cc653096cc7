"""``collio-bench --plot`` without matplotlib refuses before it runs anything."""

from __future__ import annotations

import sys

import pytest

from collio.testing.jobs import MPIEXEC, mpiexec

# matplotlib hidden from the benchmark (an entry of None in sys.modules: import fails)
HIDDEN = (
    "import sys; sys.modules['matplotlib'] = None; from collio.bench.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
def test_plot_without_matplotlib_names_the_extra_before_running(tmp_path):
    out, png, work = tmp_path / "b.json", tmp_path / "b.png", tmp_path / "f"
    args = ["--size", "192", "-i", "50", "--json", str(out), "--plot", str(png), "-o", str(work)]
    proc = mpiexec([sys.executable, "-c", HIDDEN, *args], n=2, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--plot needs matplotlib: pip install matplotlib" in proc.stderr
    assert "Summary of all tests:" not in proc.stdout  # nothing ran first
    assert not out.exists() and not png.exists() and not work.exists()
