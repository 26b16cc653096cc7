"""collio.mpi.File against mpi4py's MPI.File (ROMIO) for everything but data access: the
amode rules and their errors, sizes, views' offsets, pointers, hints, error handlers,
the Python protocols; and collio's errors agreed on every rank.

Each scenario runs once with each class, in the same run; what it observes (values, and
the MPI error class of each error) must be the same, and so must the files it leaves.
"""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import mpi
from collio.comms import private

RD, WR, RW = MPI.MODE_RDONLY, MPI.MODE_WRONLY, MPI.MODE_RDWR
CREATE, EXCL, SEQ = MPI.MODE_CREATE, MPI.MODE_EXCL, MPI.MODE_SEQUENTIAL
#: Calls where only ROMIO's rank 0 sees the error (rank 0 alone creates, preallocates;
#: the others get ERR_OTHER or nothing): collio raises rank 0's error on every rank.
ROMIO_RANK0 = ("excl", "preallocate rdonly")


def outcome(fn):
    """What a call did: ("ok", its value) or ("error", the MPI error class)."""
    try:
        return ("ok", fn())
    except MPI.Exception as exc:
        return ("error", exc.Get_error_class())


def both(comm, tmp, scenario):
    """``scenario(cls, comm, path)`` with each class on its own path; the observations
    and the files left must be equal.  Returns collio's observations."""
    seen = {}
    for cls, name in ((MPI.File, "romio"), (mpi.File, "collio")):
        path = str(tmp / f"{scenario.__name__}-{name}.bin")
        seen[name] = scenario(cls, comm, path)
        comm.Barrier()
        seen[name + "-bytes"] = Path(path).read_bytes() if os.path.exists(path) else None
        comm.Barrier()
    for key in ROMIO_RANK0:
        if key in seen["romio"]:
            seen["romio"][key] = comm.bcast(seen["romio"][key], root=0)
    for key in ("romio", "romio-bytes"):
        mine = seen[key.replace("romio", "collio")]
        assert mine == seen[key], f"{scenario.__name__}: collio {mine!r} != ROMIO {seen[key]!r}"
    return seen["collio"]


def opening(cls, comm, path):
    out = {"missing": outcome(lambda: cls.Open(comm, path, RD))}
    for name, amode in {
        "rdonly|create": RD | CREATE, "rdonly|excl": RD | EXCL, "no access": CREATE,
        "rdwr|sequential": RW | SEQ | CREATE, "two access": RD | WR,
    }.items():  # fmt: skip
        out[name] = outcome(lambda a=amode: cls.Open(comm, path, a))
    cls.Open(comm, path, WR | CREATE).Close()
    out["excl"] = outcome(lambda: cls.Open(comm, path, WR | CREATE | EXCL))
    comm.Barrier()
    if comm.rank == 0:
        out["delete"] = outcome(lambda: cls.Delete(path))
        out["delete again"] = outcome(lambda: cls.Delete(path))
    comm.Barrier()
    return out


def sizes_and_modes(cls, comm, path):
    fh = cls.Open(comm, path, RW | CREATE | MPI.MODE_UNIQUE_OPEN)
    mine = np.arange(10, dtype=np.int32) + 100 * comm.rank
    fh.Write_at(40 * comm.rank, mine)
    comm.Barrier()
    out = {
        "size": fh.Get_size(), "props": (fh.size, fh.amode, fh.group_size, fh.group_rank),
        "atomicity": (fh.Get_atomicity(), fh.atomicity), "amode": fh.Get_amode(),
        "errhandler is ERRORS_RETURN": fh.Get_errhandler() == MPI.ERRORS_RETURN,
        "pickle": _pickle(fh),
    }  # fmt: skip
    fh.Set_atomicity(True)
    out["atomic"] = fh.Get_atomicity()
    fh.Write_at(40 * comm.rank + 4, mine[:2])
    fh.Set_atomicity(False)
    fh.Set_size(40 * comm.size + 13)
    out["set_size"] = fh.Get_size()
    fh.Set_size(40 * comm.size - 6)  # (shrinks)
    out["shrunk"] = fh.Get_size()
    fh.Preallocate(7)
    out["preallocate smaller"] = fh.Get_size()
    fh.Preallocate(40 * comm.size + 100)
    out["preallocate"] = fh.Get_size()
    out["negative size"] = outcome(lambda: fh.Set_size(-1))
    fh.Sync()
    group = fh.Get_group()
    out["group"] = MPI.Group.Compare(group, comm.Get_group())
    group.Free()
    fh.Close()
    out["closed"] = (fh == MPI.FILE_NULL, bool(fh))
    return out


