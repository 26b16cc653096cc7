"""Agreement on errors: no rank raises alone inside a collective call.

The pattern: run the local step inside :class:`Attempt`, then call :func:`agree`.
``agree`` is an allreduce of one flag (cheap, O(log p)); only when some rank failed
are the messages gathered, and then every rank raises the same
:class:`~collio.errors.CollioError` subclass naming the failing ranks.  Because
every rank makes the same sequence of collective calls whatever happened locally,
nothing hangs and the communicator stays usable.
"""

from __future__ import annotations

import hashlib
import struct
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import numpy as np
from mpi4py import MPI

from .errors import MismatchError, classify, make_error, shows_credentials, stand_in
from .facts import UNSET, Facts, How, agreed_equal, equal_slots, fact, record
from .waits import sleep_until_done

__all__ = [
    "CALLS",
    "Attempt",
    "HeadOp",
    "KeptHead",
    "agree",
    "agree_facts",
    "agree_same",
    "any_flag",
    "bcast_outcome",
    "call_head",
    "call_kept_head",
    "detached",
    "digest",
    "drop_head_op",
    "keep_head_op",
    "kept",
    "raise_agreed",
    "raise_kept_mismatch",
    "same_slots",
    "settle_same",
]


class Attempt:
    """Context manager that records (instead of raising) an exception on this rank.

    >>> with Attempt() as step:
    ...     risky()
    >>> agree(comm, step.error)
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> bool:
        if exc is None or not kept(exc):
            return False
        if self.error is None:
            self.error = exc
        return True

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` unless an earlier error is already recorded."""
        if self.error is None:
            self.error = exc


