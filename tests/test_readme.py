"""Every ```python block of the README runs as written, under ``mpiexec -n 4``, in a fresh
directory, and prints what the ```text block right after it says; and the measured tables
in docs/ are the ones docs/make_benchmarks.py makes from the JSON results.

A user pastes a snippet into a file and runs it; so does this test.  S3 snippets get a
moto server on 127.0.0.1 through boto3's standard ``AWS_ENDPOINT_URL``, as the README
tells users to set up.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from collio.testing.jobs import MPIEXEC, mpiexec

ROOT = Path(__file__).resolve().parent.parent
README, DOCS = ROOT / "README.md", ROOT / "docs"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def snippets(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, expected output or None) for each python block of ``text``."""
    blocks = [
        (text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), m.start(), m.end())
        for m in _FENCE.finditer(text)
    ]
    out = []
    for i, (line, lang, body, _, end) in enumerate(blocks):
        if lang != "python":
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        follows = nxt is not None and nxt[1] == "text" and not text[end : nxt[3]].strip()
        out.append((line, body, nxt[2] if follows and nxt else None))
    return out


SNIPPETS = snippets(README.read_text())


def test_the_readme_has_its_snippets() -> None:
    # every python fence is found, whatever its surroundings (a parser that drops one
    # would let that snippet go untested)
    assert len(SNIPPETS) == README.read_text().count("```python\n") > 0
    assert all(expected is not None for _, _, expected in SNIPPETS), "each one says its output"


@pytest.fixture(scope="module")
def s3_endpoint():
    from collio.testing.s3 import start_moto

    server, url = start_moto()
    yield url
    server.stop()


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
@pytest.mark.parametrize(
    ("line", "code", "expected"), SNIPPETS, ids=[f"README-line-{s[0]}" for s in SNIPPETS]
)
def test_snippet_runs_as_written(tmp_path, request, line: int, code: str, expected: str | None):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    for extra in ("zarr", "h5py", "boto3"):  # a checkout installed without that extra
        if re.search(rf"^import {extra}\b", code, re.MULTILINE):
            pytest.importorskip(extra)
    env = {"COLLIO_STATS": ""}
    if "s3://" in code:
        pytest.importorskip("moto.server")
        env.update(
            AWS_ENDPOINT_URL=request.getfixturevalue("s3_endpoint"), AWS_DEFAULT_REGION="us-east-1",
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        )  # fmt: skip
    proc = mpiexec([sys.executable, str(script)], n=4, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"README line {line}:\n{proc.stderr[-3000:]}"
    if expected is not None:
        assert proc.stdout.strip() == expected.strip(), f"README line {line}"


def test_benchmark_tables_are_made_from_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    # a figure edited by hand in docs/benchmarks.md or the README, or a JSON result added
    # without rerunning the script, fails here
    spec = importlib.util.spec_from_file_location("make_benchmarks", DOCS / "make_benchmarks.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert make.main(["--check"]) == 0, capsys.readouterr().out
