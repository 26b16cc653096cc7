"""The hint ``free_replaced=reuse`` (a save's default, ``automatic``): a save keeps the
checkpoint it replaces as the target's spare, and the next save writes into the spare's
blocks, leaving the same bytes a save into a new file leaves; what is not the save's to
reuse is never written."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

import numpy as np
import pytest
from helpers import fail_fsync_on_last_rank, fs_of, raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts
from collio.backends import localfile, posix
from collio.testing import checkpoint as model

REUSE = {"free_replaced": "reuse"}
#: A save into a new file each time, freeing the replaced one.
NEW = {"free_replaced": "background"}


def _dir(comm: MPI.Intracomm, tmp: Any) -> str:
    return str(comm.bcast(str(tmp), root=0))


@pytest.fixture(autouse=True)
def _spares_kept_here(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """Spares are kept on a local disk's file system alone (ext4, xfs): elsewhere (a
    tmpfs /tmp, say) there is nothing here to test."""
    fs = fs_of(str(mpi_tmp_path)) if comm.rank == 0 else None
    if comm.bcast(fs) not in localfile.REUSED_FS:
        pytest.skip(f"spares are kept on {sorted(localfile.REUSED_FS)}, not here")


def _big(comm: MPI.Intracomm, rows: int, seed: int) -> tuple[np.ndarray[Any, Any], Any]:
    """Rank's rows of a global array large enough that its pieces are placed for huge
    pages (a gap before each, a hole in a new file)."""
    lay = layouts.block((rows, 1024), "f4", grid=(comm.size, 1), rank=comm.rank, size=comm.size)
    whole = np.random.default_rng(seed).standard_normal((rows, 1024)).astype("f4")
    return np.ascontiguousarray(whole[lay.slices]), lay


def _states(comm: MPI.Intracomm) -> list[dict[str, Any]]:
    """Saves one after another whose files differ in size and in where their gaps lie:
    every layout kind, arrays stored whole, a larger save and a smaller one."""
    r, n = comm.rank, comm.size
    return [
        {**model.save_state(r, n), "big": _big(comm, 4096, 1)},
        {
            **model.rows_state(r, n, scale=2),
            "big": _big(comm, 3000, 2),
            "big2": _big(comm, 1500, 3),
        },
        model.save_state(r, n),
        {**model.rows_state(r, n), "big": _big(comm, 5000, 4)},
    ]


def _loads(comm: MPI.Intracomm, path: str, scale: int) -> None:
    """The row-sharded checkpoint of ``scale`` at ``path`` loads, byte for byte."""
    spec = model.rows_layouts(comm.rank, comm.size, scale=scale)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name, scale=scale)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)


def _overwrite(state: Any) -> None:
    for entry in state.values():
        if isinstance(entry, dict):
            _overwrite(entry)
        else:
            (entry[0] if isinstance(entry, tuple) else entry)[...] = 0


def _on0(comm: MPI.Intracomm, fn: Any) -> Any:
    """Rank 0's ``fn()`` on every rank: each asserts on it, so a failing check fails the
    test on every rank instead of leaving the others in the next collective call."""
    return comm.bcast(fn() if comm.rank == 0 else None, root=0)


def _ino(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("how", "punch", "hints"),
    [("save", True, REUSE), ("async_save", True, REUSE), ("save", False, REUSE),
     ("save", True, None), ("async_save", True, None)],
)  # fmt: skip
def test_a_reused_spare_holds_what_a_new_file_holds(
    comm: MPI.Intracomm,
    mpi_tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    punch: bool,
    hints: Any,
) -> None:
    """Each save with the hint (or with no hints: the default) leaves the target byte
    for byte as a save into a new file leaves another path (so every byte the save does
    not write reads zero), keeps the file it replaced as the spare, and from the third
    save on writes into the spare: the target's inode is the one two saves before.
    Without ``punch`` the file system neither allocates ahead nor punches holes
    (``EOPNOTSUPP``)."""
    if not punch:

        def refused(*args: Any) -> int:
            ctypes.set_errno(errno.EOPNOTSUPP)
            return -1

        monkeypatch.setattr(posix, "fallocate", refused)
    d = _dir(comm, mpi_tmp_path)
    path, fresh = os.path.join(d, "model.ckpt"), os.path.join(d, "fresh.ckpt")
    spare = localfile.spare_name(path)
    inodes: list[Any] = []
    for k, state in enumerate(_states(comm)):
        if how == "save":
            ckpt.save(path, state, comm=comm, hints=hints)
        else:
            h = ckpt.async_save(path, state, comm=comm, hints=hints)
            _overwrite(state)  # (the save holds the values at the call)
            h.wait()
        ckpt.save(fresh, _states(comm)[k], comm=comm, hints=NEW)
        same, listed, ino = _on0(comm, lambda: (
            read_file(path) == read_file(fresh), sorted(os.listdir(d)), (_ino(path), _ino(spare))
        ))  # fmt: skip
        assert same, k
        kept = [os.path.basename(spare)] if k else []
        assert listed == sorted(["model.ckpt", "fresh.ckpt", *kept]), listed
        inodes.append(ino)
    assert inodes[0][1] is None
    for k in range(1, len(inodes)):
        assert inodes[k][1] == inodes[k - 1][0], inodes  # (the replaced file, kept)
    for k in range(2, len(inodes)):
        assert inodes[k][0] == inodes[k - 2][0], inodes  # (written into the spare)
    got = ckpt.load(path, {"big": _big(comm, 5000, 4)[1]}, comm=comm)
    assert got["big"].tobytes() == _big(comm, 5000, 4)[0].tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["symlink", "linked", "directory"])
def test_a_spare_that_is_not_the_saves_own_is_never_written(
    comm: MPI.Intracomm, mpi_tmp_path: Any, kind: str
) -> None:
    """A symlink at the spare's name, a file there that has another name too, or a
    directory: the save writes a new file instead, and what stood there keeps its bytes
    (the link's target, the other name's file) or stays (the directory)."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    spare = localfile.spare_name(path)
    victim = os.path.join(d, "victim")
    if comm.rank == 0:
        with open(victim, "wb") as fh:
            fh.write(b"v" * 50000)
        if kind == "symlink":
            os.symlink(victim, spare)
        elif kind == "linked":
            os.link(victim, spare)
        else:
            os.mkdir(spare)
    comm.Barrier()
    state = model.rows_state(comm.rank, comm.size)
    ckpt.save(path, state, comm=comm, hints=REUSE)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm, hints=REUSE)
    kept, ino = _on0(comm, lambda: (read_file(victim), os.stat(victim).st_ino))
    assert kept == b"v" * 50000
    assert ino != _on0(comm, lambda: _ino(path))
    _loads(comm, path, 2)


