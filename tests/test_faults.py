"""Fault injection with real processes: a rank killed mid-write, an S3 server that
freezes (SIGSTOP) or goes away.  Run it alone with ``python -m pytest tests/test_faults.py``.

Each case starts its own ``timeout 60 mpiexec -n 3`` job (``tests/fault_job.py``), so a
hang is a failure, and checks what every rank saw and what is left on storage.  The
other faults (a full tmpfs, FIFOs, a server that accepts and never answers, threads)
run inside the MPI suite: ``mpi_tests/test_hardening.py``, ``mpi_tests/test_failures.py``.
``COLLIO_SLOW_FAULTS=1`` adds the frozen server under the S3 backend's default timeouts
(about two minutes).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from collio.testing.jobs import MPIEXEC, mpiexec

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_job.py")
SHAPE = (512, 1024)


def _job(d, *args, limit=60):
    """``fault_job.py`` at 3 ranks, killed after ``limit`` seconds (a hang fails), and
    what each rank wrote (None: it wrote nothing)."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    proc = mpiexec([sys.executable, JOB, *args], n=3, timeout=limit, env={"PYTHONPATH": path})
    results = []
    for r in range(3):
        p = os.path.join(d, f"result-{r}.json")
        if os.path.exists(p):
            with open(p) as fh:
                results.append(json.load(fh))
            os.unlink(p)
        else:
            results.append(None)
    return proc, results


def _temporaries(target):
    d, base = os.path.split(target)
    return glob.glob(os.path.join(d, f".{glob.escape(base)}.collio-*.tmp"))


def _reference(seed):
    return np.random.default_rng(seed).standard_normal(SHAPE)


def test_rank_killed_mid_atomic_write_leaves_old_file_and_next_job_reclaims(tmp_path):
    target = str(tmp_path / "ckpt.bin")
    old = os.urandom(1000)
    with open(target, "wb") as fh:
        fh.write(old)
    t0 = time.monotonic()
    proc, results = _job(str(tmp_path), "kill-mid-write", str(tmp_path), target)
    assert proc.returncode != 0, proc.stderr[-2000:]  # the job was killed (not hung: _job)
    assert time.monotonic() - t0 < 50
    assert results == [None, None, None]
    with open(target, "rb") as fh:
        assert fh.read() == old  # the previous file is kept
    left = _temporaries(target)
    assert len(left) == 1, left  # the dead job's temporary, named for what it was
    # the next job's atomic write removes it (its owner is gone), and commits
    proc, results = _job(str(tmp_path), "rewrite", str(tmp_path), target)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert results == [{"ok": True}] * 3
    assert _temporaries(target) == []
    assert np.array_equal(np.fromfile(target, "<f8").reshape(SHAPE), _reference(2))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.bin"]


@pytest.fixture
def moto(tmp_path):
    """A moto S3 server in a process of its own (so that it can be frozen), and a bucket."""
    boto3 = pytest.importorskip("boto3")
    from collio.testing.s3 import fake_credentials, serve_moto

    fake_credentials()
    proc, url = serve_moto()
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket="faults")
    try:
        yield proc, url, client
    finally:
        with_signal = proc.poll() is None
        if with_signal:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
        proc.wait()


def _uploads(client):
    return client.list_multipart_uploads(Bucket="faults").get("Uploads", [])


def _objects(client):
    return [o["Key"] for o in client.list_objects_v2(Bucket="faults").get("Contents", [])]


def _same_everywhere(results):
    assert None not in results, results
    keys = ("cls", "msg", "ranks", "close_error")
    assert all({k: r.get(k) for k in keys} == {k: results[0].get(k) for k in keys} for r in results)
    return results[0]


@pytest.mark.parametrize("how", ["freeze-then-thaw", "freeze", "stop"])
def test_s3_server_frozen_or_gone_mid_write(tmp_path, moto, how):
    proc, url, client = moto
    args = ("s3", str(tmp_path), url, "faults", str(proc.pid), how, "short")
    job, results = _job(str(tmp_path), *args)
    assert job.returncode == 0, job.stderr[-3000:]
    r = _same_everywhere(results)
    # the write's own error, on every rank, within the options' bound (2 attempts of 1 s)
    assert r["cls"] == "BackendError", r
    assert r["msg"].startswith("backend I/O: rank "), r["msg"]
    assert max(x["write_seconds"] for x in results) < 15, results
    if how == "freeze-then-thaw":
        assert r["close_error"] is None
        assert _uploads(client) == []  # aborted at close
    else:  # the abort failed too: it rides on the write's error, which stays the one raised
        cls, msg = r["close_error"]
        assert cls == "CommitError" and "AbortIncompleteMultipartUpload" in msg, msg
        assert max(x["total_seconds"] for x in results) < 25, results
    if how != "stop":
        assert _objects(client) == []  # nothing partial ever visible


@pytest.mark.skipif(not os.environ.get("COLLIO_SLOW_FAULTS"), reason="COLLIO_SLOW_FAULTS unset")
def test_s3_frozen_server_under_default_timeouts_fails_within_two_minutes(tmp_path, moto):
    """The defaults' promise (S3Options.stall_bound): about 110 s, abort included."""
    from collio.backends.s3.options import S3Options

    bound = S3Options().stall_bound
    assert bound <= 120
    proc, url, client = moto
    args = ("s3", str(tmp_path), url, "faults", str(proc.pid), "freeze", "defaults")
    job, results = _job(str(tmp_path), *args, limit=200)
    assert job.returncode == 0, job.stderr[-3000:]
    r = _same_everywhere(results)
    assert r["cls"] == "BackendError" and r["close_error"][0] == "CommitError", r
    took = max(x["total_seconds"] for x in results)
    print(f"frozen server, default timeouts: write and abort failed after {took:.1f} s")
    assert took <= bound + 10, (took, bound)
