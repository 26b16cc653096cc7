"""Bad targets, leftovers, permissions, secrets, stalls, degenerate hints and threads.

Each case is collective: every rank raises the same error (or none), nothing hangs
(``pytest.mark.timeout`` turns a hang into a failure), and the processes go on.
"""

from __future__ import annotations

import errno
import glob
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from helpers import local_piece, reference
from helpers import raises_everywhere as _raises_everywhere

import collio
from collio import layouts

SHAPE = (16, 12)


@pytest.fixture
def shared_dir(mpi_tmp_path):
    """A directory every rank sees (pytest-mpi's, rank 0's tmp_path), as a str."""
    return str(mpi_tmp_path)


@pytest.fixture
def shared_path(shared_dir):
    return os.path.join(shared_dir, "target.bin")


def _col(comm):
    return layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))


def _still_works(comm, path):
    glob_ = reference(SHAPE, "<f8", seed=5)
    lay = _col(comm)
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(local_piece(glob_, lay), lay)
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob_)


def _temporaries(path):
    """The temporaries of atomic writes to ``path`` (``.NAME.collio-*.tmp`` beside it)."""
    d, base = os.path.split(path)
    return sorted(glob.glob(os.path.join(d, f".{glob.escape(base)}.collio-*.tmp")))


# ------------------------------------------------------------------ non-regular targets
def _make_special(comm, shared_dir, kind):
    """Rank 0 makes a FIFO, a socket or a directory (or names /dev/null)."""
    path = os.path.join(shared_dir, kind)
    keep = None
    if comm.rank == 0:
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            keep = socket.socket(socket.AF_UNIX)
            keep.bind(path)
        elif kind == "dir":
            os.mkdir(path)
    if kind == "device":
        path = os.devnull
    comm.Barrier()
    return path, keep


KINDS = {
    "fifo": "a FIFO (named pipe)",
    "socket": "a socket",
    "dir": "a directory",
    "device": "a character device",
}


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode,atomic", [("w", False), ("r", False), ("r+", False), ("w", True)])
def test_non_regular_target_is_refused_at_open(comm, shared_dir, kind, mode, atomic):
    path, keep = _make_special(comm, shared_dir, kind)
    try:
        hints = {"atomic_commit": atomic}
        err = _raises_everywhere(
            comm, collio.BackendError, lambda: collio.open(path, mode, comm=comm, hints=hints)
        )
        assert f"rank 0: {path!r} is {KINDS[kind]}, not a regular file" in str(err)
        assert err.errno == (errno.EISDIR if kind == "dir" else errno.EINVAL)
        comm.Barrier()
        st = os.stat(path)  # left as it was: not replaced, nothing beside it
        kinds = {"fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "dir": stat.S_ISDIR}
        assert kinds.get(kind, stat.S_ISCHR)(st.st_mode)
        if kind != "device":
            assert _temporaries(path) == []
    finally:
        if keep is not None:
            keep.close()
    _still_works(comm, os.path.join(shared_dir, "ok.bin"))


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["save_npy", "h5", "mpiio"])
def test_fifo_is_refused_by_npy_h5_and_mpiio(comm, shared_dir, api):
    path, _ = _make_special(comm, shared_dir, "fifo")
    lay = _col(comm)
    data = np.zeros(lay.shape)
    if api == "save_npy":
        fn = lambda: collio.save_npy(path, data, lay, comm=comm)  # noqa: E731
    elif api == "mpiio":
        fn = lambda: collio.open(path, "w", comm=comm, backend="mpiio")  # noqa: E731
    else:
        h5 = pytest.importorskip("collio.h5")
        fn = lambda: h5.File(path, "w", comm=comm)  # noqa: E731
    err = _raises_everywhere(comm, collio.BackendError, fn)
    assert f"{path!r} is a FIFO (named pipe), not a regular file" in str(err)
    comm.Barrier()
    assert stat.S_ISFIFO(os.stat(path).st_mode)
    _still_works(comm, os.path.join(shared_dir, "ok.bin"))


