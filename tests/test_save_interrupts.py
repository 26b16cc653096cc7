"""A save on one process (no mpiexec) meeting what a job that goes on meets: another process
opening the spare it is claiming, a Ctrl-C the job catches at the worst moments.  Each
case runs in a process of its own: the first, unfixed, ends that process by a signal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from collio.backends import localfile
from collio.backends.mapped import fs_name

#: What every script starts with: a state, two saves (the second keeps a spare of the
#: first), the descriptors and files to compare with at its end.
HEAD = textwrap.dedent(
    """
    import fcntl, os, sys
    from mpi4py import MPI
    import numpy as np
    import collio.checkpoint as ckpt
    from collio import layouts
    from collio.backends import localfile

    d = sys.argv[1]
    path = os.path.join(d, "c.ckpt")
    lay = layouts.Subarray((1024, 1024), (0, 0), (1024, 1024), "f4")
    old = np.arange(1 << 20, dtype="f4").reshape(1024, 1024)
    new = old + 1
    ckpt.save(path, {"w": (old, lay)})
    ckpt.save(path, {"w": (old, lay)})
    assert os.path.exists(localfile.spare_name(path))
    fds = sorted(os.listdir("/proc/self/fd"))

    def done():
        assert sorted(os.listdir("/proc/self/fd")) == fds, "descriptors left open"
        left = [n for n in os.listdir(d) if n.endswith(".tmp")]
        assert not left, left
        got = ckpt.load(path, {"w": None})["w"]
        ckpt.save(path, {"w": (new, lay)})  # (the job goes on: the next save works)
        assert np.array_equal(ckpt.load(path, {"w": None})["w"], new)
        print("ok", np.array_equal(got, old), flush=True)
    """
)


def _run(tmp_path: object, body: str) -> str:
    script = os.path.join(str(tmp_path), "case.py")
    with open(script, "w") as fh:
        fh.write(HEAD + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout


@pytest.fixture(autouse=True)
def _spares_kept_here(tmp_path: object) -> None:
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        fs = fs_name(fd)
    finally:
        os.close(fd)
    if fs not in localfile.REUSED_FS or localfile._LEASE is None:
        pytest.skip(f"spares are claimed on {sorted(localfile.REUSED_FS)} with leases only")


def test_another_open_of_the_spare_while_it_is_claimed_signals_no_one(tmp_path: object) -> None:
    """The claim holds a write lease for a moment; an open of the spare then (another save
    to the target, a cp of the directory) breaks it, which signalled the saver with
    SIGIO and ended it.  Here one open is non-blocking (it fails at once) and another
    blocks in a thread until the lease goes: no signal, the save commits (into a new
    temporary: the spare is left to the process that opened it), and what the blocked
    open reads is the spare's old bytes, never the save's."""
    out = _run(tmp_path, """
        import threading, time
        real = os.rename
        before = open(path, "rb").read()  # (the spare's bytes: the same state saved)
        seen, got = [], []

        def reader(name):
            with open(name, "rb") as fh:  # (blocks until the lease is released)
                time.sleep(0.2)  # (the save writes meanwhile, if into this file)
                got.append(fh.read())

        def rename(a, b, *args, **kw):
            if a.endswith(".collio-spare") and not seen:  # (the claim, its lease held)
                try:
                    os.close(os.open(a, os.O_RDONLY | os.O_NONBLOCK))
                except BlockingIOError:
                    seen.append("broken")
                t = threading.Thread(target=reader, args=(a,))
                t.start()
                seen.append(t)
                time.sleep(0.2)  # (the reader is blocked in its open by now)
            return real(a, b, *args, **kw)

        os.rename = rename
        ckpt.save(path, {"w": (new, lay)})
        os.rename = real
        seen[1].join()
        assert seen[0] == "broken", seen
        assert got == [before], "the open spare was written into"
        assert np.array_equal(ckpt.load(path, {"w": None})["w"], new)
        ckpt.save(path, {"w": (old, lay)})
        done()
    """)  # fmt: skip
    assert out.split() == ["ok", "True"]


@pytest.mark.parametrize("where", ["claim", "temporary", "close"])
def test_a_save_interrupted_leaves_the_checkpoint_and_nothing_else(
    tmp_path: object, where: str
) -> None:
    """A KeyboardInterrupt the job catches, raised while the save takes the spare (its
    lease held), makes a new temporary (the spare gone first), or syncs at its close:
    the previous checkpoint stays, no temporary or descriptor is left, and the next save
    works (a leased descriptor left open made it signal itself)."""
    out = _run(tmp_path, f"""
        where = {where!r}
        if where == "temporary":  # (no spare: the save makes a new temporary)
            os.unlink(localfile.spare_name(path))
        armed = [True]

        def interrupt():
            if armed[0]:
                armed[0] = False
                raise KeyboardInterrupt

        real_rename, real_flock, real_fsync = os.rename, fcntl.flock, os.fsync

        def rename(a, b, *args, **kw):
            if where == "claim" and a.endswith(".collio-spare"):
                interrupt()
            return real_rename(a, b, *args, **kw)

        def flock(fd, op):
            if where == "temporary":
                interrupt()
            return real_flock(fd, op)

        def fsync(fd):
            if where == "close":
                interrupt()
            return real_fsync(fd)

        os.rename, fcntl.flock, os.fsync = rename, flock, fsync
        try:
            ckpt.save(path, {{"w": (new, lay)}})
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("not interrupted")
        finally:
            os.rename, fcntl.flock, os.fsync = real_rename, real_flock, real_fsync
        assert not armed[0]
        done()
    """)  # fmt: skip
    assert out.split() == ["ok", "True"]
