"""zarr I/O for :mod:`collio.backends.zarr`: many regions at once on zarr's event loop.

Each region assignment or read goes through zarr's public ``AsyncArray`` API (its
indexer, codec pipeline, store), at most ``limit`` at a time, all submitted to
zarr's own event loop with ``zarr.core.sync.sync``, the call zarr's synchronous
API uses itself: it is thread-safe, so collio's I/O thread and the main thread may
both use it (they never touch the same chunk).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import numpy as np
from zarr.core.sync import sync as zarr_sync

from ...errors import BackendError

__all__ = ["load_regions", "store_regions"]

Region = tuple[slice, ...]


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        zarr_sync(coro)
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # zarr and stores raise ValueError & co. for I/O failures
        raise BackendError(f"zarr: {type(exc).__name__}: {exc}") from exc


def store_regions(
    array: Any, regions: list[Region], values: list[np.ndarray[Any, Any]], limit: int
) -> None:
    """Assign ``array[regions[i]] = values[i]`` through zarr (its codecs), concurrently."""

    async def all_of() -> None:
        sem = asyncio.Semaphore(limit)
        target = array.async_array

        async def one(region: Region, value: np.ndarray[Any, Any]) -> None:
            async with sem:
                await target.setitem(region, value)

        await asyncio.gather(*(one(r, v) for r, v in zip(regions, values, strict=True)))

    _run(all_of())


def load_regions(
    array: Any, regions: list[Region], dests: list[np.ndarray[Any, Any]], limit: int
) -> None:
    """Fill ``dests[i]`` with ``array[regions[i]]`` through zarr, concurrently."""

    async def all_of() -> None:
        sem = asyncio.Semaphore(limit)
        source = array.async_array

        async def one(region: Region, dest: np.ndarray[Any, Any]) -> None:
            async with sem:
                got = await source.getitem(region)
            dest[...] = np.asarray(got)

        await asyncio.gather(*(one(r, d) for r, d in zip(regions, dests, strict=True)))

    _run(all_of())