# ------------------------------------------------------------------ temporaries
def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _holder(name):
    """A live process that holds the flock of ``name``, as a running job's rank 0 does."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["w", "r+"])
def test_stale_temporaries_of_dead_jobs_are_removed_live_ones_kept(comm, shared_dir, mode):
    path = os.path.join(shared_dir, "data.bin")
    _still_works(comm, path)
    from collio.backends.localfile import _HOST as host

    d, base = os.path.split(path)
    names = None
    if comm.rank == 0:  # (one dead process id, the same names on every rank)
        dead = _dead_pid()
        names = {
            "dead": os.path.join(d, f".{base}.collio-{host}-{dead}-0badc0de.tmp"),
            "old-elsewhere": os.path.join(d, f".{base}.collio-otherhost-77-0000beef.tmp"),
            "live": os.path.join(d, f".{base}.collio-otherhost-78-0000cafe.tmp"),
            "fresh-elsewhere": os.path.join(d, f".{base}.collio-otherhost-79-0000f00d.tmp"),
            "another-target": os.path.join(d, f".other.bin.collio-{host}-{dead}-00000001.tmp"),
        }
    names = comm.bcast(names, root=0)
    holder = None
    if comm.rank == 0:
        for name in names.values():
            with open(name, "wb") as fh:
                fh.write(b"x" * 1000)
        old = time.time() - 3600
        os.utime(names["old-elsewhere"], (old, old))
        os.utime(names["live"], (old, old))
        holder = _holder(names["live"])
    comm.Barrier()
    try:
        glob_ = reference(SHAPE, "<f8", seed=11)
        lay = _col(comm)
        with collio.open(path, mode, comm=comm, hints={"atomic_commit": True}) as f:
            comm.Barrier()
            mine = [n for n in _temporaries(path) if n not in names.values()]
            assert len(mine) == 1  # this job's own, beside the target
            assert not os.path.exists(names["dead"]) and not os.path.exists(names["old-elsewhere"])
            f.write_all(local_piece(glob_, lay), lay)
        comm.Barrier()
        left = set(_temporaries(path))
        assert left == {names["live"], names["fresh-elsewhere"]}, left
        assert os.path.exists(names["another-target"])  # another target's: not ours to judge
        assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob_)
    finally:
        comm.Barrier()
        if holder is not None:
            holder.kill()
            holder.wait()
            holder.stdout.close()


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_atomic_temporary_is_private_and_commit_keeps_mode_and_owner(comm, shared_dir):
    path = os.path.join(shared_dir, "secret.bin")
    _still_works(comm, path)
    uid = gid = -1
    if comm.rank == 0:
        os.chmod(path, 0o600)
        if os.geteuid() == 0:  # root can give the file away: ownership must survive too
            uid, gid = 4321, 4322
            os.chown(path, uid, gid)
    uid, gid = comm.bcast((uid, gid), root=0)
    glob_ = reference(SHAPE, "<f8", seed=2)
    lay = _col(comm)
    for mode in ("w", "r+"):
        with collio.open(path, mode, comm=comm, hints={"atomic_commit": True}) as f:
            f.write_all(local_piece(glob_, lay), lay)
            comm.Barrier()
            (tmp,) = _temporaries(path)
            assert stat.S_IMODE(os.stat(tmp).st_mode) == 0o600  # nobody else reads it meanwhile
            comm.Barrier()
        comm.Barrier()
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        if uid >= 0:
            assert (st.st_uid, st.st_gid) == (uid, gid)
        assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob_)
    # a new file gets what any new file gets here: 0o666 less the umask
    fresh = os.path.join(shared_dir, "fresh.bin")
    with collio.open(fresh, "w", comm=comm, hints={"atomic_commit": True}) as f:
        f.write_all(local_piece(glob_, lay), lay)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~mask


def _small_tmpfs(comm, shared_dir, size="8m"):
    mnt = os.path.join(shared_dir, "small")
    ok = 0
    if comm.rank == 0:
        os.mkdir(mnt)
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], capture_output=True
        )
        ok = int(res.returncode == 0)
    if not comm.bcast(ok, root=0):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    return mnt


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_failed_copy_at_atomic_update_names_and_removes_its_temporary(comm, shared_dir):
    mnt = _small_tmpfs(comm, shared_dir)
    try:
        path = os.path.join(mnt, "big.bin")
        if comm.rank == 0:
            with open(path, "wb") as fh:
                fh.write(os.urandom(5 << 20))  # a copy of it does not fit in 8 MiB
        comm.Barrier()
        with open(path, "rb") as fh:
            before = fh.read()
        err = _raises_everywhere(
            comm,
            collio.BackendError,
            lambda: collio.open(path, "r+", comm=comm, hints={"atomic_commit": True}),
        )
        assert err.errno == errno.ENOSPC
        assert f"copying {path!r} to its temporary '{mnt}/.big.bin.collio-" in str(err)
        assert "the temporary is removed" in str(err)
        comm.Barrier()
        assert os.listdir(mnt) == ["big.bin"]
        with open(path, "rb") as fh:
            assert fh.read() == before
    finally:
        comm.Barrier()
        if comm.rank == 0:
            subprocess.run(["umount", "-l", mnt], check=False)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_mpiio_disk_full_is_a_backend_error_with_errno(comm, shared_dir):
    mnt = _small_tmpfs(comm, shared_dir, size="1m")
    try:
        shape = (512, 512)  # 2 MiB into a 1 MiB file system
        lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
        glob_ = reference(shape, "<f8")
        target = os.path.join(mnt, "big.bin")
        hints = {"cb_buffer_size": 65536}
        with collio.open(target, "w", comm=comm, hints=hints, backend="mpiio") as f:
            err = _raises_everywhere(
                comm, collio.BackendError, lambda: f.write_all(local_piece(glob_, lay), lay)
            )
            assert type(err) is collio.BackendError and err.errno == errno.ENOSPC, repr(err)
            assert "Exception:" not in str(err)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            subprocess.run(["umount", "-l", mnt], check=False)
    _still_works(comm, os.path.join(shared_dir, "after.bin"))


# ------------------------------------------------------------------ S3: secrets and stalls
def _frozen_server(comm):
    """Rank 0 listens and accepts, and never answers (a server that stopped answering)."""
    sock, url, held = None, None, []
    if comm.rank == 0:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)

        def accept():
            while True:
                try:
                    held.append(sock.accept()[0])
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    return sock, held, comm.bcast(url, root=0)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_s3_server_that_stops_answering_fails_fast_everywhere(comm):
    pytest.importorskip("boto3")
    from collio.testing.s3 import fake_credentials

    fake_credentials()
    sock, held, url = _frozen_server(comm)
    try:
        opts = {"endpoint_url": url, "connect_timeout": 1, "read_timeout": 1, "retries": 2}
        t0 = time.monotonic()
        err = _raises_everywhere(
            comm, collio.BackendError, lambda: collio.open("s3://bucket/k.bin", "w", **opts)
        )
        took = time.monotonic() - t0
        assert "read timeout" in str(err).lower(), str(err)
        assert took < 20, took  # 2 attempts of 1 s, backoff, agreement
    finally:
        comm.Barrier()
        if sock is not None:
            sock.close()
            for c in held:
                c.close()


def _refusing_port(comm):
    """A port of 127.0.0.1 nobody listens on (connection refused), rank 0's, on every rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return comm.bcast(s.getsockname()[1], root=0)


