"""Facts that travel together in one allreduce, each named once.

Several facts of a collective call (its extent, whether any rank has small runs,
whether every rank found the same kept plan, ...) share one ``MAX`` allreduce of
int64 slots.  A record is a :class:`Facts` subclass made by :func:`record` (a frozen,
slotted dataclass) whose fields are declared with :func:`fact` and a :class:`How`,
the rule that turns the field into slots whose maxima give the agreed value;
:meth:`Facts.slots` packs a rank's record and :meth:`Facts.agreed` unpacks the maxima
into the agreed record.  Adding a fact is one field.  Pure: no MPI.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar, dataclass_transform

import numpy as np
import numpy.typing as npt

__all__ = [
    "How", "Facts", "NOT_COMPARED", "UNSET", "agreed_equal", "equal_slots", "fact", "record",
]  # fmt: skip

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


def agreed_equal(a: int, b: int) -> int | None:
    """The agreed :data:`How.EQUAL` value from the maxima of its two slots."""
    return NOT_COMPARED if a == UNSET else (a if a == -b else None)


#: Per rule: the slots' expressions of a value ``{x}``, and the agreed value's from the
#: maxima ``{a}`` (and ``{b}``).
_RULES: dict[How, tuple[str, str]] = {
    How.MAX: ("int({x})", "{a}"),
    How.MIN: ("-int({x})", "-{a}"),
    How.ANY: ("(1 if {x} else 0)", "{a} != 0"),
    How.ALL: ("(0 if {x} else 1)", "{a} == 0"),
    How.SAME: ("int({x}), -int({x})", "({a} if {a} == -{b} else None)"),
    # (inline: equal_slots and agreed_equal)
    How.EQUAL: (
        "*(({x}, -{x}) if {x} >= 0 else _UNSET2)",
        "(_NOT_COMPARED if {a} == _UNSET else ({a} if {a} == -{b} else None))",
    ),
}


class Facts:
    """Base of the records: classes made by :func:`record`, whose fields are :func:`fact` s."""

    __slots__ = ()

    @classmethod
    def width(cls) -> int:
        """Number of int64 slots of the record."""
        return int(getattr(cls, "_width"))  # noqa: B009 - set by record()

    def slots(self) -> list[int]:
        """This rank's slots, to be reduced with ``MAX`` (made by :func:`record`)."""
        raise TypeError(f"{type(self).__name__} is not made by facts.record")

    def to_array(self) -> npt.NDArray[np.int64]:
        """:meth:`slots` as an int64 array (a buffer for ``Allreduce``)."""
        return np.array(self.slots(), np.int64)

    @classmethod
    def agreed(cls, maxima: Sequence[int] | npt.NDArray[np.int64]) -> Self:
        """The agreed record from the maxima of every rank's slots (extra slots ignored;
        made by :func:`record`)."""
        raise TypeError(f"{cls.__name__} is not made by facts.record")

    @classmethod
    def index(cls) -> dict[str, int]:
        """Each fact's first slot."""
        got: dict[str, int] = getattr(cls, "_index")  # noqa: B009 - set by record()
        return got

    @classmethod
    def patcher(cls, *names: str) -> Callable[..., None]:
        """A function ``patch(slots, *values)`` that writes the slots of the facts
        ``names`` (given in that order) into ``slots``, a list that :meth:`slots` made:
        a call whose other facts repeat an earlier call's packs only those."""
        lines = []
        for n in names:
            i, how = cls.index()[n], cls._how(n)
            pack = _RULES[how][0].format(x=n).removeprefix("*")
            two = how in (How.SAME, How.EQUAL)
            lines.append(f"    s[{i}], s[{i + 1}] = {pack}" if two else f"    s[{i}] = {pack}")
        src = f"def patch(s, {', '.join(names)}):\n" + "\n".join(lines) + "\n"
        return _compiled(src, "patch", f"{cls.__qualname__}.patcher{names}")

    @classmethod
    def int_patcher(cls, *names: str, **fixed: Any) -> Callable[..., None]:
        """As :meth:`patcher`, for a caller whose values are Python ints and bools and
        some of whose facts are the same on every call: ``patch(slots, *values)`` of the
        facts ``names`` writes them without ``int()`` (an int is its own), the two slots
        of a compared fact by an ``if`` (no tuple), and the facts ``fixed`` (name=value)
        as the constant slots their values pack to, worked out here once."""
        rules = {n: _RULES[cls._how(n)][0] for n in (*names, *fixed)}
        lines = []
        for n in names:
            i, how = cls.index()[n], cls._how(n)
            if how is How.SAME:
                lines.append(f"    s[{i}], s[{i + 1}] = {n}, -{n}")
                continue
            if how is How.EQUAL:  # (equal_slots: a value not compared packs to UNSET)
                lines += [f"    if {n} >= 0:", f"        s[{i}], s[{i + 1}] = {n}, -{n}",
                          "    else:", f"        s[{i}] = s[{i + 1}] = {UNSET}"]  # fmt: skip
                continue
            pack = rules[n].replace("int({x})", "{x}").format(x=n)
            lines.append(f"    s[{i}] = {pack}")
        for n, value in fixed.items():
            i, pack = cls.index()[n], rules[n].format(x=repr(value))
            got = eval(pack.removeprefix("*"), {"_UNSET2": (UNSET, UNSET)})  # noqa: S307
            for j, v in enumerate(got if isinstance(got, tuple) else (got,)):
                lines.append(f"    s[{i + j}] = {int(v)}")
        src = f"def patch(s, {', '.join(names)}):\n" + "\n".join(lines) + "\n"
        return _compiled(src, "patch", f"{cls.__qualname__}.int_patcher{names}")

    @classmethod
    def reader(cls, *names: str) -> Callable[[Sequence[int]], tuple[Any, ...]]:
        """A function ``read(maxima)``: the agreed values of the facts ``names`` alone,
        as :meth:`agreed` finds them (a caller that needs a few decides before it builds
        the record)."""
        got = []
        for n in names:
            i = cls.index()[n]
            got.append(_RULES[cls._how(n)][1].format(a=f"v[{i}]", b=f"v[{i + 1}]"))
        src = f"def read(v):\n    return ({', '.join(got)},)\n"
        return _compiled(src, "read", f"{cls.__qualname__}.reader{names}")

    @classmethod
    def _how(cls, name: str) -> How:
        how: How = getattr(cls, "_hows")[name]  # noqa: B009 - set by record()
        return how