def _pickle(fh):
    try:
        pickle.dumps(fh)
    except ValueError:
        return "refused"
    return "pickled"


def refusals(cls, comm, path):
    """What each amode forbids, and bad arguments."""
    fh = cls.Open(comm, path, WR | CREATE)
    out = {
        "read wronly": outcome(lambda: fh.Read_at(0, bytearray(4))),
        "read_all wronly": outcome(lambda: fh.Read_at_all(0, bytearray(4))),
        "seek negative": outcome(lambda: fh.Seek(-1)),
        "seek whence": outcome(lambda: fh.Seek(0, 99)),
        "write at negative": outcome(lambda: fh.Write_at(-4, bytearray(4))),
    }
    fh.Write_at_all(8 * comm.rank, np.full(2, comm.rank, np.int32))
    fh.Set_view(0, MPI.INT)
    out["part of an etype"] = outcome(lambda: fh.Write(bytearray(3)))
    fh.Close()
    fh = cls.Open(comm, path, RD)
    for name, call in {
        "write rdonly": lambda: fh.Write_at(0, bytearray(4)),
        "write_all rdonly": lambda: fh.Write_at_all(0, bytearray(4)),
        "sync rdonly": fh.Sync,
        "set_size rdonly": lambda: fh.Set_size(10),
        "preallocate rdonly": lambda: fh.Preallocate(10),
    }.items():
        out[name] = outcome(call)
    fh.Close()
    fh = cls.Open(comm, path, WR | SEQ)
    for name, call in {
        "sequential seek": lambda: fh.Seek(0),
        "sequential write_at": lambda: fh.Write_at(0, bytearray(4)),
        "sequential get_position": fh.Get_position,
        "sequential set_view disp 0": lambda: fh.Set_view(0),
    }.items():
        out[name] = outcome(call)
    if comm.rank == 0:
        fh.Write_shared(np.full(2, 7, np.int32))
    comm.Barrier()
    fh.Close()
    return out


def views_and_pointers(cls, comm, path):
    fh = cls.Open(comm, path, RW | CREATE)
    fh.Write_at_all(64 * comm.rank, np.arange(16, dtype=np.int32))
    ft = MPI.INT.Create_vector(2, 1, 3).Commit()
    try:
        fh.Set_view(4 + 8 * comm.rank, MPI.INT, ft)
        disp, et, got_ft, rep = fh.Get_view()
        out = {
            "view": (disp, et == MPI.INT, got_ft.Get_envelope(), rep),
            "byte offsets": [fh.Get_byte_offset(i) for i in range(5)],
            "type extent": fh.Get_type_extent(MPI.DOUBLE),
        }
        got_ft.Free()
        fh.Seek(3)
        fh.Seek(2, MPI.SEEK_CUR)
        out["seek cur"] = fh.Get_position()
        fh.Seek(-1, MPI.SEEK_END)
        out["seek end"] = fh.Get_position()
        fh.Seek_shared(2)
        out["shared"] = fh.Get_position_shared()
        comm.Barrier()  # (before any rank moves it again)
        fh.Seek_shared(1, MPI.SEEK_CUR)
        out["shared cur"] = fh.Get_position_shared()
        comm.Barrier()
        fh.Set_view(2, MPI.SHORT)  # (both pointers back to 0)
        out["shared after view"] = fh.Get_position_shared()
        comm.Barrier()
        if comm.rank == comm.size - 1:
            fh.Write_shared(np.full(3, 9, np.int16))
        comm.Barrier()
        out["shared moved"] = fh.Get_position_shared()
        comm.Barrier()
    finally:
        ft.Free()
    fh.Close()
    fh = cls.Open(comm, path, WR | MPI.MODE_APPEND)
    out["append"] = (fh.Get_position(), fh.Get_position_shared())
    comm.Barrier()
    fh.Write_ordered(np.full(3, comm.rank + 1, np.int16))
    fh.Close()
    fh = cls.Open(comm, path, RD | MPI.MODE_DELETE_ON_CLOSE)
    out["size at delete"] = fh.Get_size()
    fh.Close()
    out["deleted"] = os.path.exists(path)
    cls.Open(comm, path, WR | CREATE).Close()  # (an empty file to compare)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", [opening, sizes_and_modes, refusals, views_and_pointers])
def test_same_as_romio(comm, mpi_tmp_path, scenario):
    both(comm, mpi_tmp_path, scenario)