def _options_differ(comm, url):
    """The MismatchError every rank raises for an S3 open whose options differ on rank 1."""
    conc = 4 if comm.rank == 1 else 8
    return _raises_everywhere(
        comm,
        collio.MismatchError,
        lambda: collio.open("s3://bucket/k.bin", "w", endpoint_url=url, max_concurrency=conc),
    )


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_s3_endpoint_password_never_printed(comm):
    pytest.importorskip("boto3")
    from collio.testing.s3 import fake_credentials

    fake_credentials()
    port = _refusing_port(comm)
    url = f"http://alice:hunter2secret@127.0.0.1:{port}"
    err = _raises_everywhere(
        comm,
        collio.BackendError,
        lambda: collio.open("s3://bucket/k.bin", "w", endpoint_url=url, retries=1),
    )
    assert "hunter2secret" not in str(err) and "alice" not in str(err), str(err)
    assert "127.0.0.1" in str(err)
    if comm.size > 1:  # options that differ: the MismatchError shows S3Options
        err = _options_differ(comm, url)
        assert "S3Options(" in str(err) and "hunter2secret" not in str(err), str(err)
        assert "endpoint_url='http://***@127.0.0.1" in str(err)
    from collio.backends.s3.options import S3Options

    assert "hunter2secret" not in repr(S3Options(endpoint_url=url))


