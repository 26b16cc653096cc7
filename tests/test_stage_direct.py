"""A two-level write's stage-two plan mixes the local aggregator's own pieces, sent from
its buffer, with its group's merged pieces, sent from the staging: only the latter are
laid out in the staging slots (:func:`collio.aggregators.stage.staging` with ``staged``)."""

from __future__ import annotations

import numpy as np

from collio.aggregators.plan import plan_sender
from collio.aggregators.stage import leader_runs, round_bytes, staging, subplan
from collio.runs import Runs

BOUNDS = np.array([0, 100, 200, 300, 400], np.int64)
WINDOW = 50
TRUTH = (np.arange(400) % 251).astype(np.uint8)  # the file's bytes


def _plan() -> tuple[object, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # the group's pieces for domains 1 and 3 (other groups' aggregators; each inside one
    # window, as its rank cut it), merged
    rfile = np.array([110, 130, 160, 310, 340, 350, 120], np.int64)
    rlen = np.array([10, 20, 30, 20, 10, 20, 10], np.int64)
    merged, vpos = leader_runs(rfile, rlen)
    # the local aggregator's own pieces for domains 0 and 2, at their places in its buffer
    own = Runs(np.array([0, 60, 210], np.int64), np.array([30, 20, 40], np.int64),
               np.array([1000, 1030, 1050], np.int64))  # fmt: skip
    file = np.concatenate((own.file, merged.file))
    order = np.argsort(file, kind="stable")
    length = np.concatenate((own.length, merged.length))[order]
    joined = Runs(file[order], length, np.concatenate((own.mem, merged.mem))[order])
    sp = plan_sender(joined, BOUNDS, WINDOW)
    return sp, vpos, rfile, rlen, np.isin(sp.gdom, [1, 3])


def test_staging_lays_out_the_staged_groups_and_keeps_the_others_memory():
    sp, vpos, rfile, rlen, staged = _plan()
    sround = sp.gwin  # (each aggregator's windows all busy: a group's round is its window)
    lay = staging(sp, sround, vpos, None, staged)
    nrounds = int(sround.max()) + 1
    slots = np.zeros((nrounds, lay.size), np.uint8)
    for f, n, k, at in zip(rfile, rlen, lay.sround, lay.spos, strict=True):  # (the copies)
        slots[k, at : at + n] = TRUTH[f : f + n]
    gof = np.repeat(np.arange(sp.ngroups), np.diff(sp.gstart))
    p, q = lay.sender.pieces, sp.pieces
    for i in range(len(p)):  # every staged piece is in its round's slot, right where sent
        g = gof[i]
        if staged[g]:
            got = slots[sround[g], p.mem[i] : p.mem[i] + p.length[i]]
            np.testing.assert_array_equal(got, TRUTH[p.file[i] : p.file[i] + p.length[i]])
        else:
            assert p.mem[i] == q.mem[i]  # (sent from the rank's own buffer)
    # each round's slot holds its staged bytes alone, laid end to end
    per_round = round_bytes(sp, sround, nrounds, staged)
    assert per_round.tolist() == np.bincount(lay.sround, weights=rlen, minlength=nrounds).tolist()
    assert lay.size == int(per_round.max()) < int(round_bytes(sp, sround, nrounds).max())


def test_subplan_takes_whole_groups():
    sp, _, _, _, staged = _plan()
    sub, picks = subplan(sp, staged)
    assert sub.ngroups == int(staged.sum()) and sub.gdom.tolist() == sp.gdom[staged].tolist()
    np.testing.assert_array_equal(sub.pieces.file, sp.pieces.file[picks])
    assert int(sub.pieces.length.sum()) == 120 and set(sub.gdom.tolist()) == {1, 3}
    assert sub.per_dom.tolist() == [0, 2, 0, 3]  # (merged, then cut at windows)
