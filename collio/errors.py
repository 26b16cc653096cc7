"""One error hierarchy, mixed with the built-in exceptions users already catch.

Every error raised by a collective collio call is raised on *every* rank of the
communicator, with the same class and the same message (see
:mod:`collio.collective`).  The message names the ranks that failed and the values
involved, e.g. ``rank 3: region (0, 197)+(256, 64) exceeds global shape (256, 256)``.
"""

from __future__ import annotations

import errno as _errno

from .redact import redact_text, secrets_in


class CollioError(Exception):
    """Base class of every collio error.

    Parameters
    ----------
    message
        Lowercase text that carries the numbers.
    ranks
        The ranks of the communicator where the error happened (empty when
        raised by a single rank before any agreement).
    """

    #: An error of the close that followed this one (the abort of an S3 upload after a
    #: failed write, a close after a call mismatch): this error is the one raised, the
    #: later one rides on it (also in its notes), agreed like it.
    close_error: Exception | None = None

    def __init__(self, message: str, *, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.ranks = tuple(ranks)

    def __reduce__(self) -> tuple[object, ...]:  # keep pickling simple for allgather
        return (_rebuild, (type(self).__name__, self.message, self.ranks, _errno_of(self)))


class LayoutError(CollioError, ValueError):
    """A layout is invalid, or does not match the data or the target."""


class MismatchError(LayoutError):
    """Ranks disagree on something they must share (global shape, dtype, order, mode).

    ``call_mismatch`` is True when the ranks called different collective operations
    (or operations on different files); then ``calls`` holds each rank's call, and
    ``one_file`` says whether all of them were calls on the same file.  When one of
    them was ``close`` the file is closed on every rank (synced, not committed), and
    ``close_error`` holds that close's error, if it failed (agreed: the same on every
    rank), else None.  ``extras`` holds each rank's (file serial, what its call passed
    along: see :func:`collio.collective.call_head`).
    """

    call_mismatch: bool = False
    calls: tuple[str, ...] = ()
    one_file: bool = True
    extras: tuple[tuple[int, object], ...] = ()


class OverlapError(CollioError, ValueError):
    """Two ranks (or one rank twice) write the same byte; MPI leaves it undefined, we refuse.

    ``ranks`` are the ranks writing the overlapping bytes.
    """

    #: (lo, hi, ranks) an aggregator found, before the ranks merge what they found.
    region: tuple[int, int, tuple[int, ...]] | None = None
    #: Every overlapping file range the ranks agreed on, (lo, hi, ranks), alike on every
    #: rank (empty where the error came otherwise).
    regions: list[tuple[int, int, tuple[int, ...]]] = []  # noqa: RUF012 - replaced, never changed


class HintError(CollioError, ValueError):
    """A hint has a value that cannot be used."""


class ModeError(CollioError, ValueError):
    """The operation is not allowed in the mode the file was opened with, or the file is closed."""


class BackendError(CollioError, OSError):
    """The storage failed: the target cannot be opened, written, read or synced.  One with
    ``errno`` ENOENT (no such file, key or object) is a :class:`NotFoundError`, so also a
    ``FileNotFoundError``."""

    def __new__(
        cls, message: str, *, ranks: tuple[int, ...] = (), errno: int | None = None
    ) -> BackendError:
        if cls is BackendError and errno == _errno.ENOENT:
            cls = NotFoundError
        return super().__new__(cls, message)

    def __init__(
        self, message: str, *, ranks: tuple[int, ...] = (), errno: int | None = None
    ) -> None:
        CollioError.__init__(self, message, ranks=ranks)
        self.errno = errno  # type: ignore[assignment]
        self.strerror = _errno.errorcode.get(errno, "") if errno else None  # type: ignore[assignment]

    def __str__(self) -> str:
        return self.message


class NotFoundError(BackendError, FileNotFoundError):
    """A :class:`BackendError` for a target that does not exist (``errno`` ENOENT): a
    job's ``except FileNotFoundError`` (no checkpoint yet: start afresh) catches it."""


class BackendUnavailableError(CollioError, ImportError):
    """An optional backend's dependency is missing; the message says what to install."""


class ConcurrentCallError(CollioError, RuntimeError):
    """A thread made a collective call on a communicator another thread is in a call on.

    Raised at once, on that thread only; the other thread's call goes on.
    """


class CommitError(BackendError):
    """An atomic commit (rename, multipart completion) failed; the previous target is intact."""


class ChecksumError(CollioError, ValueError):
    """Stored bytes differ from what was saved: a checksum fails, or the target is
    truncated or not what it claims.  ``names`` are the arrays whose bytes differ."""

    names: tuple[str, ...] = ()


_CLASSES: dict[str, type[CollioError]] = {
    c.__name__: c
    for c in (
        CollioError,
        LayoutError,
        MismatchError,
        OverlapError,
        HintError,
        ModeError,
        BackendError,
        NotFoundError,
        BackendUnavailableError,
        CommitError,
        ConcurrentCallError,
        ChecksumError,
    )
}


def add_later(exc: BaseException, later: Exception) -> None:
    """Keep ``later`` (the error of a cleanup after ``exc``: closing, aborting) on ``exc``,
    which stays the error raised: the cause, not what failed after it, is the news."""
    if isinstance(exc, CollioError):
        exc.close_error = later
    note = f"then closing failed too: {type(later).__name__}: {later}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def register_error(cls: type[CollioError]) -> type[CollioError]:
    """Make a subclass defined elsewhere (a backend) rebuildable on other ranks."""
    _CLASSES[cls.__name__] = cls
    return cls


def _errno_of(exc: BaseException) -> int | None:
    value = getattr(exc, "errno", None)
    return value if isinstance(value, int) else None


def _rebuild(name: str, message: str, ranks: tuple[int, ...], errno: int | None) -> CollioError:
    return make_error(name, message, ranks=ranks, errno=errno)


def make_error(
    name: str, message: str, *, ranks: tuple[int, ...] = (), errno: int | None = None
) -> CollioError:
    """Build the collio error called ``name`` (falls back to :class:`CollioError`)."""
    cls = _CLASSES.get(name, CollioError)
    if issubclass(cls, BackendError):
        return cls(message, ranks=ranks, errno=errno)
    return cls(message, ranks=ranks)


def classify(exc: BaseException) -> tuple[str, str, int | None]:
    """Name the collio class an arbitrary exception maps to, its text and errno.

    Built-in errors raised by user data or the OS become the nearest collio class:
    ``OSError`` -> :class:`BackendError`, ``ValueError``/``TypeError`` ->
    :class:`LayoutError`, anything else -> :class:`CollioError`.  The text shows no URL's
    credentials (a library's error may quote a URL whole).
    """
    name, text, code = _classify(exc)
    return name, redact_text(text), code


def scrubbed(exc: BaseException | None, *urls: object) -> BaseException | None:
    """``exc``, or, where ``urls`` (the target, an endpoint) carry credentials, a collio
    error of its class whose text hides them, however it quotes them.

    The stand-in keeps ``exc``'s traceback but not ``exc`` itself nor what it was raised
    from: their texts may quote the credentials, and a traceback printed at exit shows them.
    """
    if exc is None or not any(secrets_in(u) for u in urls):
        return exc
    new = stand_in(exc, *urls)
    new.__suppress_context__ = True
    new.add_note("(the original error is not kept: its text may quote credentials)")
    return new


def stand_in(exc: BaseException, *urls: object) -> CollioError:
    """A collio error of ``exc``'s class, ranks, errno and traceback whose text hides every
    URL's credentials (``urls``' however quoted): what is shown in place of ``exc``."""
    name, text, code = classify(exc)
    ranks = exc.ranks if isinstance(exc, CollioError) else ()
    new = make_error(name, redact_text(text, *urls), ranks=ranks, errno=code)
    return new.with_traceback(exc.__traceback__)


def shows_credentials(exc: BaseException) -> bool:
    """Whether ``exc``'s text quotes a URL with its user info."""
    text = _text(exc)
    return redact_text(text) != text


def _classify(exc: BaseException) -> tuple[str, str, int | None]:
    if isinstance(exc, CollioError):
        return type(exc).__name__, exc.message, _errno_of(exc)
    if isinstance(exc, OSError):
        text = exc.strerror or _text(exc)
        text = text[:1].lower() + text[1:]
        if exc.filename is not None:
            text = f"{text}: {exc.filename!r}"
        return "BackendError", text, exc.errno
    if isinstance(exc, (ValueError, TypeError, IndexError)):
        return "LayoutError", f"{type(exc).__name__}: {_text(exc)}", None
    return "CollioError", f"{type(exc).__name__}: {_text(exc)}", None


def _text(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of it where its ``__str__`` fails (this rank's
    text goes into an agreement every rank waits in: it must not raise here alone)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return f"(an error whose text cannot be made: {type(exc).__qualname__})"