#: (made at run time: a traceback quotes this file's source lines)
PW = "hunter2" + "secret"


def _chain_text(err):
    """What a traceback printed at exit shows of ``err``: its text and its whole chain."""
    import traceback

    return "".join(traceback.format_exception(err))


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "userinfo",
    ["AKIAX:{}/ab+c", "alice:{}@x", "alice:{}%2Fq"],
)
def test_s3_endpoint_password_of_any_shape_never_printed(comm, userinfo):
    """AWS secret keys hold '/'; a password may hold '@' or be percent-encoded: nothing of
    the user info is shown, in the agreed error or in the chain it is raised from."""
    pytest.importorskip("boto3")
    from collio.testing.s3 import fake_credentials

    fake_credentials()
    port = _refusing_port(comm)
    url = f"http://{userinfo.format(PW)}@127.0.0.1:{port}"
    for mode in ("w", "r"):
        err = _raises_everywhere(
            comm,
            collio.BackendError,
            lambda mode=mode: collio.open("s3://bucket/k.bin", mode, endpoint_url=url, retries=1),
        )
        text = _chain_text(err)
        assert PW not in text and "AKIAX" not in text, text
        assert "127.0.0.1" in str(err), str(err)
    if comm.size > 1:  # options that differ: the MismatchError shows S3Options
        err = _options_differ(comm, url)
        assert PW not in _chain_text(err), str(err)
        assert "endpoint_url='http://***@127.0.0.1" in str(err)


@pytest.mark.mpi
def test_s3_malformed_endpoint_or_target_never_printed(comm):
    pytest.importorskip("boto3")
    from collio.testing.s3 import fake_credentials

    fake_credentials()
    err = _raises_everywhere(
        comm,
        collio.BackendError,
        lambda: collio.open("s3://bucket/k.bin", "w", endpoint_url=f"htp:/u:{PW}@bad url"),
    )
    assert PW not in _chain_text(err) and "bad url" in str(err), str(err)
    err = _raises_everywhere(
        comm, collio.BackendError, lambda: collio.open(f"s3://AKIAX:{PW}@bkt/k", "w")
    )
    assert PW not in _chain_text(err) and "s3://***@bkt/k" in str(err), str(err)


# ------------------------------------------------------------------ degenerate hints
@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "hints", [{"cb_buffer_size": 1}, {"striping_unit": 3, "cb_buffer_size": 5}]
)
def test_tiny_buffer_is_raised_to_the_floor_and_reported(comm, shared_path, hints):
    shape = (1024, 1024)  # 8 MiB: 1-byte rounds would never end
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    glob_ = reference(shape, "<f8", seed=3)
    hints = {**hints, "romio_cb_write": "enable", "min_rounds": 1}
    t0 = time.monotonic()
    with collio.open(shared_path, "w", comm=comm, hints=hints) as f:
        f.write_all(local_piece(glob_, lay), lay)
        used = f.stats.hints
    assert time.monotonic() - t0 < 60
    assert used["cb_buffer_size"] == 512
    assert used["adjusted"] == {
        "cb_buffer_size": {"requested": hints["cb_buffer_size"], "used": 512}
    }
    comm.Barrier()
    assert np.array_equal(np.fromfile(shared_path, "<f8").reshape(shape), glob_)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "hints,text",
    [
        ({"striping_unit": 2**62}, "hint striping_unit=4611686018427387904 is above"),
        ({"cb_nodes": "x"}, "hint cb_nodes='x' is not an integer"),
    ],
)
def test_degenerate_hint_values_get_collio_messages(comm, shared_path, hints, text):
    err = _raises_everywhere(
        comm, collio.HintError, lambda: collio.open(shared_path, "w", comm=comm, hints=hints)
    )
    assert text in str(err) and "numpy" not in str(err).lower()


