"""``Facts.int_patcher`` writes the slots ``Facts.patcher`` writes, for int values."""

from __future__ import annotations

import random

from collio.checkfacts import Checked
from collio.quick import _PATCH, _PATCH_READ, _PATCH_WRITE
from collio.speculate import BIG


def test_the_step_reads_patcher_packs_as_the_general_patcher_does():
    """Every value (a compared fact not compared, negative; a fact at its limits) packs
    to the same slots, the fixed facts' included."""
    rng = random.Random(5)
    width = Checked.width()
    cases = [
        (0, 0, False, 0, 0, 0, 0),
        (1, 2, True, -1, 3, 4, -1),
        (5, BIG - 1, False, -1, 0, 0, 0),
    ]
    for _ in range(2000):
        cases.append((
            rng.randrange(1 << 50), rng.randrange(1 << 50), rng.random() < 0.5,
            rng.randrange(-1, 1 << 40), rng.randrange(1 << 40), rng.randrange(1 << 40),
            rng.randrange(-1, 1 << 62),
        ))  # fmt: skip
    for lo, hi, moved, shift, t_io, t_total, sig in cases:
        fast, slow = [7] * width, [7] * width
        _PATCH_READ(fast, lo, hi, moved, shift, t_io, t_total, sig)
        _PATCH(slow, lo, hi, moved, shift, True, BIG, True, t_io, t_total, sig)
        assert fast == slow


def test_the_step_writes_patcher_packs_as_the_general_patcher_does():
    """The write's patcher too: the target's size (the lseek's, or ``BIG`` when not
    asked) among its values, ``guessed`` and ``same`` fixed."""
    rng = random.Random(6)
    width = Checked.width()
    cases = [
        (0, 0, False, 0, 0, 0, 0, 0),
        (1, 2, True, -1, BIG, 3, 4, -1),
        (5, BIG - 1, False, -1, 0, 0, 0, 0),
    ]
    for _ in range(2000):
        cases.append((
            rng.randrange(1 << 50), rng.randrange(1 << 50), rng.random() < 0.5,
            rng.randrange(-1, 1 << 40), rng.choice((BIG, rng.randrange(1 << 50))),
            rng.randrange(1 << 40), rng.randrange(1 << 40), rng.randrange(-1, 1 << 62),
        ))  # fmt: skip
    for lo, hi, moved, shift, size, t_io, t_total, sig in cases:
        fast, slow = [7] * width, [7] * width
        _PATCH_WRITE(fast, lo, hi, moved, shift, size, t_io, t_total, sig)
        _PATCH(slow, lo, hi, moved, shift, True, size, True, t_io, t_total, sig)
        assert fast == slow
