"""A library's own errors raised while a backend moves bytes, as collio's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BackendError, CollioError

if TYPE_CHECKING:
    from .base import Backend

__all__ = ["storage_error", "storage_errors"]


class storage_errors:  # noqa: N801 - used as a function: ``with storage_errors(be):``
    """A library's ValueError, TypeError or IndexError raised while ``be`` moves bytes
    (zarr's codecs, h5py, botocore's parameter checks) is the storage failing, not the
    caller's layout: it becomes a :class:`BackendError` naming the backend (the call's
    agreement would otherwise file it as a ``LayoutError``).  A class, not a generator
    context manager: every direct call and every round enters it."""

    __slots__ = ("be",)

    def __init__(self, be: Backend) -> None:
        self.be = be

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is not None:
            got = storage_error(self.be, exc)
            if got is not exc:
                raise got from exc


def storage_error(be: Backend, exc: BaseException) -> BaseException:
    """What :class:`storage_errors` raises for ``exc`` (``exc`` itself, or a
    :class:`BackendError` to raise from it)."""
    if isinstance(exc, (ValueError, TypeError, IndexError)) and not isinstance(exc, CollioError):
        return BackendError(f"{be.name} backend: {type(exc).__name__}: {exc}")
    return exc