@pytest.mark.mpi
def test_hints_given_a_dict_positionally_refuse_clearly(comm):
    with pytest.raises(collio.HintError, match=r"Hints\(\) takes keywords"):
        collio.Hints({"foo_bar": "1"})
    with pytest.raises(collio.HintError, match="cb_buffer_size='16m' must be an int"):
        collio.Hints(cb_buffer_size="16m")


@pytest.mark.mpi
def test_misspelt_hints_warn_with_a_near_name_and_stay_away_from_romio(comm, shared_path):
    hints = {"cb_bufer_size": "4096", "romio_cb_wrte": "enable", "romio_ds_write": "disable"}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with collio.open(shared_path, "w", comm=comm, hints=hints):
            pass
    texts = [str(w.message) for w in seen if issubclass(w.category, collio.HintWarning)]
    if comm.rank == 0:
        assert texts == [
            "unknown hints ignored by collio: cb_bufer_size (did you mean cb_buffer_size?), "
            "romio_cb_wrte (did you mean romio_cb_write?)"
        ]
    else:
        assert texts == []
    from collio.backends.mpiio import info_from_hints

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info = info_from_hints(collio.Hints.coerce(hints))
    try:
        keys = {info.Get_nthkey(i) for i in range(info.Get_nkeys())}
    finally:
        info.Free()
    assert "romio_ds_write" in keys and "cb_buffer_size" in keys
    assert not keys & {"cb_bufer_size", "romio_cb_wrte", "adjusted", "read_past_eof"}, keys


@pytest.mark.mpi
def test_read_past_eof_zeros_by_default_error_with_the_hint(comm, shared_path):
    if comm.rank == 0:
        with open(shared_path, "wb") as fh:
            fh.write(b"\x07" * 1000)
    comm.Barrier()
    last = comm.size - 1
    lay = layouts.Segments([900 + comm.rank * 100], [100])  # the last rank ends past 1000
    with collio.open(shared_path, "r", comm=comm) as f:
        got = f.read_all(lay)
        want = np.full(100, 7 if comm.rank == 0 else 0, np.uint8)
        assert np.array_equal(got, want)
    with collio.open(shared_path, "r", comm=comm, hints={"read_past_eof": "disable"}) as f:
        if comm.size > 1:
            err = _raises_everywhere(comm, collio.LayoutError, lambda: f.read_all(lay))
            assert err.ranks == tuple(range(1, comm.size))
            assert f"rank {last}: read_all reaches byte {1000 + last * 100}, past the end of " in (
                str(err)
            )
            assert "(1000 bytes; hint read_past_eof=disable)" in str(err)
        ok = layouts.Segments([comm.rank], [1])  # within the file: read as ever
        assert f.read_all(ok).tolist() == [7]


# ------------------------------------------------------------------ overlaps
def _ranks(n):
    return "rank 0" if n == 1 else "ranks " + ", ".join(map(str, range(n - 1))) + f" and {n - 1}"


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{"cb_buffer_size": 1024}, {"cb_nodes": 1}])
def test_all_ranks_writing_the_same_bytes_are_named_once(comm, shared_path, hints):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    lay = layouts.Segments([0], [3000])  # every rank: bytes [0, 3000)
    with collio.open(shared_path, "w", comm=comm, hints=hints) as f:
        err = _raises_everywhere(
            comm, collio.OverlapError, lambda: f.write_all(np.ones(3000, np.uint8), lay)
        )
    assert str(err) == f"write_all: bytes [0, 3000) are written by {_ranks(comm.size)}"
    assert err.ranks == tuple(range(comm.size))


