"""Local files as targets: regular files only, and the temporaries of atomic writes.

Shared by the backends that store one file (posix, mpiio) and by :mod:`collio.h5`, so
that a target is judged the same way whichever front end opens it.

* Only a regular file (or a symlink to one) is a target.  A FIFO opened for writing
  blocks until a reader comes, a device or a socket takes no ``pwrite``; each is refused
  with a :class:`~collio.errors.BackendError` before anything opens it, and every open
  is made with ``O_NONBLOCK`` and checked with ``fstat``, so a target swapped meanwhile
  cannot block a rank either.  An atomic write to a symlink replaces the file the link
  names (its temporary made beside that file), and the link stays.
* A temporary of ``atomic_commit`` is ``.NAME.collio-HOST-PID-XXXXXXXX.tmp`` beside the
  target, created ``0600`` (nobody else reads a half-written file) and given the
  target's mode and owner at commit.  Rank 0 holds an ``flock`` on it while its job
  lives; the kernel drops that lock when the process dies, however it dies.  A later
  atomic open or commit of the same target removes the temporaries whose lock it can
  take (:func:`reclaim`): those of jobs that are gone, never one another live job holds.
* With the hint ``free_replaced=reuse`` (checkpoint saves), the file a commit replaces
  stays beside the target as ``.NAME.collio-spare`` (:func:`keep_spare`), and the next
  save to the target takes it as its temporary (:func:`claim_spare`) and writes into
  its blocks: a save then frees and allocates next to none, where on a file system
  that discards freed blocks the freeing costs the job's cores as much as the write.
  The spare is only taken on a local file system, where it is a file this user's save
  made that nothing else links to and no other process has open or mapped; a commit
  without the hint removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import glob
import os
import re
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import uuid
from typing import Any

from ..buffers import PAGE
from ..collective import Attempt, agree
from ..errors import BackendError
from .mapped import fs_name

__all__ = [
    "Prepared",
    "check_target",
    "claim_spare",
    "drop_spare",
    "finish_temporary",
    "forget_cached",
    "fsync_dir",
    "hold",
    "keep_spare",
    "keepable",
    "make_temporary",
    "new_mode",
    "open_regular",
    "prepare",
    "reclaim",
    "release_later",
    "spare_name",
    "temporary_pattern",
    "truncate_opened",
    "unlink_quietly",
]

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)
#: Where the lock cannot tell (another node's temporary whose lock was just free, a file
#: system without flock): a temporary this old is a dead job's.  A live job touches its
#: temporary at every round; one that wrote nothing for a day is not writing any more.
_STALE_AGE = 24 * 3600.0
#: Linux's ``F_SETLEASE`` (None elsewhere): see :func:`claim_spare`.
_LEASE: int | None = (
    getattr(fcntl, "F_SETLEASE", None) if sys.platform.startswith("linux") else None
)
_HOST = re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname())[:32] or "host"


def _refusal(path: str, st: os.stat_result) -> BackendError | None:
    if stat.S_ISREG(st.st_mode):
        return None
    kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
    code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
    return BackendError(
        f"{path!r} is {kind}, not a regular file: collio reads and writes regular files only",
        errno=code,
    )


def check_target(path: str, mode: str) -> os.stat_result | None:
    """Local: the target's ``stat`` (None when it does not exist, allowed only in
    ``'w'``-like modes), or a :class:`BackendError` for anything but a regular file.

    ``stat`` follows symlinks, so a link to a regular file is that file; it opens
    nothing, so a FIFO or a device is judged without being touched.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if mode in ("r", "r+"):
            raise BackendError(f"no such file: {path!r}", errno=errno.ENOENT) from None
        return None
    bad = _refusal(path, st)
    if bad is not None:
        raise bad
    return st


