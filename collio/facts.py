"""Facts that travel together in one allreduce, each named once.

Several facts of a collective call (its extent, whether any rank has small runs,
whether every rank found the same kept plan, ...) share one ``MAX`` allreduce of
int64 slots.  A record is a frozen dataclass whose fields are declared with
:func:`fact` and a :class:`How`, the rule that turns the field into slots whose
maxima give the agreed value; :meth:`Facts.slots` packs a rank's record and
:meth:`Facts.agreed` unpacks the maxima into the agreed record.  Adding a fact is
one field.  Pure: no MPI.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

__all__ = ["How", "Facts", "NOT_COMPARED", "UNSET", "agreed_equal", "equal_slots", "fact"]

#: What a field of :data:`How.EQUAL` holds on a rank that has nothing to compare
#: (:func:`collio.collective.digest` of None).
NOT_COMPARED = -1
#: A slot that carries nothing (a value not compared): below every real slot.
UNSET = -(2**62)


class How(enum.Enum):
    """How a field is reduced (every rule is a ``MAX`` over its slots)."""

    #: int: the largest value.
    MAX = "max"
    #: int: the smallest value (its slot is the value negated).
    MIN = "min"
    #: bool: true on some rank.
    ANY = "any"
    #: bool: true on every rank (its slot is the value's negation).
    ALL = "all"
    #: int (two slots, the value and its negation): the value when every rank has
    #: the same one, else None.
    SAME = "same"
    #: int >= 0 (a digest), or :data:`NOT_COMPARED`: like :data:`SAME` among the ranks
    #: that have one; :data:`NOT_COMPARED` when no rank has one.
    EQUAL = "equal"


def fact(how: How) -> Any:
    """A field of a :class:`Facts` record, reduced as ``how`` says."""
    return dataclasses.field(metadata={"how": how})


def equal_slots(v: int) -> tuple[int, int]:
    """The two slots of a :data:`How.EQUAL` value (a digest, or :data:`NOT_COMPARED`)."""
    return (v, -v) if v >= 0 else (UNSET, UNSET)


def _unpack_same(a: int, b: int) -> int | None:
    return a if a == -b else None


def agreed_equal(a: int, b: int) -> int | None:
    """The agreed :data:`How.EQUAL` value from the maxima of its two slots."""
    return NOT_COMPARED if a == UNSET else _unpack_same(a, b)


#: Per rule: the slots' expressions of a value ``{x}``, and the agreed value's from the
#: maxima ``{a}`` (and ``{b}``).
_RULES: dict[How, tuple[str, str]] = {
    How.MAX: ("int({x})", "{a}"),
    How.MIN: ("-int({x})", "-{a}"),
    How.ANY: ("(1 if {x} else 0)", "{a} != 0"),
    How.ALL: ("(0 if {x} else 1)", "{a} == 0"),
    How.SAME: ("int({x}), -int({x})", "_same({a}, {b})"),
    How.EQUAL: ("*_equal_slots(int({x}))", "_agreed_equal({a}, {b})"),
}


class Facts:
    """Base of the records: frozen, slotted dataclasses whose fields are :func:`fact` s.

    Packing and unpacking run in every collective call, so each record's are compiled
    once, on first use, into one expression each (as :mod:`dataclasses` makes
    ``__init__``).
    """

    __slots__ = ()
    _codecs: ClassVar[dict[type, tuple[Any, Any, int]]] = {}

    @classmethod
    def _codec(cls) -> tuple[Any, Any, int]:
        codec = Facts._codecs.get(cls)
        if codec is None:
            codec = Facts._codecs[cls] = _compile(cls)
        return codec

    @classmethod
    def width(cls) -> int:
        """Number of int64 slots of the record."""
        return int(cls._codec()[2])

    def slots(self) -> list[int]:
        """This rank's slots, to be reduced with ``MAX``."""
        out: list[int] = self._codec()[0](self)
        return out

    def to_array(self) -> npt.NDArray[np.int64]:
        """:meth:`slots` as an int64 array (a buffer for ``Allreduce``)."""
        return np.array(self.slots(), np.int64)

    @classmethod
    def agreed(cls, maxima: Sequence[int] | npt.NDArray[np.int64]) -> Self:
        """The agreed record from the maxima of every rank's slots (extra slots ignored)."""
        values = maxima.tolist() if isinstance(maxima, np.ndarray) else list(maxima)
        agreed: Self = cls._codec()[1](cls, values)
        return agreed


def _compile(cls: type) -> tuple[Any, Any, int]:
    """The packer, the unpacker and the width of the record class ``cls``."""
    packs, unpacks, i = [], [], 0
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        how: How = f.metadata["how"]
        pack, unpack = _RULES[how]
        packs.append(pack.format(x=f"self.{f.name}"))
        unpacks.append(unpack.format(a=f"v[{i}]", b=f"v[{i + 1}]"))
        i += 2 if how in (How.SAME, How.EQUAL) else 1
    env = {"_same": _unpack_same, "_equal_slots": equal_slots, "_agreed_equal": agreed_equal}
    src = (
        f"def pack(self):\n    return [{', '.join(packs)}]\n"
        f"def unpack(cls, v):\n    return cls({', '.join(unpacks)})\n"
    )
    exec(compile(src, f"<facts of {cls.__qualname__}>", "exec"), env)  # noqa: S102
    return env["pack"], env["unpack"], i
