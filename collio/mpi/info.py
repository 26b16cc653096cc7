"""``Get_info`` / ``Set_info``: collio's hints under ROMIO's names, as MPI info strings."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..hints import Hints

__all__ = ["hints_info", "retuned"]

#: Hints that only plan later calls: what ``Set_info`` may change on an open file (the
#: rest were settled at open, as ROMIO keeps striping and its driver's choices).
RETUNABLE = (
    "cb_buffer_size", "cb_nodes", "cb_config_list", "romio_cb_read", "romio_cb_write",
    "direct_threshold", "min_rounds", "read_past_eof",
)  # fmt: skip


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def hints_info(hints: Hints, used: dict[str, Any]) -> MPI.Info:
    """A new ``MPI.Info`` (the caller frees it): the values collio uses, ROMIO's names
    first (``cb_nodes`` is the number of aggregators chosen, ``romio_aggregator_list``
    their ranks), then collio's own and the ROMIO hints given at open."""
    items = {
        "cb_buffer_size": hints.cb_buffer_size,
        "romio_cb_read": hints.romio_cb_read,
        "romio_cb_write": hints.romio_cb_write,
        "cb_nodes": used.get("cb_nodes", hints.cb_nodes),
        "cb_config_list": used.get("cb_config_list", hints.cb_config_list),
        "romio_aggregator_list": used.get("aggregator_ranks", []),
    }
    if hints.striping_unit is not None:
        items["striping_unit"] = hints.striping_unit
    if hints.striping_factor is not None:
        items["striping_factor"] = hints.striping_factor
    for name in ("atomic_commit", "direct_threshold", "min_rounds", "direct_write"):
        items[name] = used.get(name, getattr(hints, name))
    for name in ("early_flush", "mapped_reads", "read_past_eof"):
        items[name] = getattr(hints, name)
    items.update(dict(hints.extra))
    info = MPI.Info.Create()
    for key, value in items.items():
        info.Set(key, _text(value))
    return info


def retuned(old: Hints, info: Any, *, warn: bool) -> Hints:
    """``old`` with the planning hints of ``info`` (an ``MPI.Info`` or a dict); others
    in ``info`` are ignored, as MPI lets an implementation ignore hints."""
    given = {} if info is None or info == MPI.INFO_NULL else info
    new = Hints.coerce(given, warn=warn)
    changes = {name: getattr(new, name) for name in RETUNABLE if _given(given, name)}
    extra = dict(old.extra)
    extra.update(dict(new.extra))
    return old.replace(**changes, extra=tuple(sorted(extra.items())))


def _given(info: Any, name: str) -> bool:
    if isinstance(info, dict):
        return name in info
    return name in [info.Get_nthkey(i) for i in range(info.Get_nkeys())]