def open_regular(path: str, flags: int, perm: int = 0o666) -> int:
    """``os.open`` that never blocks and returns only a regular file's descriptor.

    ``O_NONBLOCK`` makes opening a FIFO return at once (or fail with ``ENXIO``) instead
    of waiting for its other end; then ``fstat`` refuses anything but a regular file.
    The flag is cleared again: it means nothing to a regular file's reads and writes.
    """
    fd = os.open(path, flags | _NONBLOCK | _NOCTTY | _CLOEXEC, perm)
    try:
        bad = _refusal(path, os.fstat(fd))
        if bad is not None:
            raise bad
        if _NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_mode() -> int:
    """The mode a new file gets here: ``0o666`` less the process's umask (read without
    changing it where ``/proc`` tells, as ``os.umask`` would for a moment)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def temporary_pattern(path: str) -> tuple[str, str]:
    """(directory, glob pattern) of the temporaries of atomic writes to ``path``."""
    d, base = os.path.split(os.path.abspath(path))
    return d, f".{glob.escape(base[:150])}.collio-*.tmp"


def _temporary_name(path: str) -> str:
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base[:150]}.collio-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def make_temporary(path: str) -> tuple[str, int]:
    """On rank 0: create the temporary of an atomic write to ``path``, ``0600``, with this
    job's host and process id in its name and an ``flock`` held on the descriptor
    returned (keep it open until the temporary is committed or removed)."""
    name = _temporary_name(path)
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | _CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException as exc:  # (an interrupt too: no temporary left behind)
        if not isinstance(exc, OSError) or exc.errno not in (
            errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL
        ):  # fmt: skip
            os.close(fd)
            _unlink(name)
            raise
        # (a file system without flock: the name tells this job's temporary from others)
    return name, fd


def spare_name(path: str) -> str:
    """The name of the replaced file a save with ``free_replaced=reuse`` keeps beside ``path``."""
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base[:150]}.collio-spare")


def claim_spare(path: str) -> tuple[str, int] | None:
    """On rank 0: the spare kept beside ``path`` (:func:`keep_spare`) renamed to a
    temporary of this job, ``0600`` and locked, as :func:`make_temporary` returns one,
    its old bytes still in it; None (nothing changed) where there is none to take.

    Only a regular file of this user that nothing else links to is taken: writing into
    one with another name would change that file too, and one of another user's is not
    this job's to reuse.  Nor is one that any other process has open or mapped (a load
    of it still running, arrays a load returned over a map of it, a ``cp`` of the
    checkpoint it was): a write lease (Linux's ``F_SETLEASE``) is granted only when no
    other descriptor or map of the file exists on the node, and only on a local file
    system, whose files no other node can have open.  Elsewhere nothing is taken.  It
    is opened without following a link, made ``0600`` and locked before it is renamed,
    so another job's reclaim never takes it for a dead one's, and a file put at the
    name meanwhile (another inode) is renamed back."""
    spare = spare_name(path)
    try:
        fd = os.open(spare, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | _NONBLOCK | _CLOEXEC)
    except OSError:
        return None
    leased, lease, name = False, _LEASE, ""
    try:
        st = os.fstat(fd)
        if lease is None or st.st_uid != os.geteuid() or not _reusable(fd, st):
            os.close(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (another job's claim: not ours)
        # Another process opening the spare while the lease is held (a save to the same
        # target, a cp of the directory) breaks the lease, and the kernel signals the
        # lease's owner: SIGIO by default, whose default action ends the process.  The
        # signal is SIGURG (ignored unless handled) from before the lease is set, and
        # the owner, which setting the lease makes this process, is cleared right after
        # it: a break signals nobody.  (The opener waits until the lease is released.)
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, lease, fcntl.F_WRLCK)  # (EAGAIN: open or mapped elsewhere)
        leased = True
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)
        os.fchmod(fd, 0o600)
        name = _temporary_name(path)
        os.rename(spare, name)
        if fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_WRLCK:
            # (the lease is being broken: a process opened the spare meanwhile and
            # will hold it once the lease goes; it must not see a save write into it)
            os.rename(name, spare)
            name = ""
            raise OSError(errno.EBUSY, "the spare was opened while it was claimed")
        fcntl.fcntl(fd, lease, fcntl.F_UNLCK)  # (renamed: no one opens it by name now)
        leased = False
        moved = os.lstat(name)
        if (moved.st_dev, moved.st_ino) != (st.st_dev, st.st_ino):
            with contextlib.suppress(OSError):
                os.rename(name, spare)
            os.close(fd)
            return None
        if _NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        os.utime(fd)  # (its age is this job's: a reclaim without locks goes by age)
    except BaseException as exc:
        # (an OSError: not taken; an interrupt: raised, the spare left as it was found,
        # never a leased descriptor left open: the next open of the file would wait
        # for its release)
        if leased and lease is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, lease, fcntl.F_UNLCK)
        if name:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.lstat(name), os.fstat(fd)):
                    os.rename(name, spare)
        os.close(fd)
        if isinstance(exc, OSError):
            return None
        raise
    return name, fd


def keep_spare(path: str) -> bool:
    """On rank 0, before the rename that replaces ``path``: give the file there a second
    name, the spare's, so the rename frees nothing and the next save reuses its blocks
    (:func:`claim_spare`); whether it did.  Only a regular file that has no other name
    is kept (a file linked elsewhere is not freed by the rename anyway, and is not the
    save's to overwrite; an atomic write to a symlink replaces the file it names, which
    is kept as any).  A spare already there (a save that
    did not take it) is replaced, freed in a thread of its own (:func:`release_later`);
    where the file system has no hard links, nothing is kept and the caller frees the
    old file as without the hint.  Nor where it would hold a second checkpoint's
    space for nothing (:func:`keepable`)."""
    if not keepable(path):
        return False
    spare = spare_name(path)
    try:
        os.link(path, spare, follow_symlinks=False)
        return True
    except FileExistsError:
        pass
    except OSError:
        return False
    fresh = _temporary_name(path)  # (left by a killed job: reclaimed as its temporaries are)
    try:
        os.link(path, fresh, follow_symlinks=False)
    except OSError:
        return False
    old = hold(spare)
    try:
        os.replace(fresh, spare)
    except OSError:
        unlink_quietly(fresh)
        if old >= 0:
            os.close(old)
        return False
    # (gone, unless another job's commit made the spare this very file meanwhile: a
    # rename between two names of one file does nothing, and this name would stay)
    unlink_quietly(fresh)
    release_later(old)
    return True


#: The file systems where a save writing into a spare's blocks frees and allocates none:
#: a local disk's, overwritten in place.  Not a parallel or network file system (no
#: save claims a spare there: :func:`claim_spare`), not tmpfs or ramfs (the spare would
#: be a second checkpoint held in memory), not copy-on-write or log-structured ones
#: (btrfs, zfs, bcachefs, f2fs: an overwrite allocates new blocks all the same).
REUSED_FS = frozenset({"ext2/3/4", "xfs"})


def keepable(path: str) -> bool:
    """Whether the file at ``path``, about to be replaced, would be kept as its spare
    (:func:`keep_spare`): a regular file with no other name (a symlink's target or a
    file linked elsewhere is not freed by the rename anyway, and is not the save's to
    overwrite), on a file system of :data:`REUSED_FS`, with Linux's leases (no save
    could claim it without)."""
    if _LEASE is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | _NONBLOCK | _CLOEXEC)
    except OSError:
        return False
    try:
        return _reusable(fd, os.fstat(fd))
    finally:
        os.close(fd)


def _reusable(fd: int, st: os.stat_result) -> bool:
    """Whether the file open as ``fd`` (``st`` its ``fstat``) may be, or become, a spare:
    a regular file with one name, on a file system of :data:`REUSED_FS`."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and fs_name(fd) in REUSED_FS


