"""Hints with ROMIO's reserved names, from a dict, an ``MPI.Info`` or :class:`Hints`.

Unknown names are reported with a :class:`HintWarning` naming them (never
silently dropped; a near miss of a known name says which one was meant) and kept in
:attr:`Hints.extra`.  ROMIO's own names (:data:`ROMIO_HINTS`) are kept there silently:
the ``mpiio`` backend hands those, and only those, to ROMIO.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import re
import warnings
from collections.abc import Mapping
from typing import Any

from .errors import HintError

__all__ = ["Hints", "HintWarning", "parse_size"]

MiB = 1 << 20
#: Hint names collio understands; everything else is reported.
KNOWN = (
    "cb_nodes",
    "cb_buffer_size",
    "cb_config_list",
    "striping_unit",
    "striping_factor",
    "romio_cb_write",
    "romio_cb_read",
    "atomic_commit",
    "direct_threshold",
    "min_rounds",
    "direct_write",
    "early_flush",
    "mapped_reads",
    "read_past_eof",
    "cb_two_level",
    "cb_local_aggregators",
    "cb_min_message",
    "cb_min_domain",
    "checkpoint_map",
    "free_replaced",
)
#: Names ROMIO reads (what ``MPI.File.Get_info`` lists for a file of MPICH's ROMIO) and
#: the MPI standard's reserved ones: kept in ``extra`` without a warning, and the only
#: extra names the ``mpiio`` backend passes to ROMIO.
ROMIO_HINTS = frozenset(
    (
        "cb_buffer_size", "cb_nodes", "cb_config_list", "romio_cb_read", "romio_cb_write",
        "romio_cb_fr_types", "romio_cb_fr_alignment", "romio_cb_ds_threshold",
        "romio_cb_alltoall", "romio_cb_pfr", "romio_no_indep_rw", "ind_rd_buffer_size",
        "ind_wr_buffer_size", "romio_ds_read", "romio_ds_write", "striping_unit",
        "striping_factor", "start_iodevice", "romio_synchronized_flush",
        "romio_visibility_immediate", "romio_filesystem_type", "romio_aggregator_list",
        "romio_min_fdomain_size", "direct_read", "direct_write", "mpi_memory_alloc_kinds",
        # the MPI standard's reserved names (ROMIO ignores those it does not implement)
        "access_style", "collective_buffering", "cb_block_size", "chunked", "chunked_item",
        "chunked_size", "filename", "file_perm", "io_node_list", "nb_proc", "num_io_nodes",
    )
)  # fmt: skip
#: ROMIO drivers' own families (``romio_lustre_co_ratio``, ``romio_gpfs_...``): ROMIO's too.
ROMIO_FAMILIES = re.compile(r"^(romio_(lustre|gpfs|daos|pvfs2|panfs|bg|quobyte|ime)_|panfs_)")
#: The smallest ``cb_buffer_size`` collio runs rounds with: smaller values are raised to
#: it (and reported in ``f.stats.hints["adjusted"]``).  Rounds of a few bytes would turn
#: a megabyte into a million rounds, each a few messages: a call that never ends.
MIN_BUFFER = 512
#: The largest ``striping_unit``: no file system stripes more coarsely than this (Lustre
#: takes stripes below 4 GiB), and domain boundaries must stay far from 2**63.
MAX_STRIPE = 4 << 30
#: ``cb_min_domain``'s default: a call smaller than this per aggregator takes fewer of
#: them (:func:`~collio.aggregators.active_domains`), as ROMIO's one aggregator per node:
#: below it, each aggregator's messages cost more than its share of the bytes.
MIN_DOMAIN = 1 << 20
_TRI = ("enable", "disable", "automatic")
#: ``free_replaced``'s values.
FREE_REPLACED = ("automatic", "background", "commit", "reuse")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


class HintWarning(UserWarning):
    """A hint was not recognised; it is kept in ``Hints.extra`` but collio does not use it."""


def parse_size(value: Any, name: str = "size") -> int:
    """Parse ``16777216``, ``"16m"``, ``"16MiB"`` or ``"1g"`` into a byte count."""
    if isinstance(value, bool):
        raise HintError(f"hint {name}={value!r} is not a size")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise HintError(f"hint {name}={value!r} is not a size (e.g. 16777216, 16m, 4MiB)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(m.group(1)) * scale


def _parse_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise HintError(f"hint {name}={value!r} is not an integer")
    try:
        return int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise HintError(f"hint {name}={value!r} is not an integer (a count, e.g. 4)") from None


def is_romio_hint(name: str) -> bool:
    """Whether ROMIO reads a hint of this name (:data:`ROMIO_HINTS`, a driver's family)."""
    return name in ROMIO_HINTS or bool(ROMIO_FAMILIES.match(name))


def _unknown_text(names: list[str]) -> str:
    """``cb_bufer_size (did you mean cb_buffer_size?), banana``."""
    every = sorted(set(KNOWN) | ROMIO_HINTS)
    out = []
    for name in sorted(names):
        near = difflib.get_close_matches(name, every, n=1, cutoff=0.8)
        out.append(f"{name} (did you mean {near[0]}?)" if near else name)
    return ", ".join(out)


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "enable", "on"):
        return True
    if text in ("0", "false", "no", "disable", "off"):
        return False
    raise HintError(f"hint {name}={value!r} is not a boolean")


