"""collio-bench's iteration orders: every API follows every other equally often."""

from __future__ import annotations

from collections import Counter

import pytest

from collio.bench.run import balanced_orders


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_orders_balance_predecessors_and_first_place(n):
    rows = balanced_orders(n)
    assert len(rows) == (2 * n if n % 2 else n)
    assert rows[0][0] == 0
    assert all(sorted(r) == list(range(n)) for r in rows)
    pairs = Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
    assert len(pairs) == n * (n - 1)  # every ordered pair of different APIs occurs
    assert len(set(pairs.values())) <= 1  # ... equally often
    firsts = Counter(r[0] for r in rows)
    assert set(firsts) == set(range(n)) and len(set(firsts.values())) == 1
    if n >= 3:  # no API runs twice in a row across iterations (cyclically) either
        assert all(rows[k][-1] != rows[(k + 1) % len(rows)][0] for k in range(len(rows)))


def test_every_other_api_comes_right_before_the_first():
    """Unlike a rotation of [0..4], which always puts 4 right before 0."""
    assert {r[r.index(0) - 1] for r in balanced_orders(5) if r.index(0)} == {1, 2, 3, 4}