@pytest.mark.mpi
def test_errors_are_mpi_and_collio_errors(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "missing.bin")
    with pytest.raises(MPI.Exception) as caught:
        mpi.File.Open(comm, path, RD)
    exc = caught.value
    assert isinstance(exc, collio.CollioError) and isinstance(exc, mpi.errors.ErrNoSuchFile)
    assert exc.Get_error_class() == MPI.ERR_NO_SUCH_FILE and "missing.bin" in str(exc)
    assert exc.Get_error_string() == MPI.Get_error_string(MPI.ERR_NO_SUCH_FILE)


@pytest.mark.mpi
def test_one_rank_wrong_raises_on_every_rank(comm, mpi_tmp_path):
    """A collective call with one rank's arguments wrong raises the same error on every
    rank, naming that rank; the file goes on working."""
    path = str(mpi_tmp_path / "agreed.bin")
    last = comm.size - 1
    amode = RW | CREATE if comm.rank != last else RD | CREATE
    with pytest.raises(mpi.errors.ErrAmode, match=f"rank {last}"):
        mpi.File.Open(comm, path, amode)
    fh = mpi.File.Open(comm, path, RW | CREATE)
    offset = -8 if comm.rank == last else 8 * comm.rank
    with pytest.raises(mpi.errors.ErrArg, match=f"rank {last}"):
        fh.Write_at_all(offset, np.full(2, comm.rank, np.int32))
    if comm.size > 1:
        with pytest.raises(mpi.errors.ErrArg, match="inconsistent"):
            fh.Set_size(100 + comm.rank)
    req = fh.Iwrite_at_all(8 * comm.rank, np.full(2, comm.rank, np.int32))
    req.Wait()
    assert fh.Get_size() == 8 * comm.size
    fh.Close()
    want = np.repeat(np.arange(comm.size, dtype=np.int32), 2)
    np.testing.assert_array_equal(np.fromfile(path, np.int32), want)


@pytest.mark.mpi
def test_error_handlers(comm, mpi_tmp_path):
    """A user's handler is called with the error (then the call returns, as MPICH's do),
    and by Call_errhandler."""
    seen = {}
    for cls in (MPI.File, mpi.File):
        calls = []
        handler = cls.Create_errhandler(
            lambda f, code, calls=calls: calls.append(MPI.Get_error_class(code))
        )
        fh = cls.Open(comm, str(mpi_tmp_path / f"eh-{cls.__module__}.bin"), WR | CREATE)
        fh.Set_errhandler(handler)
        assert fh.Get_errhandler() == handler or cls is MPI.File
        fh.Read_at(0, bytearray(4))  # (no error raised: the handler had it)
        fh.Seek(-1)
        fh.Call_errhandler(MPI.ERR_OTHER)
        fh.Close()
        handler.Free()
        seen[cls] = calls
    assert seen[mpi.File] == seen[MPI.File] == [MPI.ERR_ACCESS, MPI.ERR_ARG, MPI.ERR_OTHER]


@pytest.mark.mpi
def test_info_names_romio_hints(comm, mpi_tmp_path):
    keys = {}
    for cls in (MPI.File, mpi.File):
        info = MPI.Info.Create({"cb_buffer_size": "65536", "cb_nodes": "1"})
        fh = cls.Open(comm, str(mpi_tmp_path / f"i-{cls.__module__}.bin"), WR | CREATE, info)
        info.Free()
        got = fh.Get_info()
        keys[cls] = {got.Get_nthkey(i): got.Get(got.Get_nthkey(i)) for i in range(got.Get_nkeys())}
        got.Free()
        new = MPI.Info.Create({"cb_buffer_size": "131072", "cb_nodes": str(comm.size)})
        fh.Set_info(new)
        new.Free()
        got = fh.Get_info()
        keys[cls, "set"] = (got.Get("cb_buffer_size"), got.Get("romio_aggregator_list"))
        got.Free()
        fh.Close()
    for name in ("cb_buffer_size", "cb_nodes", "romio_cb_read", "romio_cb_write"):
        assert keys[mpi.File][name] == keys[MPI.File][name], name
    every = " ".join(str(r) for r in range(comm.size))  # (collio plans anew with cb_nodes)
    assert keys[mpi.File, "set"] == ("131072", every)
    assert "romio_aggregator_list" in keys[mpi.File]


