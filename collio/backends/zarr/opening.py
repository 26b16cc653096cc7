"""Opening a zarr array on every rank: rank 0 creates it (mode ``'w'``) once every rank
agreed on the options; then every rank opens it and the ranks check they opened the same
array.  Every failure raises the same error on every rank."""

from __future__ import annotations

from typing import Any

from ...collective import Attempt, agree, agree_same, raise_agreed
from ...errors import MismatchError, scrubbed
from .spec import OpenSpec, array_facts

__all__ = ["open_array"]


def open_array(
    target: Any, mode: str, *, comm: Any, hints: Any, options: dict[str, Any]
) -> tuple[Any, OpenSpec]:
    """Collective over `comm`: the ``zarr.Array`` (created on rank 0 in mode ``'w'``) and
    the options it was opened with, the same on every rank or an agreed error."""
    step = Attempt()
    spec: OpenSpec | None = None
    ident: tuple[Any, ...] | None = None
    with step:  # (identity() reprs the user's options: a failure is agreed too)
        spec = OpenSpec.parse(target, mode, options, nranks=comm.Get_size(), hints=hints)
        ident = spec.identity()
    if mode == "w":  # (mode is the same on every rank) nothing is created unless all agree
        # on the options too: rank 0 creates (overwrites) with its own
        agree_same(
            comm,
            scrubbed(step.error, target),
            ident,
            what="open zarr array",
            describe=_describe_identity,
        )
        if comm.Get_rank() == 0:
            with step:
                assert spec is not None
                if spec.creates:
                    spec.create()
        agree(comm, scrubbed(step.error, target), what="create zarr array")
    array: Any = None
    facts: tuple[Any, ...] | None = None
    with step:
        if spec is not None and step.error is None:
            array = spec.open()
            facts = (ident, array_facts(array).key())
    # one allgather: who failed, and what each rank opened
    every = comm.allgather(("failed", None) if step.error is not None else ("ok", facts))
    if any(state != "ok" for state, _ in every):
        raise_agreed(comm, scrubbed(step.error, target), what="open zarr array")
    every = [f for _, f in every]
    bad = [r for r, f in enumerate(every) if f != every[0]]
    if bad:  # every rank sees the same list: they all raise

        def show(f: Any) -> str:
            return f"({_describe_identity(f[0])}; shape, dtype, chunks, shards {f[1]})"

        raise MismatchError(
            f"ranks opened different zarr arrays: rank 0 {show(every[0])}; "
            + "; ".join(f"rank {r} {show(every[r])}" for r in bad[:8]),
            ranks=tuple(bad),
        )
    assert spec is not None
    return array, spec


def _describe_identity(ident: Any) -> str:
    where, made, expect, secret = ident
    text = f"zarr target {where}"
    if made:
        text += f", creation options {dict(made)}"
    if expect:
        text += f", expected {dict(expect)}"
    return text + (" (credentials and storage_options not shown)" if secret is not None else "")
