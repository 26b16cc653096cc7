"""The process's helper threads, one per use, made when first asked for."""

from __future__ import annotations

import concurrent.futures
import threading

__all__ = ["flush_executor", "io_executor"]

_lock = threading.Lock()
_executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


def _thread(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The process's single thread ``collio-<name>``, made when first asked for."""
    with _lock:
        pool = _executors.get(name)
        if pool is None:
            pool = _executors[name] = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"collio-{name}"
            )
        return pool


def io_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's single I/O thread: a round's backend request runs there while the
    next round is exchanged (backend calls release the GIL)."""
    return _thread("io")


def flush_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's flush thread: one early ``fdatasync`` at a time, whichever file
    (:class:`~collio.backends.fsync.EarlyFlush`)."""
    return _thread("flush")