def kept(exc: BaseException) -> bool:
    """Whether :class:`Attempt` records ``exc`` (an interrupt or an exit goes on up)."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit))


def agree(comm: MPI.Comm, error: BaseException | None, *, what: str = "") -> None:
    """Collective over `comm`: raise the same error on every rank if any rank failed.

    Parameters
    ----------
    comm
        The communicator all ranks of the call share.
    error
        This rank's exception, or None.
    what
        A short phrase naming the step, put in front of the message.
    """
    if any_flag(comm, error is not None):
        raise_agreed(comm, error, what=what)


_NONE = np.int64(UNSET)

F = TypeVar("F", bound=Facts)


def agree_facts(comm: MPI.Comm, mine: F) -> F:
    """Collective over `comm`: one allreduce (MAX) of every rank's :class:`~collio.facts.Facts`
    record; returns the agreed record (same type)."""
    vec = mine.to_array()
    out = np.empty_like(vec)
    comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
    agreed: F = type(mine).agreed(out)
    return agreed


def digest(value: Any) -> int:
    """A 56-bit hash of ``repr(value)`` (the same on every rank for equal values); -1 for None."""
    if value is None:
        return -1
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=7).digest(), "little")


def agree_same(
    comm: MPI.Comm, error: BaseException | None, value: Any, *, what: str, describe: Any = repr
) -> None:
    """Collective over `comm`: one allreduce agrees on errors and on ``value`` being equal.

    Ranks passing ``value`` None (they failed) are not compared.  On a mismatch
    (rare: then rank 0's value is broadcast) every rank raises the same
    :class:`~collio.errors.MismatchError`, naming the ranks whose value differs
    from rank 0's.
    """
    agreed = agree_facts(comm, _Same(failed=error is not None, value=digest(value)))
    if agreed.failed:
        raise_agreed(comm, error, what=what)
    if agreed.value is None:
        _check_against_root(comm, value, what=what, describe=describe)


@record
class _Same(Facts):
    failed: bool = fact(How.ANY)
    value: int | None = fact(How.EQUAL)  # digest(value); None: two ranks' values differ


def same_slots(value: Any) -> tuple[int, int]:
    """Two int64 slots that, reduced with MAX, tell whether every rank has an equal ``value``.

    The :func:`digest` and its negation (ranks passing None: neither, so not compared).
    """
    h = digest(value)
    return equal_slots(h)


def settle_same(
    comm: MPI.Comm, value: Any, maxima: Any, *, what: str, describe: Any = repr
) -> None:
    """Collective over `comm`: after an allreduce (MAX) of :func:`same_slots`, given its
    ``maxima``, raise the same :class:`~collio.errors.MismatchError` on every rank if
    the values differ (see :func:`agree_same`); return at once if they do not."""
    if agreed_equal(int(maxima[0]), int(maxima[1])) is None:
        _check_against_root(comm, value, what=what, describe=describe)


def _check_against_root(comm: MPI.Comm, value: Any, *, what: str, describe: Any) -> None:
    """Collective over `comm`, once the ranks know their values' digests differ: compare
    with rank 0's value and raise the same error on every rank, naming those whose value
    differs (none may: equal values can print differently)."""
    ref = comm.bcast(value, root=0)
    mine = None
    if value is not None and ref is not None and value != ref:
        mine = make_error(
            "MismatchError", f"{describe(value)} differs from rank 0's {describe(ref)}"
        )
    # equal values may print differently (np.int64(2) and 2): then nobody differs
    agree(comm, mine, what=what)


#: The collective calls of a file, numbered in the code that each one's first agreement
#: carries (:func:`call_head`); ``flush`` is :mod:`collio.h5`'s.
#: ``write_at_all``/``read_at_all`` have codes of their own, as MPI's are calls of their
#: own: messages name the call made, and one rank's beside another's ``write_all`` is a
#: mismatch (an error at a rank names its own call: the calls must be one for it to be agreed).
CALLS = (
    "write_all", "read_all", "sync", "close", "set_view", "open", "flush",
    "write_all_many", "read_all_many", "write_at_all", "read_at_all",
)  # fmt: skip
#: int64 slots of that agreement: error flag, call code and its negation, the call's own.
HEAD_SLOTS = 26
_OWN = 3
_PAD = (int(_NONE),) * (HEAD_SLOTS - _OWN)  # unused slots of a call's own
_HEAD = struct.Struct(f"={HEAD_SLOTS}q")
_MAX = MPI.MAX
_CODES = 16  # codes per file: more than len(CALLS)


class HeadOp:
    """The operation every head on one communicator is (:func:`call_head`): a persistent
    allreduce (MAX) of :data:`HEAD_SLOTS` int64 (MPI-4's ``MPI_Allreduce_init``), set up
    once and started by every head, whatever the call, so that ranks making different
    calls still meet in it.  A started head costs neither a request's setup nor its
    arguments' parsing, which on a small call are a good part of its one agreement.

    Made on collio's own duplicates (:func:`keep_head_op`), whose collective calls are
    all collio's: every head on such a communicator starts it, on every rank alike.
    Its buffers are the last head's until the next one starts.

    A head interrupted while it waits (``KeyboardInterrupt`` in a sleeping wait) leaves
    the operation started: ``live``, completed by the next head before it starts it
    again (the other ranks took part in it, so it completes), where starting an
    active request would fail on this rank alone and leave the others waiting."""

    __slots__ = ("req", "send", "slots", "recv", "got", "live")

    def __init__(self, comm: MPI.Comm) -> None:
        self.live = False
        self.send = bytearray(_HEAD.size)
        self.slots = memoryview(self.send).cast("q")
        self.recv = bytearray(_HEAD.size)
        self.got = memoryview(self.recv).cast("q")
        self.req = comm.Allreduce_init(
            [self.send, MPI.INT64_T], [self.recv, MPI.INT64_T], op=_MAX
        )  # fmt: skip

    def start(self) -> MPI.Prequest:
        """Start the operation (first completing one an interrupted head left started)."""
        req = self.req
        if self.live:
            req.Wait()
        self.live = True
        req.Start()
        return req

    def wait(self, patient: bool) -> None:
        """Complete the started operation; ``live`` stays set where this is interrupted."""
        if patient:
            sleep_until_done(self.req)
        else:
            self.req.Wait()
        self.live = False


#: The head operations of collio's duplicates, by their handle (``py2f``)
_HEAD_OPS: dict[int, HeadOp] = {}


def keep_head_op(comm: MPI.Comm) -> bool:
    """Collective over `comm` (a duplicate of collio's, just made): set up its
    :class:`HeadOp`, which its heads start from now on; whether it did.  Where MPI has
    no persistent collectives (before MPI-4), or any rank failed to set one up, none is
    kept on any rank.  Then the communicator must not be used for collectives: a rank
    that failed before its set-up is one collective behind the others on it (MPI orders
    a persistent collective's set-up as a collective); the caller takes another
    duplicate, whose heads are nonblocking allreduces as on any communicator."""
    op: HeadOp | None = None
    try:
        op = HeadOp(comm)
    except Exception:  # noqa: BLE001 - no MPI-4 persistent collectives: the heads as before
        op = None
    if any_flag(comm, op is None):
        if op is not None:
            op.req.Free()
        return False
    assert op is not None
    _HEAD_OPS[comm.py2f()] = op
    return True


def drop_head_op(comm: MPI.Comm) -> None:
    """Local: free `comm`'s :class:`HeadOp` (before the communicator is freed, so that
    its handle, given to another communicator, names no operation)."""
    op = _HEAD_OPS.pop(comm.py2f(), None)
    if op is not None and not op.live:  # (an active one is not freed: MPI forbids it)
        op.req.Free()


_SUBJECT = 1 << 57  # set in the code of a call on a part of a file: never a plain code


def call_head(
    comm: MPI.Comm,
    call: str,
    file: tuple[int, str],
    failed: bool,
    own: Sequence[int] = (),
    *,
    patient: bool = False,
    subject: str | None = None,
    extra: Any = None,
    undo: Callable[[MismatchError], None] | None = None,
) -> tuple[bool, tuple[int, ...]]:
    """Collective over `comm`: the first operation of every collective call on a file.

    Always one allreduce (MAX) of :data:`HEAD_SLOTS` int64 (the communicator's
    :class:`HeadOp` where it has one, else an ``Iallreduce``): this rank's error flag;
    a code naming ``call`` (one of :data:`CALLS`) and ``file`` (its serial number on the
    communicator, agreed at open, and its name for messages), then the code negated, so
    that the two maxima differ unless every rank passed the same code; then up to
    ``HEAD_SLOTS - 3`` slots of the call's own (more would make this rank's allreduce
    longer than the others': refused).  Since every call starts with the same operation,
    ranks that make different calls meet in it (rather than in operations that never match: a
    blocking and a nonblocking allreduce, or two of different lengths) and learn of it
    before any other step; every rank then raises the same
    :class:`~collio.errors.MismatchError` (``call_mismatch``) after one allgather of the
    calls.  ``patient`` waits sleeping (see :func:`any_flag`), else polling as MPI does.
    ``subject`` names the part of the file the call is on (``"dataset '/x'"``): it goes
    into the code (then a :func:`digest` of it with the call and the file) and into the
    message, so a write of one dataset beside a write of another is a mismatch too.
    ``extra`` travels in the mismatch's allgather: the error's ``extras`` holds every
    rank's, and ``undo(error)`` runs before any rank raises (a call that wrote before this
    agreement takes it back, while no rank can have gone on to its next call).

    Returns whether any rank failed, and the maxima of the call's own slots.
    """
    code = _code(call, file, subject)
    n = len(own)
    if n > HEAD_SLOTS - _OWN:  # (a call's facts outgrew the head: a bug, not input)
        raise AssertionError(f"{call}: {n} slots of its own, at most {HEAD_SLOTS - _OWN}")
    # (packed and unpacked by struct: every call's head, small calls too, where numpy's
    # conversions of a few dozen ints cost as much as the allreduce)
    vec = _HEAD.pack(1 if failed else 0, code, -code, *own, *_PAD[n:])
    op = _HEAD_OPS.get(comm.py2f())
    if op is None:
        got = bytearray(_HEAD.size)
        req = comm.Iallreduce([vec, MPI.INT64_T], [got, MPI.INT64_T], op=MPI.MAX)
        if patient:
            sleep_until_done(req)
        else:
            req.Wait()
    else:
        op.send[:] = vec
        got = op.recv
        op.start()
        op.wait(patient)
    out = _HEAD.unpack(got)
    if out[1] != -out[2]:
        _raise_call_mismatch(comm, call, file, subject, extra, undo)
    return out[0] != 0, out[_OWN:]


def _code(call: str, file: tuple[int, str], subject: str | None) -> int:
    """The code of ``call`` on ``file`` (and ``subject``) that its head carries."""
    code = file[0] * _CODES + CALLS.index(call) + 1
    return code if subject is None else _SUBJECT | digest((code, subject))


class KeptHead:
    """The head of a call kept for its repeats (:func:`call_kept_head`): its slots in
    one buffer, the call's own slots writable in place (``own``, int64), so that a
    repeat writes the few facts that change instead of packing every slot again; and
    the buffers of the agreement, made once (the maxima overwrite those of the last
    head on the communicator: its :class:`HeadOp`'s, where it has one)."""

    __slots__ = (
        "call", "file", "buf", "slots", "own", "send", "recv", "got", "got_own", "op",
    )  # fmt: skip

    def __init__(self, call: str, file: tuple[int, str], own: Sequence[int],
                 comm: MPI.Comm) -> None:  # fmt: skip
        code = _code(call, file, None)
        self.call, self.file = call, file
        self.buf = bytearray(_HEAD.pack(0, code, -code, *own, *_PAD[len(own) :]))
        self.slots = memoryview(self.buf).cast("q")
        self.own = self.slots[_OWN:]
        #: the communicator's head operation (None: a nonblocking allreduce per head),
        #: whose buffers this head's slots are copied into and its maxima read from
        self.op = _HEAD_OPS.get(comm.py2f())
        got = bytearray(_HEAD.size) if self.op is None else self.op.recv
        self.send, self.recv = [self.buf, MPI.INT64_T], [got, MPI.INT64_T]
        self.got = memoryview(got).cast("q")
        self.got_own = self.got[_OWN:]

    def agree(self, comm: MPI.Comm) -> None:
        """Collective over `comm` (the head's): the allreduce of the slots as they are
        now (the maxima in :attr:`got`)."""
        op = self.op
        if op is None:
            comm.Iallreduce(self.send, self.recv, op=_MAX).Wait()
            return
        op.slots[:] = self.slots
        op.start()
        op.wait(False)


def call_kept_head(
    comm: MPI.Comm, head: KeptHead, failed: bool, *, extra: Any = None,
    undo: Callable[[MismatchError], None] | None = None,
) -> tuple[bool, memoryview]:  # fmt: skip
    """Collective over `comm`: :func:`call_head` of ``head``'s call with its own slots as
    they are now.  The maxima of the own slots come back as an int64 memoryview, valid
    until the next head on `comm` (the communicator's :class:`HeadOp` holds them)."""
    head.slots[0] = 1 if failed else 0
    head.agree(comm)
    out = head.got
    if out[1] != -out[2]:
        _raise_call_mismatch(comm, head.call, head.file, None, extra, undo)
    return out[0] != 0, head.got_own


def raise_kept_mismatch(
    comm: MPI.Comm, head: KeptHead, extra: Any, undo: Callable[[MismatchError], None] | None
) -> NoReturn:
    """Collective over `comm`: :func:`call_kept_head`'s error, when its maxima found that
    the ranks made other calls (a caller that reduced ``head``'s slots itself)."""
    _raise_call_mismatch(comm, head.call, head.file, None, extra, undo)


def _raise_call_mismatch(
    comm: MPI.Comm, call: str, file: tuple[int, str], subject: str | None, extra: Any,
    undo: Callable[[MismatchError], None] | None,
) -> NoReturn:  # fmt: skip
    """Collective over `comm`: every rank raises the same error naming each rank's call,
    after every rank's ``undo`` of it (then a barrier: no rank goes on to its next call
    while another still takes back what its call did)."""
    gathered = comm.allgather((call, file, subject, extra))
    every = [g[:3] for g in gathered]
    one_file = len({f[0] for _, f, _ in every}) == 1
    names = [_name(c, f[1], s, one_file) for c, f, s in every]
    keys = [(c, f[0], s) for c, f, s in every]
    bad = [r for r, k in enumerate(keys) if k != keys[0]]
    shown = ", ".join(f"rank {r}: {names[r]}" for r in bad[:8])
    if len(bad) > 8:
        shown += f", and {len(bad) - 8} more ranks"
    what = "different collective operations" if one_file else "operations on different files"
    err = MismatchError(
        f"ranks called {what}: rank 0 {names[0]}; {shown} (every rank must make the same call)",
        ranks=tuple(bad),
    )
    err.call_mismatch = True
    err.calls = tuple(c for c, _, _ in every)
    err.one_file = one_file
    err.extras = tuple((f[0], g[3]) for (_, f, _), g in zip(every, gathered, strict=True))
    if undo is not None:
        undo(err)  # (local; it keeps its own failure)
    comm.Barrier()
    try:
        raise err
    finally:  # (the traceback holds this frame: a cycle through ``err`` otherwise)
        del err


def _name(call: str, file: str, subject: str | None, one_file: bool) -> str:
    """``write_all``, ``write_all of dataset '/x'``; on different files ``sync of 'a.bin'``,
    ``write_all of dataset '/x' in 'a.h5'``."""
    name = call if subject is None else f"{call} of {subject}"
    if one_file:
        return name
    return f"{name} of {file}" if subject is None else f"{name} in {file}"


def bcast_outcome(
    comm: MPI.Comm, value: Any, error: BaseException | None, *, root: int = 0, what: str = ""
) -> Any:
    """Collective over `comm`: broadcast the root's result, or raise its error everywhere.

    For steps only the root performs (create a file, start an upload): one
    broadcast replaces a broadcast plus an agreement.
    """
    packed = comm.bcast(("ok", value) if error is None else ("error", classify(error)), root=root)
    if packed[0] == "ok":
        return packed[1]
    name, msg, errno = packed[1]
    text = f"rank {root}: {msg}"
    if what:
        text = f"{what}: {text}"
    raise make_error(name, text, ranks=(root,), errno=errno) from detached(error)


def raise_agreed(comm: MPI.Comm, error: BaseException | None, *, what: str = "") -> None:
    """Collective over `comm`: gather every rank's error and raise the combined one.

    Call only when every rank knows that some rank failed (e.g. after a flag
    allreduce).  The class is the one of the lowest failing rank.
    """
    mine: tuple[str, str, int | None] | None = None
    if error is not None:
        mine = classify(error)
    infos: list[Any] = comm.allgather(mine)
    failed = [(rank, info) for rank, info in enumerate(infos) if info is not None]
    if not failed:  # pragma: no cover - caller promised a failure
        failed = [(-1, ("CollioError", "unknown failure on another rank", None))]
    first_name, _, first_errno = failed[0][1]
    shown = failed[:8]
    text = "; ".join(f"rank {rank}: {msg}" for rank, (_, msg, _) in shown)
    if len(failed) > len(shown):
        text += f"; and {len(failed) - len(shown)} more ranks"
    if what:
        text = f"{what}: {text}"
    exc = make_error(first_name, text, ranks=tuple(r for r, _ in failed), errno=first_errno)
    try:
        raise exc from detached(error)
    finally:  # (the traceback holds this frame: a cycle through ``exc`` otherwise)
        del exc, error


def detached(error: BaseException | None) -> BaseException | None:
    """``error``, and the errors it was raised from inside collio, with their tracebacks
    kept as text (a note, once) instead of frames.

    A rank's error is kept while the ranks agree (:class:`Attempt`): a frame that called
    the failing code holds it, and that frame is in the error's own traceback, through
    the failing frames' callers.  The agreed error raised from it would keep that cycle,
    and with it every array of the call, until a garbage collection finds it.  An error
    caught outside collio (one the caller was handling when it called) is left as it is;
    one caught inside whose text quotes a URL with its credentials (a library's error
    naming an endpoint) is replaced in the chain by a collio one with that text redacted.
    """
    error = _without_credentials(error)
    seen: set[int] = set()
    pending = [error]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if tb is not None and not _ours(tb.tb_frame):
            continue
        if tb is not None:
            if not getattr(e, "_collio_detached", False):
                e.add_note("".join(["Where it was raised (most recent call last):\n",
                                    *traceback.format_tb(tb)]).rstrip())  # fmt: skip
                e._collio_detached = True  # type: ignore[attr-defined]
            e.__traceback__ = None
        e.__cause__ = _without_credentials(e.__cause__)
        e.__context__ = _without_credentials(e.__context__)
        pending += [e.__cause__, e.__context__]
    return error


def _ours(frame: types.FrameType) -> bool:
    """Whether ``frame`` (where an error was caught) is collio's."""
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and (name == "collio" or name.startswith("collio."))


def _without_credentials(e: BaseException | None) -> BaseException | None:
    """``e``, or where collio caught it and its text quotes a URL with user info, a collio
    error of its class with that text redacted, in ``e``'s place in the chain: the agreed
    error is raised from the chain, which a traceback prints."""
    if e is None or not shows_credentials(e):
        return e
    if e.__traceback__ is not None and not _ours(e.__traceback__.tb_frame):
        return e
    new = stand_in(e)
    new.__cause__, new.__context__ = e.__cause__, e.__context__
    new.__suppress_context__ = e.__suppress_context__
    return new


def any_flag(comm: MPI.Comm, flag: bool, *, patient: bool = False) -> bool:
    """Collective over `comm`: True when any rank passes a true ``flag``.

    With ``patient`` the ranks wait for each other in an ``Iallreduce``/``Test`` loop
    that yields the core, then sleeps (:func:`~collio.waits.sleep_until_done`), instead of MPI's
    polling: for waits that may last (fsync, object stores), where a polling rank
    would take a core from the ranks still doing I/O, or from a server on the node.
    """
    mine = np.array([1 if flag else 0], np.int64)
    out = np.zeros(1, np.int64)
    if not patient:  # (a buffer's allreduce: the object one is a reduce and a bcast of pickles)
        comm.Allreduce([mine, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
        return bool(out[0])
    sleep_until_done(comm.Iallreduce([mine, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX))
    return bool(out[0])