@pytest.mark.mpi
def test_a_failing_save_into_the_spare_keeps_the_checkpoint(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that took the spare fails (the last rank's fsync, at the close): every
    rank raises the same error, the target keeps the checkpoint it held, and the spare
    the save took goes as any temporary does."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm, hints=REUSE)
    before = read_file(path) if comm.rank == 0 else b""
    fail_fsync_on_last_rank(comm, monkeypatch)
    state = model.rows_state(comm.rank, comm.size, scale=3)
    err = raises_everywhere(
        comm, collio.BackendError, lambda: ckpt.save(path, state, comm=comm, hints=REUSE)
    )
    monkeypatch.undo()
    assert "injected fsync error" in str(err)
    same, listed = _on0(comm, lambda: (read_file(path) == before, os.listdir(d)))
    assert same
    assert listed == ["model.ckpt"], listed
    _loads(comm, path, 2)


@pytest.mark.mpi
def test_a_save_into_a_new_file_removes_the_spare_and_plain_writes_never_take_it(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A plain atomic write with the hint neither takes the spare (it could not tell
    which of its bytes it did not write: they read zero) nor keeps one, and removes
    the spare a checkpoint kept; so does a checkpoint save with ``background``."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    spare = localfile.spare_name(path)
    for plain in (True, False):
        ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
        ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
        assert _on0(comm, lambda: os.path.exists(spare))
        if plain:
            with collio.open(path, "w", comm=comm, hints={"atomic_commit": True, **REUSE}) as f:
                mine = np.full(100, comm.rank + 1, np.uint8)
                f.write_all(mine, layouts.Segments([4096 + 1000 * comm.rank], [100]))
            want = np.zeros(4096 + 1000 * comm.size, np.uint8)
            for r in range(comm.size):
                want[4096 + 1000 * r : 4096 + 1000 * r + 100] = r + 1
            want = want[: 4096 + 1000 * (comm.size - 1) + 100]
        else:
            ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=NEW)
        listed, got = _on0(comm, lambda: (os.listdir(d), read_file(path)))
        assert listed == ["model.ckpt"], listed
        if plain:
            assert got == want.tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("value", [True, "spare"])
def test_a_users_spare_option_is_refused_and_the_spare_kept(
    comm: MPI.Intracomm, mpi_tmp_path: Any, value: Any
) -> None:
    """The option that lets the checkpoint writer reuse a spare is the writer's alone:
    a plain atomic open that passes it is refused on every rank before anything is
    made (it could not zero what it leaves unwritten), and the spare and the checkpoint
    stay as they were."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    spare = localfile.spare_name(path)
    for _ in range(2):
        ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
    before = _on0(comm, lambda: (sorted(os.listdir(d)), read_file(path), read_file(spare)))
    raises_everywhere(
        comm, collio.ModeError,
        lambda: collio.open(path, "w", comm=comm, hints={"atomic_commit": True, **REUSE},
                            _spare=value),
        match="posix backend: unknown options ['_spare']",
    )  # fmt: skip
    assert _on0(comm, lambda: (sorted(os.listdir(d)), read_file(path), read_file(spare))) == before
    assert before[0] == [os.path.basename(spare), "model.ckpt"]


@pytest.mark.mpi
def test_without_hard_links_the_replaced_checkpoint_is_freed(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system refuses a second name (``EPERM``), nothing is kept: the
    save commits as without the hint, and the next one writes a new file."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "no hard links here")

    monkeypatch.setattr(os, "link", refused)
    for scale in (1, 2, 3):
        ckpt.save(path, model.rows_state(comm.rank, comm.size, scale), comm=comm, hints=REUSE)
        listed = _on0(comm, lambda: os.listdir(d))
        assert listed == ["model.ckpt"], listed
    monkeypatch.undo()
    _loads(comm, path, 3)


@pytest.mark.mpi
def test_a_spare_that_arrays_still_map_is_not_written(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """Arrays a load returned over a map of the checkpoint (on every rank) keep their
    values while two saves with the hint follow (the first keeps the mapped file as the
    spare, the second must not write into it); once they are gone, a save takes the
    spare again."""
    import gc

    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    spare = localfile.spare_name(path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
    spec = model.rows_layouts(comm.rank, comm.size)
    got = ckpt.load(path, dict(spec), comm=comm, hints={"checkpoint_map": "enable"})
    mapped = all(model.mapped(a) for a in got.values() if a.size)
    assert comm.allreduce(mapped, op=MPI.LAND)  # (every rank: else the others would wait)
    first = _on0(comm, lambda: _ino(path))
    for scale in (2, 3):
        ckpt.save(path, model.rows_state(comm.rank, comm.size, scale), comm=comm, hints=REUSE)
    kept_values = [
        got[name].tobytes()
        == np.ascontiguousarray(model.rows_reference(name)[lay.slices]).tobytes()  # type: ignore[attr-defined]
        for name, lay in spec.items()
    ]
    assert comm.allgather(kept_values) == [[True] * len(spec)] * comm.size
    assert _on0(comm, lambda: _ino(path)) != first
    del got
    gc.collect()
    comm.Barrier()
    kept = _on0(comm, lambda: _ino(spare))
    ckpt.save(path, model.rows_state(comm.rank, comm.size, 4), comm=comm, hints=REUSE)
    assert _on0(comm, lambda: _ino(path)) == kept
    _loads(comm, path, 4)


@pytest.mark.mpi
def test_a_spare_another_process_has_open_is_not_written(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The last rank holds the checkpoint open (a reader in the middle of its reads, a
    copy of it running) while two saves with the hint follow: the second does not
    write into the file it holds, whose bytes stay as they were; once it is closed, a
    save takes the spare again."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    spare = localfile.spare_name(path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=REUSE)
    before = _on0(comm, lambda: read_file(path))
    fd = os.open(path, os.O_RDONLY) if comm.rank == comm.size - 1 else -1
    comm.Barrier()
    for scale in (2, 3):
        ckpt.save(path, model.rows_state(comm.rank, comm.size, scale), comm=comm, hints=REUSE)
    held = os.pread(fd, len(before) + 1, 0) if fd >= 0 else before
    assert comm.allgather(held == before) == [True] * comm.size
    if fd >= 0:
        os.close(fd)
    comm.Barrier()
    kept = _on0(comm, lambda: _ino(spare))
    ckpt.save(path, model.rows_state(comm.rank, comm.size, 4), comm=comm, hints=REUSE)
    assert _on0(comm, lambda: _ino(path)) == kept
    _loads(comm, path, 4)


@pytest.mark.mpi
@pytest.mark.parametrize("fs", [None, "tmpfs", "btrfs"])
def test_no_spare_is_kept_where_no_save_could_take_it(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fs: str | None
) -> None:
    """Where the file system is not a local disk's overwritten in place (a parallel
    file system's case, ``None``, where no save would ever take a spare; tmpfs, where
    a spare would be a checkpoint held in memory; btrfs, whose overwrites allocate all
    the same), a save by default keeps none, so a second checkpoint's space is not held
    for nothing, and removes the spare an earlier save kept; each save writes a new
    file and loads."""
    d = _dir(comm, mpi_tmp_path)
    path = os.path.join(d, "model.ckpt")
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    assert _on0(comm, lambda: sorted(os.listdir(d))) == [".model.ckpt.collio-spare", "model.ckpt"]
    monkeypatch.setattr(localfile, "fs_name", lambda fd: fs)
    for scale in (1, 2, 3):
        ckpt.save(path, model.rows_state(comm.rank, comm.size, scale), comm=comm)
        listed = _on0(comm, lambda: os.listdir(d))
        assert listed == ["model.ckpt"], (scale, listed)
        _loads(comm, path, scale)
