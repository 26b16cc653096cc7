"""The errors of ranks that disagree on a call's arrays or on a batch's number of items."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from .errors import MismatchError

__all__ = ["raise_count_mismatch", "raise_mismatch"]

#: Ranks named in one message; the rest are counted.
_SHOWN = 8


def raise_mismatch(comm: MPI.Comm, sig: Any, call: str = "") -> None:
    """Collective over `comm`: every rank raises the same error naming the differing arrays
    (after ``call``, the call's name, where given).

    ``sig`` is a layout's signature, or a batch's ``("items", signatures)``: then the
    message names the first item whose array differs.
    """
    sigs = comm.allgather(sig)
    ref_rank = next(r for r, s in enumerate(sigs) if s is not None)
    ref = sigs[ref_rank]
    where, describe = "", _describe
    if ref[0] == "items":  # a batch (the counts agreed equal)
        k = next(
            (i for i, one in enumerate(ref[1])
             if any(s is not None and s[1][i] != one for s in sigs)),
            0,
        )  # fmt: skip
        where = f" of item {k}"
        sigs = [None if s is None else s[1][k] for s in sigs]
        ref = sigs[ref_rank]
        if ref is None:  # (a rank with a None signature for item k: compare the others)
            ref_rank = next(r for r, s in enumerate(sigs) if s is not None)
            ref = sigs[ref_rank]
    bad = [r for r, s in enumerate(sigs) if s is not None and s != ref]
    shown = ", ".join(f"rank {r}: {describe(sigs[r])}" for r in bad[:_SHOWN])
    if not bad:  # (the others' arrays agree: the ranks whose item is bytes differ)
        bad = [r for r, s in enumerate(sigs) if s is None]
        shown = ", ".join(
            f"rank {r}: byte runs (Segments or a view), no global array" for r in bad[:_SHOWN]
        )
    if len(bad) > _SHOWN:
        shown += f", and {len(bad) - _SHOWN} more ranks"
    head = f"{call}: " if call else ""
    raise MismatchError(
        f"{head}ranks disagree on the global array{where}: rank {ref_rank} has "
        f"{describe(ref)}; {shown}",
        ranks=tuple(bad),
    )


def _describe(sig: tuple[Any, ...]) -> str:
    _, shape, dtype, order, offset = sig
    return f"global shape {shape} dtype {dtype} order {order} offset {offset}"


def raise_count_mismatch(comm: MPI.Comm, count: int, call: str) -> None:
    """Collective over `comm`: every rank raises the same error naming each rank's count
    of items (``count`` -1: this rank's were no sequence, not compared)."""
    counts: list[int] = comm.allgather(count)
    ref_rank = next(r for r, c in enumerate(counts) if c >= 0)
    bad = [r for r, c in enumerate(counts) if c >= 0 and c != counts[ref_rank]]
    shown = ", ".join(f"rank {r}: {counts[r]}" for r in bad[:_SHOWN])
    if len(bad) > _SHOWN:
        shown += f", and {len(bad) - _SHOWN} more ranks"
    raise MismatchError(
        f"{call}: ranks pass different numbers of items: rank {ref_rank}: "
        f"{counts[ref_rank]}; {shown} (every rank passes one item per array)",
        ranks=tuple(bad),
    )