def _parse_tri(value: Any, name: str) -> str:
    text = str(value).strip().lower()
    if text not in _TRI:
        raise HintError(f"hint {name}={value!r} must be one of {', '.join(_TRI)}")
    return text


@dataclasses.dataclass(frozen=True, slots=True)
class Hints:
    """Tuning knobs, ROMIO's names.

    Attributes
    ----------
    cb_nodes
        Number of aggregators; None picks the default (see :mod:`collio.aggregators`).
    cb_buffer_size
        Bytes an aggregator handles per round (16 MiB); its memory stays near twice this.
    cb_config_list
        ``"*:N"`` aggregators per node (``"*:*"`` all ranks); None for the default.
    striping_unit
        File-domain boundaries are multiples of this (the file system's stripe).
    striping_factor
        Stripe count, passed to backends that can set it.
    romio_cb_write, romio_cb_read
        ``enable`` always shuffles, ``disable`` lets each rank do its own I/O,
        ``automatic`` skips the shuffle for large non-interleaved pieces.
    atomic_commit
        Write to a temporary beside the target, made visible only on agreed success.
    direct_threshold
        With ``automatic``: mean run length (bytes) from which the shuffle is skipped.
    min_rounds
        Rounds to cut the largest domain into (8): rounds shrink below
        ``cb_buffer_size`` (not below 1 MiB, 64 KiB per rank of the communicator or
        the backend's ``min_window``) so that the first round's shuffle and the
        last round's write and sync, which nothing overlaps, stay short.  1 gives
        ROMIO's rule, one ``cb_buffer_size`` per round.
    direct_write
        Aggregators write the page-aligned middle of large requests with ``O_DIRECT``.
    early_flush
        While a write call still runs, ``fdatasync`` the file in a background thread
        after each large backend request that another round of the call follows (one
        flush at a time; a call of one round per aggregator starts none), so ``sync()`` and
        ``close()`` find little left to flush (posix and mpiio backends with their
        ``writeback`` option, and contiguous datasets of :mod:`collio.h5`; see
        :class:`~collio.backends.fsync.EarlyFlush`).  On posix, a rank overwriting
        1 MiB or more of the file's bytes (as they were at its open) with its own runs
        in a call (the direct path) also starts their writeback at once
        (``sync_file_range``).  Default true.
    mapped_reads
        ``automatic`` (default): with ``romio_cb_read=automatic``, a read of a posix
        file on a local file system (ext4, xfs, btrfs, tmpfs, ...: one node's page
        cache) skips the shuffle: each rank maps the file and copies its own pieces
        (:mod:`collio.backends.mapped`); reads that skip the shuffle for another
        reason (disjoint extents, ``romio_cb_read=disable``) copy from the map too.
        ``enable`` maps on any file system, ``disable`` never.
    checkpoint_map
        ``automatic`` (default): a checkpoint load of a file on a local file system
        returns each new piece that is one range of the file as an array over a
        private (copy-on-write) map of the file, checksummed from the map, with no
        copy (:mod:`collio.checkpoint.filemap`); ``enable`` maps on any file system,
        ``disable`` reads every piece into a new array.
    free_replaced
        Where the blocks of the file an ``atomic_commit`` replaces are freed (posix; a
        checkpoint save always commits so).  ``automatic`` (default): ``reuse`` for a
        checkpoint save, ``background`` for any other write.  A save into a new file
        makes the file system allocate every block while the job computes, and its
        commit frees the replaced file's as many; reusing them keeps a second
        checkpoint on disk between saves, which every atomic save holds anyway while it
        runs (the old file and the new one), so a target that fits its saves fits its
        spare.  ``background``: rank 0 holds the
        old file open across the rename and closes it in a thread of its own, so the
        commit does not wait for the file system to free it; the freeing (and, on a file
        system mounted with ``discard``, the discards of the next journal commit) then
        runs beside the job, on a spare core if it has one, else on the job's cores,
        whatever runs next.  ``commit``: the commit closes it and syncs the directory
        before it returns, so every rank waits for that work inside the save instead.
        ``reuse`` (checkpoint saves to a file; other writes free as ``background``):
        the replaced checkpoint stays beside the target as ``.NAME.collio-spare`` and
        the next save to the target writes into its blocks (every byte it does not
        write zeroed), unless any process has that file open or mapped: saves then
        free and allocate next to nothing, at the price of a second checkpoint's disk
        space between saves; a save with ``background`` or ``commit`` removes the
        spare.  Only on a local disk's file system that overwrites in place (ext4,
        xfs): elsewhere (a parallel file system, tmpfs, btrfs) no spare is kept, and
        each save writes a new file.
    read_past_eof
        ``enable`` (default): bytes a ``read_all`` asks for past the end of the file read
        as zeros (as bytes no rank wrote do); ``disable``: such a read raises the same
        :class:`~collio.errors.LayoutError` on every rank, naming the ranks that reach past
        the end, before any byte moves.
    cb_two_level
        ``automatic`` (default): a job on several nodes aggregates in two levels when its
        ranks are too many for every aggregator to hear from each of them in every round
        (:func:`~collio.policy.two_level`); ``enable`` whenever there are several nodes,
        ``disable`` never.  Ranks first hand their pieces to a local aggregator on their
        node, which exchanges large messages with the file-domain aggregators.
    cb_local_aggregators
        Local aggregators per node for two-level aggregation (PnetCDF's
        ``nc_num_aggrs_per_node``); None lets collio choose.
    cb_min_message
        Smallest message a two-level round aims for between local and file-domain
        aggregators (64 KiB): its window grows to this times the local aggregators,
        above ``cb_buffer_size`` if need be (at most 1 GiB).  0: windows as one level's.
    cb_min_domain
        Smallest file domain a call cuts (1 MiB; ROMIO's ``romio_min_fdomain_size``): a
        call whose extent is smaller than the aggregators times this uses as many of them
        as it fills (at least one), the others idle, so a small call makes fewer messages.
        0: every aggregator has a domain in every call.
    extra
        ROMIO's hints (passed to ROMIO by the mpiio backend) and unknown ones, as strings.
    adjusted
        Values raised to collio's floor (``cb_buffer_size`` below :data:`MIN_BUFFER`), as
        ``(name, requested)``; ``f.stats.hints["adjusted"]`` shows them.
    """

    cb_nodes: int | None = None
    cb_buffer_size: int = 16 * MiB
    cb_config_list: str | None = None
    striping_unit: int | None = None
    striping_factor: int | None = None
    romio_cb_write: str = "automatic"
    romio_cb_read: str = "automatic"
    atomic_commit: bool = False
    direct_threshold: int = 4 * MiB
    min_rounds: int = 8
    direct_write: bool = False
    early_flush: bool = True
    mapped_reads: str = "automatic"
    read_past_eof: str = "enable"
    cb_two_level: str = "automatic"
    cb_local_aggregators: int | None = None
    cb_min_message: int = 64 << 10
    cb_min_domain: int = MIN_DOMAIN
    checkpoint_map: str = "automatic"
    free_replaced: str = "automatic"
    extra: tuple[tuple[str, str], ...] = ()
    adjusted: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _check_types(self)
        if self.cb_buffer_size < MIN_BUFFER and self.cb_buffer_size >= 1:
            # (ROMIO's hints are advice: a value too small to run is raised, and said so)
            object.__setattr__(self, "adjusted", (("cb_buffer_size", self.cb_buffer_size),))
            object.__setattr__(self, "cb_buffer_size", MIN_BUFFER)
        if self.striping_unit is not None and self.striping_unit > MAX_STRIPE:
            raise HintError(
                f"hint striping_unit={self.striping_unit} is above {MAX_STRIPE} (4 GiB): no "
                "file system stripes that coarsely"
            )
        if self.free_replaced not in FREE_REPLACED:
            raise HintError(
                f"hint free_replaced={self.free_replaced!r} must be automatic, background, "
                "commit or reuse"
            )
        if self.read_past_eof not in ("enable", "disable"):
            raise HintError(f"hint read_past_eof={self.read_past_eof!r} must be enable or disable")
        if self.cb_nodes is not None and self.cb_nodes < 1:
            raise HintError(f"hint cb_nodes={self.cb_nodes} must be >= 1")
        if self.cb_buffer_size < 1:
            raise HintError(f"hint cb_buffer_size={self.cb_buffer_size} must be >= 1")
        if self.cb_min_message < 0:
            raise HintError(f"hint cb_min_message={self.cb_min_message} must be >= 0")
        if self.cb_min_domain < 0:
            raise HintError(f"hint cb_min_domain={self.cb_min_domain} must be >= 0")
        if self.min_rounds < 1:
            raise HintError(f"hint min_rounds={self.min_rounds} must be >= 1")
        if self.striping_unit is not None and self.striping_unit < 1:
            raise HintError(f"hint striping_unit={self.striping_unit} must be >= 1")
        if self.cb_config_list is not None:
            _config_per_node(self.cb_config_list)
        _parse_tri(self.romio_cb_write, "romio_cb_write")
        _parse_tri(self.romio_cb_read, "romio_cb_read")
        _parse_tri(self.cb_two_level, "cb_two_level")
        _parse_tri(self.checkpoint_map, "checkpoint_map")
        if self.cb_local_aggregators is not None and self.cb_local_aggregators < 1:
            raise HintError(f"hint cb_local_aggregators={self.cb_local_aggregators} must be >= 1")

    @classmethod
    def coerce(cls, hints: Any, *, warn: bool = True) -> Hints:
        """Build Hints from None, a dict, an ``MPI.Info`` or Hints (returned as is)."""
        if hints is None:
            return DEFAULT_HINTS
        if isinstance(hints, Hints):
            return hints
        items = _items(hints)
        values: dict[str, Any] = {}
        extra: list[tuple[str, str]] = []
        unknown: list[str] = []
        for key, value in items:
            if key in ("cb_nodes", "striping_factor", "min_rounds", "cb_local_aggregators"):
                values[key] = _parse_int(value, key)
            elif key in (
                "cb_buffer_size",
                "striping_unit",
                "direct_threshold",
                "cb_min_message",
                "cb_min_domain",
            ):
                values[key] = parse_size(value, key)
            elif key == "cb_config_list":
                values[key] = str(value)
            elif key == "free_replaced":
                values[key] = str(value).strip().lower()
            elif key in (
                "romio_cb_write",
                "romio_cb_read",
                "mapped_reads",
                "cb_two_level",
                "checkpoint_map",
            ):
                values[key] = _parse_tri(value, key)
            elif key == "read_past_eof":
                values[key] = "enable" if _parse_bool(value, key) else "disable"
            elif key in ("atomic_commit", "direct_write", "early_flush"):
                values[key] = _parse_bool(value, key)
            else:
                extra.append((key, str(value)))
                if not is_romio_hint(key):
                    unknown.append(key)
        if unknown and warn:
            warnings.warn(
                f"unknown hints ignored by collio: {_unknown_text(unknown)}",
                HintWarning,
                stacklevel=3,
            )
        return cls(**values, extra=tuple(sorted(extra)))

    def replace(self, **changes: Any) -> Hints:
        """A copy with some values changed."""
        return dataclasses.replace(self, **changes)

    def per_node(self) -> int | None:
        """Aggregators per node from ``cb_config_list`` (None: all ranks of the node)."""
        if self.cb_config_list is None:
            return None
        return _config_per_node(self.cb_config_list)

    def as_dict(self) -> dict[str, Any]:
        """The values, ``extra`` flattened in; ``adjusted`` as ``{name: {"requested": r,
        "used": u}}`` when some value was raised."""
        out = {name: getattr(self, name) for name in _VALUES}
        out.update(dict(self.extra))
        if self.adjusted:
            out["adjusted"] = {k: {"requested": v, "used": out[k]} for k, v in self.adjusted}
        return out