def drop_spare(path: str, now: bool) -> None:
    """On rank 0: remove a spare a save with ``free_replaced=reuse`` kept beside ``path``
    (a commit without the hint: nothing will reuse it), freed as the replaced file is
    (``now``, or in a thread of its own)."""
    spare = spare_name(path)
    try:
        if not stat.S_ISREG(os.lstat(spare).st_mode):
            return
    except OSError:
        return
    old = hold(spare)
    unlink_quietly(spare)
    if now and old >= 0:
        os.close(old)
    else:
        release_later(old)


def _directory_of(name: str) -> int:
    """A descriptor of the directory holding ``name`` (-1 where none can be opened)."""
    try:
        return os.open(os.path.dirname(name), os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except (OSError, AttributeError):  # (no O_DIRECTORY on the platform)
        return -1


def finish_temporary(fd: int, before: os.stat_result | None) -> None:
    """Before the rename: give the temporary the mode (and, where allowed, the owner) of
    the file it replaces, or a new file's mode when there was none."""
    if before is None:
        os.fchmod(fd, new_mode())
        return
    os.fchmod(fd, stat.S_IMODE(before.st_mode))
    for uid, gid in ((before.st_uid, before.st_gid), (-1, before.st_gid)):
        try:
            os.fchown(fd, uid, gid)
            return
        except OSError:  # (only root may give a file away; a member may keep the group)
            continue


def reclaim(path: str, keep: str | None = None) -> list[str]:
    """On rank 0: remove the temporaries of earlier atomic writes to ``path`` whose jobs
    are gone; returns their names.  ``keep`` (this job's own) is never touched."""
    d, pattern = temporary_pattern(path)
    gone = []
    for name in glob.glob(os.path.join(d, pattern)):
        if name != keep and _remove_if_stale(name):
            gone.append(name)
    return gone


def _remove_if_stale(name: str) -> bool:
    """Remove ``name`` if no live job owns it (the check and the removal under its lock)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False  # a live job holds it
            locked = False
        if not _owner_gone(name, st, locked):
            return False
        _unlink(name)
        return True
    finally:
        os.close(fd)


def _owner_gone(name: str, st: os.stat_result, locked: bool) -> bool:
    """Whether the job that made ``name`` has ended: on this host, its process is gone;
    on another host, its lock was free (and it is not brand new: its creator may not
    have taken the lock yet) or, without locks, it has not changed for a day."""
    m = re.search(r"\.collio-(.+)-(\d+)-[0-9a-f]{8}\.tmp$", name)
    if m and m.group(1) == _HOST:
        return not _alive(int(m.group(2)))
    age = time.time() - st.st_mtime
    return age > _STALE_AGE or (locked and age > 60.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (someone else's process)
    return True


def _unlink(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)


def forget_cached(path: str, part: int = 0, parts: int = 1) -> None:
    """Drop the page cache of share ``part`` of ``parts`` (equal byte ranges, cut at
    pages: the kernel drops whole pages only) of the regular file at `path`; anything in
    the way is left as it is (a hint)."""
    try:
        fd = open_regular(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except (OSError, BackendError):
        return
    try:
        size = os.fstat(fd).st_size
        lo, hi = (size * k // parts // PAGE * PAGE for k in (part, part + 1))
        if part == parts - 1:
            os.posix_fadvise(fd, lo, 0, os.POSIX_FADV_DONTNEED)  # (to the end)
        elif hi > lo:
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):  # (no posix_fadvise on the platform)
        pass
    finally:
        os.close(fd)


@dataclasses.dataclass(slots=True)
class Prepared:
    """What rank 0 made at open: the name every rank opens; with ``atomic_commit`` the
    temporary's locked descriptor (held until commit or removal) and the target's
    ``stat`` before (its mode and owner go to the temporary at commit)."""

    name: str
    lock: int
    before: os.stat_result | None
    #: a descriptor of the temporary's directory (-1: none): the temporary is removed
    #: through it, where it is even if its directory was moved or replaced since
    home: int = -1
    #: whether the temporary is a claimed spare (:func:`claim_spare`): it holds the
    #: bytes of an older save until the writer truncates it and zeroes what it leaves
    reused: bool = False

    def release(self) -> None:
        """Let go of the temporary's lock (closing its descriptor)."""
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1
        if self.home >= 0:
            os.close(self.home)
            self.home = -1

    def remove(self) -> None:
        """Remove the temporary (quietly: it may be gone already)."""
        if self.home < 0:
            unlink_quietly(self.name)
            return
        with contextlib.suppress(OSError):
            os.unlink(os.path.basename(self.name), dir_fd=self.home)

    def drop(self, atomic: bool) -> None:
        """After a failed open: remove the temporary (rank 0 made it) and release it."""
        if atomic and self.lock >= 0:
            self.remove()
        self.release()


def prepare(
    path: str, mode: str, atomic: bool, create: bool | str = False, reuse: bool = False
) -> Prepared:
    """On rank 0: check the target is a regular file (or absent, in 'w' or with
    ``create``), then create it, or make the temporary of an atomic write (a copy of it in
    'r+'; with ``reuse``, in 'w', the spare where there is one).  A file that exists is
    not truncated here, in 'w': only once every rank opened it (:func:`truncate_opened`)."""
    before = check_target(path, "w" if create else mode)
    if create and (before is None or create == "exclusive"):
        excl = os.O_EXCL if create == "exclusive" else 0
        os.close(open_regular(path, os.O_CREAT | os.O_RDWR | excl))
        before = os.stat(path)
    if not atomic:
        if mode == "w":
            os.close(open_regular(path, os.O_CREAT | os.O_RDWR))
        return Prepared(path, -1, before)
    with contextlib.suppress(OSError):  # (dead jobs' leftovers: never this open's error)
        reclaim(path)
    claimed = claim_spare(path) if reuse and mode == "w" else None
    try:
        name, lock = claimed or make_temporary(path)
    except OSError as exc:  # (named by the target: the temporary's name is collio's own)
        where = os.path.dirname(os.path.abspath(path))
        raise BackendError(
            f"cannot create the temporary of {path!r} (atomic_commit) in {where!r}: "
            f"{(exc.strerror or str(exc)).lower()}",
            errno=exc.errno,
        ) from None
    made = Prepared(name, lock, before, _directory_of(name), reused=claimed is not None)
    if mode == "r+":
        try:
            with open(path, "rb") as src, open(name, "r+b") as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
        except OSError as exc:
            made.drop(True)
            raise BackendError(
                f"atomic_commit: copying {path!r} to its temporary {name!r} failed: "
                f"{exc.strerror or exc}; the temporary is removed, {path!r} is unchanged",
                errno=exc.errno,
            ) from exc
        except BaseException:
            made.drop(True)
            raise
    return made


def truncate_opened(comm: Any, fd: int, size: int, path: str) -> None:
    """Collective over `comm`, once every rank opened the target of a 'w' open as ``fd``
    (agreed): rank 0 empties it, which the open's create did not, so that an open that
    fails on some rank (its permissions, its limit on descriptors) leaves the file as it
    was, as ROMIO's does.  ``size`` is what rank 0 found there (broadcast): an empty or
    new file needs nothing, and no agreement."""
    if size <= 0:
        return
    step = Attempt()
    if comm.Get_rank() == 0:
        with step:
            os.ftruncate(fd, 0)
    agree(comm, step.error, what=f"open {path!r}")


def hold(path: str) -> int:
    """A descriptor of the file at ``path`` (-1: none), held across its replacement.
    Whatever stands there now is opened without blocking (a FIFO put at the target
    since the open would wait for a writer: every rank would wait in the commit)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return -1


def release_later(fd: int) -> None:
    """Close ``fd`` in a thread of its own: the replaced file's blocks are freed there.

    A rename over a large file frees its blocks inside the rename (tens of ms for a
    few hundred MiB on ext4), while every rank waits for the commit; held open
    across the rename, the old file is freed by the last close instead, which then
    runs beside the job.  (The process's exit closes it at the latest.)
    """
    if fd >= 0:
        threading.Thread(target=os.close, args=(fd,), name="collio-free", daemon=True).start()


def unlink_quietly(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