@pytest.mark.mpi
def test_context_manager_and_drop_in_module(comm, mpi_tmp_path):
    """``with`` closes (mpi4py's File has no context manager); ``collio.mpi.MPI`` is
    mpi4py's module but for ``File``."""
    path = str(mpi_tmp_path / "with.bin")
    assert mpi.MPI.File is mpi.File and mpi.MPI.COMM_WORLD is MPI.COMM_WORLD
    with mpi.MPI.File.Open(comm, path, WR | CREATE) as fh:
        fh.Write_at_all(4 * comm.rank, np.int32([comm.rank]))
    assert fh == MPI.FILE_NULL and not fh
    with pytest.raises(mpi.errors.ErrFile):
        fh.Get_size()
    np.testing.assert_array_equal(np.fromfile(path, np.int32), np.arange(comm.size))


@pytest.mark.mpi
def test_ranks_writing_the_same_bytes_are_refused(comm, mpi_tmp_path):
    """ROMIO lets ranks of one collective call write the same bytes (which rank's land is
    undefined); collio raises ERR_ARG on every rank, naming them, and writes nothing."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = str(mpi_tmp_path / "overlap.bin")
    with mpi.File.Open(comm, path, WR | CREATE) as fh:
        with pytest.raises(mpi.errors.ErrArg, match=r"bytes \[0, 4\) are written by ranks 0"):
            fh.Write_at_all(0, np.full(4, comm.rank, np.uint8))
        assert fh.Get_size() == 0


def pending_beside_another_file(cls, comm, path):
    """A nonblocking collective on file A pending while blocking collectives run on file B
    of the same communicator, then blocking calls on A once it is complete and a
    nonblocking one on B.  Odd ranks start A's call only after B's blocking calls: MPI's
    nonblocking collectives are local, so the even ranks' must return without them (a
    communicator made or shared at that call would leave the ranks waiting in different
    operations)."""
    n, r, p = 64, comm.rank, comm.size
    nxt = (r + 1) % p
    mine_a = np.arange(n, dtype=np.int32) + 1000 * r
    mine_b = -np.arange(n, dtype=np.int32) - 1000 * r
    a = cls.Open(comm, path, RW | CREATE)
    b = cls.Open(comm, path + ".b", RW | CREATE)
    req = a.Iwrite_at_all(4 * n * r, mine_a) if r % 2 == 0 else None
    b.Write_at_all(4 * n * r, mine_b)
    b.Sync()
    comm.Barrier()
    b.Sync()
    got_b = np.zeros(n, np.int32)
    b.Read_at_all(4 * n * nxt, got_b)
    if req is None:
        req = a.Iwrite_at_all(4 * n * r, mine_a)
    req.Wait()
    a.Sync()
    comm.Barrier()
    a.Sync()
    got_a = np.zeros(n, np.int32)
    a.Read_at_all(4 * n * nxt, got_a)
    a.Write_at_all(4 * n * (p + r), mine_b)
    later = np.zeros(n, np.int32)
    req = b.Iread_at_all(4 * n * r, later)
    a.Close()
    req.Wait()
    b.Close()
    np.testing.assert_array_equal(got_a, np.arange(n, dtype=np.int32) + 1000 * nxt)
    np.testing.assert_array_equal(got_b, -np.arange(n, dtype=np.int32) - 1000 * nxt)
    np.testing.assert_array_equal(later, mine_b)
    whole_b = Path(path + ".b").read_bytes()
    want_b = np.concatenate([-np.arange(n, dtype=np.int32) - 1000 * q for q in range(p)])
    assert whole_b == want_b.tobytes()
    comm.Barrier()
    return {"a": got_a.tolist(), "b": got_b.tolist(), "b file": whole_b}


@pytest.mark.mpi
def test_nonblocking_on_one_file_beside_blocking_on_another(comm, mpi_tmp_path):
    both(comm, mpi_tmp_path, pending_beside_another_file)
    path = mpi_tmp_path / "pending_beside_another_file-collio.bin"
    n, p = 64, comm.size
    first = [np.arange(n, dtype=np.int32) + 1000 * q for q in range(p)]
    second = [-np.arange(n, dtype=np.int32) - 1000 * q for q in range(p)]
    assert path.read_bytes() == np.concatenate(first + second).tobytes()


def _workers(path):
    return [t for t in threading.enumerate() if t.name == f"collio.mpi {path}"]


@pytest.mark.mpi
def test_files_run_on_lanes_of_one_duplicate(comm, mpi_tmp_path):
    """Files opened and closed one after another run on one duplicate of collio's
    communicator (a lane, lent again with the plans it kept); blocking calls start no
    thread; files open at once have communicators of their own; the lanes are freed
    with the user's communicator, a lane still lent when its file closes."""
    user = comm.Dup()
    path = str(mpi_tmp_path / "lanes.bin")
    n, r, p = 256, comm.rank, comm.size
    data = np.arange(n, dtype=np.int64) * p + r  # (every p-th element: two-phase, planned)
    ft = MPI.INT64_T.Create_vector(n, 1, p).Commit()
    for _ in range(3):
        fh = mpi.File.Open(user, path, RW | CREATE)
        fh.Set_view(8 * r, MPI.INT64_T, ft)
        fh.Write_all(data)
        got = np.zeros(n, np.int64)
        fh.Set_view(8 * r, MPI.INT64_T, ft)
        fh.Read_all(got)
        np.testing.assert_array_equal(got, data)
        assert not _workers(path)
        fh.Close()
    ft.Free()
    assert Path(path).read_bytes() == np.arange(n * p, dtype=np.int64).tobytes()
    priv = private(user)
    assert [lane.busy for lane in priv.lanes] == [False]
    lane = priv.lanes[0]
    # the later opens' writes reused the first's plan (one rank writes its runs itself)
    assert lane.plans.hits >= 2 or p == 1
    assert MPI.Comm.Compare(lane.comm, user) == MPI.CONGRUENT
    a = mpi.File.Open(user, path, RW)
    b = mpi.File.Open(user, path + ".b", RW | CREATE)
    assert a._comm is lane.comm and b._comm is not lane.comm
    assert MPI.Comm.Compare(b._comm, lane.comm) == MPI.CONGRUENT
    req = b.Iwrite_at_all(8 * n * r, np.arange(n, dtype=np.int64) + n * r)
    req.Wait()
    assert len(_workers(path + ".b")) == 1
    for _ in range(2):  # (each view's shared pointer has a file of its own, removed)
        a.Read_shared(np.zeros(1, np.int64))
        a.Set_view(0, MPI.BYTE)
    a.Close()
    b.Close()
    comm.Barrier()
    assert not [f for f in os.listdir(mpi_tmp_path) if "collio-shfp" in f]
    assert not _workers(path + ".b")
    assert [x.busy for x in priv.lanes] == [False, False]
    assert Path(path + ".b").read_bytes() == Path(path).read_bytes()
    comms = [x.comm for x in priv.lanes]
    c = mpi.File.Open(user, path, RD)
    user.Free()  # (legal with a file open: collio's duplicate and lanes outlive it)
    assert comms[0] is c._comm and MPI.COMM_NULL not in comms
    got = np.zeros(n * p, np.int64)
    c.Read_at_all(0, got)
    c.Close()
    np.testing.assert_array_equal(got, np.arange(n * p, dtype=np.int64))
    assert comms == [MPI.COMM_NULL] * 2 and priv.comm == MPI.COMM_NULL


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_failed_collective_call_leaves_the_individual_pointer(comm, mpi_tmp_path):
    """``Write_all``/``Read_all`` through a strided view that fail (a real EFBIG on every
    rank; one rank's read-only buffer): the pointer moved before the engine ran, so a
    failed call left it past data never written (collio's own ``write_all`` does not
    move it); now it stays on every rank, the file as it was, and the calls go on from
    it, byte for byte what numpy has."""
    import resource

    r, p = comm.rank, comm.size
    path = comm.bcast(str(mpi_tmp_path / "pointer.bin"), root=0)
    n = 512  # doubles per block: each call writes 4 blocks per rank, the ranks' interleaved
    ft = MPI.DOUBLE.Create_vector(4, n, n * p).Create_resized(0, 4 * n * p * 8).Commit()
    steps = [np.arange(4 * n, dtype="<f8") + 1000.0 * (s * p + r) for s in range(2)]
    fh = mpi.File.Open(comm, path, CREATE | RW)
    try:
        fh.Set_view(r * n * 8, MPI.DOUBLE, ft)
        fh.Write_all(steps[0])
        assert fh.Get_position() == 4 * n
        comm.Barrier()
        before = Path(path).read_bytes()
        comm.Barrier()
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before), limits[1]))
        try:
            with pytest.raises(MPI.Exception, match="backend I/O: rank 0: file too large") as info:
                fh.Write_all(steps[1])
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert comm.allgather(str(info.value)) == [str(info.value)] * p
        assert info.value.Get_error_class() == MPI.ERR_IO
        assert comm.allgather(fh.Get_position()) == [4 * n] * p
        comm.Barrier()
        assert Path(path).read_bytes() == before
        comm.Barrier()
        fh.Write_all(steps[1])  # (from where the failed call would have written)
        assert fh.Get_position() == 8 * n
        fh.Seek(0)
        frozen = np.zeros(8 * n)
        frozen.flags.writeable = r != p - 1
        readonly = f"read_all: rank {p - 1}: the buffer to read into is read-only"
        with pytest.raises(MPI.Exception, match=readonly) as info:
            fh.Read_all(frozen)
        assert comm.allgather(str(info.value)) == [str(info.value)] * p
        assert info.value.Get_error_class() == MPI.ERR_ARG
        assert comm.allgather(fh.Get_position()) == [0] * p
        got = np.zeros(8 * n)
        fh.Read_all(got)
        assert fh.Get_position() == 8 * n
        np.testing.assert_array_equal(got, np.concatenate(steps))
    finally:
        fh.Close()
        ft.Free()
    want = np.zeros((8, p, n))
    for q in range(p):
        for s in range(2):
            want[4 * s : 4 * s + 4, q] = (np.arange(4 * n) + 1000.0 * (s * p + q)).reshape(4, n)
    comm.Barrier()
    assert Path(path).read_bytes() == want.astype("<f8").tobytes()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("repeated", [False, True])