#: The fields :meth:`Hints.as_dict` reports as they are (``extra`` and ``adjusted`` aside).
_VALUES = tuple(f.name for f in dataclasses.fields(Hints) if f.name not in ("extra", "adjusted"))

_INTS = ("cb_buffer_size", "direct_threshold", "min_rounds", "cb_min_message", "cb_min_domain")
_OPTIONAL_INTS = ("cb_nodes", "striping_unit", "striping_factor", "cb_local_aggregators")


def _check_types(h: Hints) -> None:
    """Refuse, with collio's own message, values of the wrong type given to ``Hints(...)``
    directly (``Hints.coerce`` parses strings first): ``Hints({...})`` puts a dict into
    ``cb_nodes``, which numpy or a comparison would otherwise report obscurely."""
    first = h.cb_nodes
    if isinstance(first, Mapping) or (first is not None and hasattr(first, "Get_nkeys")):
        raise HintError(
            "Hints() takes keywords (Hints(cb_nodes=4, cb_buffer_size=1 << 20)); for a dict "
            "or an MPI.Info use Hints.coerce(...), or pass it to collio.open(hints=...) as is"
        )
    for name in _INTS + _OPTIONAL_INTS:
        v = getattr(h, name)
        if v is None and name in _OPTIONAL_INTS:
            continue
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            object.__setattr__(h, name, int(v))  # (numpy's integers too, as plain ints)
            continue
        raise HintError(
            f"hint {name}={v!r} must be an int in Hints(...); Hints.coerce parses strings "
            "such as '16m'"
        )


def _items(hints: Any) -> list[tuple[str, Any]]:
    if isinstance(hints, Mapping):
        return [(str(k), v) for k, v in hints.items()]
    get_nkeys = getattr(hints, "Get_nkeys", None)
    if get_nkeys is not None:  # MPI.Info
        keys = [hints.Get_nthkey(i) for i in range(get_nkeys())]
        return [(k, hints.Get(k)) for k in keys]
    raise HintError(
        f"hints must be a dict, an MPI.Info or collio.Hints, not {type(hints).__name__}"
    )


def _config_per_node(text: str) -> int | None:
    m = re.fullmatch(r"\s*\*\s*:\s*(\*|\d+)\s*", text)
    if not m:
        raise HintError(f"hint cb_config_list={text!r}: collio understands '*:N' and '*:*' only")
    if m.group(1) == "*":
        return None
    n = int(m.group(1))
    if n < 1:
        raise HintError(f"hint cb_config_list={text!r}: per-node count must be >= 1")
    return n


#: The defaults, validated once (Hints are frozen: every open without hints shares them).
DEFAULT_HINTS = Hints()
