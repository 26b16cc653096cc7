"""Which kept call a guessed call repeats (collio.speculate.KeptCalls): pure, no MPI."""

from __future__ import annotations

import numpy as np

from collio.speculate import KEPT_CALLS, Kept, KeptCalls, _period, call_key


def _kept() -> Kept:
    return Kept(None, None, (), 0, None, np.zeros(0, np.int64), (), None, ())  # type: ignore[arg-type]


def test_one_variable_repeats_the_last_call():
    assert _period([(8, 1)] * 5) == 1


def test_alternating_variables_repeat_their_own_last_call():
    a, b, c = (8, 1), (8, 2), (24, 1)
    assert _period([a, b, a, b]) == 2
    assert _period([a, b, c, a, b, c]) == 3
    assert _period([a, a, c, a, a, c, a, a]) == 3  # (two variables with one key)


def test_a_series_begun_anew_repeats_its_last_call():
    s, jump = (8, 1), (96, 1)
    assert _period([s, s, jump, s]) == 1
    assert _period([s, jump]) == 1


def test_a_period_longer_than_the_kept_calls_is_not_followed():
    keys = [(8, k) for k in range(KEPT_CALLS + 1)] * 2
    assert _period(keys) == 1


def test_the_candidate_is_the_call_one_period_back_and_old_calls_are_dropped():
    calls = KeptCalls()
    made = []
    n = 3 * KEPT_CALLS
    for s in range(n):
        k = None if s == n - 3 else _kept()  # (one call not kept)
        made.append(k)
        calls.completed(call_key(8, 100 + s % 3, 0), k)
    assert calls.period == 3
    assert calls.candidate() is None  # (the call one period back was not kept)
    calls.completed(call_key(8, 100 + n % 3, 0), _kept())
    assert calls.candidate() is made[n - 2]
    assert len(calls.entries) == KEPT_CALLS
    assert min(e.serial for e in calls.entries) == n + 1 - KEPT_CALLS - 1


def test_a_key_without_a_digest_compares_by_shift_alone():
    assert call_key(8, None, 100) == call_key(8, -1, 0) == (8, -1)
    assert call_key(8, 500, 100) == call_key(8, 600, 200)  # (the offset cancels)