def test_at_calls_are_named_and_do_not_match_pointer_calls(comm, mpi_tmp_path, repeated):
    """``Write_at_all``/``Read_at_all`` (blocking, nonblocking, split) went to the engine
    as ``write_all``/``read_all``: their errors named those calls, and one rank's
    ``Write_at_all`` beside the others' ``Write_all`` went ahead as one call.  Now their
    errors name ``write_at_all``/``read_at_all`` on every rank alike, also after repeats
    (the kept calls' steps), and the mix is ERR_NOT_SAME on every rank, the file and the
    pointers as they were; the calls go on after, byte for byte what numpy has."""
    r, p = comm.rank, comm.size
    path = comm.bcast(str(mpi_tmp_path / "at.bin"), root=0)
    fh = mpi.File.Open(comm, path, CREATE | RW)
    try:
        fh.Set_view(0, MPI.DOUBLE, MPI.DOUBLE)
        for k in range(4 if repeated else 1):
            fh.Write_at_all(k * p + r, np.array([k * p + r + 0.5]))
            got = np.zeros(1)
            fh.Read_at_all(k * p + r, got)
            assert got.tolist() == [k * p + r + 0.5]
        comm.Barrier()
        before = Path(path).read_bytes()
        comm.Barrier()
        frozen = np.zeros(1)
        frozen.flags.writeable = r != p - 1
        calls = {
            "write_at_all": lambda: fh.Write_at_all(-1 if r == p - 1 else r, np.zeros(1)),
            "read_at_all": lambda: fh.Read_at_all(r, frozen),
            "write_at_all (nonblocking)": lambda: fh.Iwrite_at_all(
                -1 if r == p - 1 else r, np.zeros(1)
            ).Wait(),
        }
        for what, call in calls.items():
            name = what.split()[0]
            with pytest.raises(MPI.Exception, match=f"{name}: rank {p - 1}: ") as info:
                call()
            assert comm.allgather(str(info.value)) == [str(info.value)] * p
        mixes = ((fh.Write_at_all, fh.Write_all), (fh.Read_at_all, fh.Read_all))
        for first, rest in mixes if p > 1 else ():  # (one rank: no other call to meet)
            buf = np.zeros(1)
            with pytest.raises(MPI.Exception) as info:
                first(0, buf) if r == 0 else rest(buf)
            assert info.value.Get_error_class() == MPI.ERR_NOT_SAME
            assert comm.allgather(str(info.value)) == [str(info.value)] * p
            assert "write_at_all" in str(info.value) or "read_at_all" in str(info.value)
            assert fh.Get_position() == 0
        comm.Barrier()
        assert Path(path).read_bytes() == before
        comm.Barrier()
        fh.Write_at_all(r, np.array([-r - 0.5]))
        got = np.zeros(1)
        fh.Read_at_all(r, got)
        assert got.tolist() == [-r - 0.5]
    finally:
        fh.Close()
    comm.Barrier()
    want = np.arange((4 if repeated else 1) * p) + 0.5
    want[:p] = -np.arange(p) - 0.5
    assert Path(path).read_bytes() == want.astype("<f8").tobytes()