def _compiled(src: str, name: str, qualname: str) -> Callable[..., Any]:
    """The function ``name`` that ``src`` defines (with the rules' constants)."""
    env: dict[str, Any] = {"_UNSET": UNSET, "_UNSET2": (UNSET, UNSET),
                           "_NOT_COMPARED": NOT_COMPARED}  # fmt: skip
    exec(compile(src, f"<{qualname}>", "exec"), env)  # noqa: S102
    made: Callable[..., Any] = env[name]
    made.__qualname__ = qualname
    return made


_R = TypeVar("_R", bound=type)


@dataclass_transform(frozen_default=True, field_specifiers=(fact,))
def record(cls: _R) -> _R:
    """Make a subclass of :class:`Facts` a frozen, slotted dataclass of its facts.

    Every collective call packs and unpacks records, so the record's ``__init__``,
    :meth:`~Facts.slots` and :meth:`~Facts.agreed` are compiled once, here, each into
    one straight run of statements (as :mod:`dataclasses` makes ``__init__``) that sets
    the slots directly: frozen, but without a checked ``setattr`` per field.  A record
    derived from another is decorated too (it has its own fields).
    """
    made: Any = dataclasses.dataclass(frozen=True, slots=True)(cls)
    names, packs, unpacks, i = [], [], [], 0
    index, hows = {}, {}
    for f in dataclasses.fields(made):
        how: How = f.metadata["how"]
        pack, unpack = _RULES[how]
        names.append(f.name)
        index[f.name], hows[f.name] = i, how
        packs.append(pack.format(x=f"self.{f.name}"))
        unpacks.append(unpack.format(a=f"v[{i}]", b=f"v[{i + 1}]"))
        i += 2 if how in (How.SAME, How.EQUAL) else 1
    env: dict[str, Any] = {"_UNSET": UNSET, "_UNSET2": (UNSET, UNSET),
                           "_NOT_COMPARED": NOT_COMPARED, "_new": object.__new__,
                           "_ndarray": np.ndarray}  # fmt: skip
    env.update({f"_set_{n}": getattr(made, n).__set__ for n in names})
    sets = "".join(f"    _set_{n}(o, {{{n}}})\n" for n in names)
    src = (
        f"def __init__(o, {', '.join(names)}):\n"
        + sets.format(**{n: n for n in names})
        + f"def slots(self):\n    return [{', '.join(packs)}]\n"
        + "def agreed(cls, v):\n"
        + "    v = v.tolist() if type(v) is _ndarray else list(v)\n    o = _new(cls)\n"
        + sets.format(**dict(zip(names, unpacks, strict=True)))
        + "    return o\n"
    )
    exec(compile(src, f"<record {made.__qualname__}>", "exec"), env)  # noqa: S102
    env["__init__"].__qualname__ = f"{made.__qualname__}.__init__"
    made.__init__ = env["__init__"]
    made.slots = env["slots"]
    made.agreed = classmethod(env["agreed"])
    made._width = i
    made._index, made._hows = index, hows
    out: _R = made
    return out