# ------------------------------------------------------------------ stats
@pytest.mark.mpi
def test_collio_stats_names_the_file_also_for_h5(comm, shared_dir, capfd, monkeypatch):
    monkeypatch.setenv("COLLIO_STATS", "1")
    path = os.path.join(shared_dir, "s.bin")
    lay = _col(comm)
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(np.zeros(lay.shape), lay)
    h5 = pytest.importorskip("collio.h5")
    hpath = os.path.join(shared_dir, "s.h5")
    with h5.File(hpath, "w", comm=comm) as hf:
        d = h5.create_dataset(hf, "x", SHAPE, "<f8")
        h5.write_all(d, np.zeros(lay.shape), lay)
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("collio stats")]
    if comm.rank == 0:
        assert len(lines) == 2, err
        assert lines[0].startswith(f"collio stats {path!r}: 0.0 MiB written")
        assert lines[1].startswith(f"collio stats {hpath!r}: ")
    else:
        assert lines == []


# ------------------------------------------------------------------ threads
class _Blocking(layouts.Segments):
    """Byte runs whose first runs() call (inside write_all, before it communicates)
    waits until the test lets it go, so a second thread meets a call in progress."""

    entered: threading.Event
    go: threading.Event

    def runs(self):
        self.entered.set()
        self.go.wait(20)
        return super().runs()


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_second_thread_in_a_collective_call_raises_at_once(comm, shared_dir):
    path = os.path.join(shared_dir, "t.bin")
    n = 4096
    lay = _Blocking([comm.rank * n], [n])
    lay.entered, lay.go = threading.Event(), threading.Event()
    errors = []
    with collio.open(path, "w", comm=comm) as f:

        def first():
            try:
                f.write_all(np.full(n, comm.rank + 1, np.uint8), lay)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=first, name="writer")
        t.start()
        assert lay.entered.wait(20)
        t0 = time.monotonic()
        for call in (lambda: f.sync(), lambda: f.read_all(layouts.Segments([0], [1]))):
            with pytest.raises(collio.ConcurrentCallError) as info:
                call()
            assert "while thread 'writer' is in write_all on the same communicator" in str(
                info.value
            )
        with pytest.raises(collio.ConcurrentCallError, match="open in thread 'MainThread'"):
            collio.open(os.path.join(shared_dir, "u.bin"), "w", comm=comm)
        assert time.monotonic() - t0 < 5  # at once, not after the other call
        lay.go.set()
        t.join(60)
        assert not t.is_alive() and errors == []
    comm.Barrier()
    got = np.fromfile(path, np.uint8)
    assert np.array_equal(got, np.repeat(np.arange(1, comm.size + 1, dtype=np.uint8), n))
    _still_works(comm, os.path.join(shared_dir, "after.bin"))


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_threads_on_communicators_of_their_own_keep_their_bytes_apart(comm, shared_dir):
    """Two threads at once, each with its own communicator and file (as the README
    says threads doing I/O must be), both through the aggregators in several rounds
    per call: each file holds its own thread's bytes, and each read returns them.  The
    round buffers an aggregator keeps are its thread's own: shared, one thread's
    rounds wrote into the other's window while it was being filled."""
    rows, cols, calls = 32, 256, 40
    hints = {"romio_cb_write": "enable", "romio_cb_read": "enable",
             "mapped_reads": "disable", "cb_buffer_size": 16384}  # fmt: skip
    comms = [comm.Dup(), comm.Dup()]
    step = rows * cols * comm.size

    def value(tag, i):
        return np.float64(tag * 100000 + i * 100 + comm.rank)

    def lay(i):
        return layouts.Subarray((rows, cols * comm.size), (0, comm.rank * cols), (rows, cols),
                                "<f8", offset=i * step * 8)  # fmt: skip

    def work(tag, c, errors, bad):
        try:
            path = os.path.join(shared_dir, f"thread{tag}.bin")
            data = np.empty((rows, cols))
            with collio.open(path, "w", comm=c, hints=hints) as f:
                for i in range(calls):
                    data[:] = value(tag, i)
                    f.write_all(data, lay(i))
            with collio.open(path, "r", comm=c, hints=hints) as f:
                for i in range(calls):
                    got = f.read_all(lay(i))
                    bad.extend([] if (got == value(tag, i)).all() else [i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    errors: list[BaseException] = []
    bad: list[list[int]] = [[], []]
    try:
        t = threading.Thread(target=work, args=(2, comms[1], errors, bad[1]), name="second")
        t.start()
        work(1, comms[0], errors, bad[0])
        t.join(150)
        assert not t.is_alive() and errors == []
    finally:
        for c in comms:
            c.Free()
    assert bad == [[], []]
    comm.Barrier()
    for tag in (1, 2):
        stored = np.fromfile(os.path.join(shared_dir, f"thread{tag}.bin"), "<f8")
        want = np.empty((calls, rows, comm.size, cols))
        want[:] = (tag * 100000 + np.arange(calls) * 100)[:, None, None, None]
        want += np.arange(comm.size)[None, None, :, None]
        assert np.array_equal(stored, want.reshape(-1)), tag


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", ["one", "two"])
@pytest.mark.parametrize("writing", [True, False], ids=["write", "read"])
def test_a_message_that_cannot_be_built_is_agreed_not_a_hang(
    comm, shared_path, monkeypatch, level, writing
):
    """One rank failing to build its round messages (a datatype MPI refuses, no memory
    for its runs) posts stand-ins of the same size: every rank raises the same error
    instead of waiting for messages that never come, and the file is usable after."""
    if comm.size < 2:
        pytest.skip("messages between ranks need two of them")
    glob_ = reference((64, 48), "<f8", seed=3)
    lay = layouts.block(glob_.shape, "<f8", comm=comm, grid=(1, comm.size))
    hints = {"cb_buffer_size": 4096, "mapped_reads": "disable", "cb_min_domain": 0}
    if level == "two":
        if comm.size < 3:
            pytest.skip("two levels need a node of two ranks and another node")
        monkeypatch.setenv("COLLIO_RANKS_PER_NODE", "2")
        hints.update(cb_two_level="enable", cb_min_message=0)

    def boom(*args, **kwargs):
        raise MemoryError("no memory for a message's runs")

    dup = comm.Dup()
    try:
        with collio.open(shared_path, "w", comm=dup, hints=hints) as f:
            f.write_all(local_piece(glob_, lay), lay)
            last = f.stats.last_call
            assert last["path"] != "direct" and last["rounds"] > 1, last
            assert last["two_level"] == (level == "two"), last
            with monkeypatch.context() as m:
                if comm.rank == comm.size - 1:  # (its sends, and receives as an aggregator)
                    for name in ("shaped", "byte_view", "pack_vector", "pack_uniform"):
                        m.setattr(collio.exchange, name, boom)
                _raises_everywhere(
                    comm,
                    collio.CollioError,
                    lambda: (
                        f.write_all(local_piece(glob_, lay) + 1, lay)
                        if writing
                        else f.read_all(lay)
                    ),
                    match="no memory for a message",
                )
            f.write_all(local_piece(glob_, lay), lay)
            np.testing.assert_array_equal(f.read_all(lay), local_piece(glob_, lay))
    finally:
        dup.Free()
    comm.Barrier()
    assert np.array_equal(np.fromfile(shared_path, "<f8").reshape(glob_.shape), glob_)


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["direct", "two-phase"])
def test_a_library_value_error_in_the_storage_is_a_backend_error(comm, shared_path, path):
    """A ValueError raised while the backend moves bytes is the storage failing, not the
    caller's layout: the same BackendError on every rank names the backend."""
    glob_ = reference((64, 48), "<f8", seed=4)
    rows = path == "direct"  # row blocks: large disjoint pieces, written by their ranks
    lay = layouts.block(
        glob_.shape, "<f8", comm=comm, grid=(comm.size, 1) if rows else (1, comm.size)
    )
    with collio.open(shared_path, "w", comm=comm, hints={"cb_min_domain": 0}) as f:
        f.write_all(local_piece(glob_, lay), lay)
        if f.stats.last_call["path"] != path:
            assert comm.size == 1, f.stats.last_call  # (one rank: no shuffle to make)
            pytest.skip(f"one rank takes no {path} path")
        be, name = f.backend, ("write_runs" if rows else "write_window")
        real = getattr(be, name)

        def refuse(*args, **kwargs):
            raise ValueError("codec refused the bytes")

        if comm.rank == comm.size - 1:
            setattr(be, name, refuse)
        try:
            err = _raises_everywhere(
                comm, collio.BackendError, lambda: f.write_all(local_piece(glob_, lay), lay)
            )
        finally:
            setattr(be, name, real)
        assert "posix backend: ValueError: codec refused the bytes" in str(err)
        f.write_all(local_piece(glob_, lay), lay)
    comm.Barrier()
    assert np.array_equal(np.fromfile(shared_path, "<f8").reshape(glob_.shape), glob_)


@pytest.mark.mpi
def test_mpiio_info_is_compared_across_ranks_and_checked(comm, shared_dir):
    """ROMIO's hints given as ``info=`` differ on one rank: the same MismatchError on every
    rank naming them (ROMIO would run with each rank's own), the file untouched; an
    ``info=`` that is no mapping is a HintError; equal ones reach ROMIO."""
    path = os.path.join(shared_dir, "info.bin")
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"kept")
    comm.Barrier()
    last = comm.size - 1
    if comm.size > 1:
        info = {"cb_buffer_size": "1048576" if comm.rank == last else "2097152"}
        err = _raises_everywhere(
            comm, collio.MismatchError,
            lambda: collio.open(path, "w", comm=comm, backend="mpiio", info=info),
        )  # fmt: skip
        assert f"rank {last}" in str(err) and "'cb_buffer_size', '1048576'" in str(err)
        with open(path, "rb") as fh:
            assert fh.read() == b"kept"
    _raises_everywhere(
        comm, collio.HintError,
        lambda: collio.open(path, "w", comm=comm, backend="mpiio", info=5),
        match="info= takes a dict or an MPI.Info, not int",
    )  # fmt: skip
    with collio.open(path, "w", comm=comm, backend="mpiio",
                     info={"cb_buffer_size": "1048576"}) as f:  # fmt: skip
        got = f.backend.fh.Get_info()
        assert got.Get("cb_buffer_size") == "1048576"
        got.Free()


