"""The C library collio calls through ctypes."""

from __future__ import annotations

import ctypes
import functools

__all__ = ["libc"]


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library already loaded into this process (no ``ldconfig`` subprocess), or None.

    Made once (``collio.open`` asks for ``fstatfs`` on every file it opens)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