@pytest.mark.mpi
def test_a_missing_target_is_a_file_not_found_error_on_every_rank(comm, shared_dir):
    """A restart's ``except FileNotFoundError`` (no checkpoint yet) catches a load, an
    info or an open of a target that does not exist: collio.NotFoundError, a
    BackendError, with errno ENOENT, the same on every rank."""
    import collio.checkpoint as ckpt

    missing = os.path.join(shared_dir, "none", "model.ckpt")
    lay = layouts.block((4 * comm.size,), "<f8", rank=comm.rank, size=comm.size)
    for call in (lambda: ckpt.load(missing, {"w": lay}, comm=comm),
                 lambda: collio.open(missing, "r", comm=comm)):  # fmt: skip
        err = _raises_everywhere(comm, FileNotFoundError, call)
        assert isinstance(err, collio.NotFoundError) and isinstance(err, collio.BackendError)
        assert err.errno == errno.ENOENT and "none" in str(err)
    with pytest.raises(FileNotFoundError):
        ckpt.info(missing)


@pytest.mark.mpi
def test_a_load_of_other_files_on_other_ranks_names_them(comm, shared_dir):
    """Ranks loading different checkpoints (whose indexes differ): the same
    MismatchError on every rank naming both paths, not a checksum error."""
    import collio.checkpoint as ckpt

    if comm.size == 1:
        pytest.skip("one rank loads one file")
    lay = layouts.block((4 * comm.size,), "<f8", rank=comm.rank, size=comm.size)
    a, b = os.path.join(shared_dir, "a.ckpt"), os.path.join(shared_dir, "b.ckpt")
    ckpt.save(a, {"w": (np.zeros(4), lay)}, comm=comm)
    ckpt.save(b, {"w": (np.ones(4), lay), "v": np.arange(3)}, comm=comm)
    mine = b if comm.rank == comm.size - 1 else a
    err = _raises_everywhere(comm, collio.MismatchError,
                             lambda: ckpt.load(mine, {"w": lay}, comm=comm))  # fmt: skip
    assert f"rank {comm.size - 1} loads {b!r}, rank 0 {a!r}" in str(err), str(err)
