"""A time series of two-phase writes in the kept lane (collio.keptcall).

Each step is a column-block :class:`~collio.layouts.Subarray` equal to the last one but
for its offset, written through the aggregators; from the second call each rank finds
its head's facts from the last call's and the plan from the cache's entry.  Each test
checks the bytes against ROMIO (``MPI.File`` in the same run) or numpy, and that a rank
leaving the lane, or failing in it, leaves every rank with the same outcome.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import file_limit, raises_everywhere, read_file

import collio
import collio.exchange
import collio.keptcall
import collio.keptround
from collio.layouts import Subarray
from collio.testing.romio import romio_write

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 8, 64  # float64 per rank per step: ROWS runs of COLS * 8 bytes
TWO_PHASE = {"romio_cb_write": "enable"}  # (through the aggregators at one rank too)


def _step(comm, s, *, at=None, turn=0):
    """Rank r's columns of step ``s`` (a (ROWS, COLS * p) float64 array from byte ``at``,
    by default right after step ``s - 1``), the block ``(r + turn) % p``, and the step's
    bytes as the file holds them."""
    p = comm.size
    b = (comm.rank + turn) % p
    glob = np.arange(ROWS * COLS * p, dtype=np.float64).reshape(ROWS, COLS * p) + 1e4 * s
    offset = s * glob.nbytes if at is None else at
    lay = Subarray(glob.shape, (0, b * COLS), (ROWS, COLS), "<f8", offset=offset)
    return np.ascontiguousarray(glob[:, b * COLS : (b + 1) * COLS]), lay, glob.tobytes()


@pytest.fixture
def lane_calls(monkeypatch):
    """How many calls this rank made in the lane (its head made from the last call's:
    by the lane's way to the head, or by its step)."""
    made = [0]
    head, go = collio.keptcall._head, collio.keptcall.Step.go

    def counted(*args, **kwargs):
        made[0] += 1
        return head(*args, **kwargs)

    def stepped(*args, **kwargs):
        made[0] += 1
        return go(*args, **kwargs)

    monkeypatch.setattr(collio.keptcall, "_head", counted)
    monkeypatch.setattr(collio.keptcall.Step, "go", stepped)
    return made


def count_kept_rounds(monkeypatch):
    """A list whose one item counts this rank's rounds posted from a lane's kept record
    (:func:`collio.keptround.exchange`: by ``kept_round`` or by the lane's step)."""
    posted = [0]
    real = collio.keptround.exchange

    def counted(*args, **kwargs):
        posted[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(collio.keptround, "exchange", counted)
    monkeypatch.setattr(collio.keptcall, "exchange", counted)
    return posted


def _first_pass(comm, f, path, steps):
    """Write every step negated (the bytes a failed step 5 keeps), then steps 0-4;
    returns the file after the first pass, on every rank."""
    for piece, lay, _ in steps:
        f.write_all(-piece, lay)
    first = read_file(path) if comm.rank == 0 else None
    want = comm.bcast(first)
    for piece, lay, _ in steps[:5]:
        f.write_all(piece, lay)
    return want


def _step_5_kept(steps, first):
    """The file's bytes when every step but step 5 was written and step 5 kept the first
    pass's bytes."""
    step = len(steps[0][2])
    return (b"".join(w for _, _, w in steps[:5]) + first[5 * step : 6 * step]
            + b"".join(w for _, _, w in steps[6:]))  # fmt: skip


def _same_file(comm, path, want):
    comm.Barrier()
    got = read_file(path)
    comm.Barrier()  # (every rank reads before any goes on)
    assert got == want


HINTS = {
    "one-round": TWO_PHASE,
    "rounds": {**TWO_PHASE, "cb_buffer_size": 4096},
    # every rank aggregates, domains cut at 4 KiB: an unaligned step plans them again
    "aggregators": {**TWO_PHASE, "cb_config_list": "*:*", "striping_unit": 4096},
}


@pytest.mark.parametrize("hints", list(HINTS))
@pytest.mark.parametrize("apart", [0, 8], ids=["aligned", "unaligned"])
def test_a_series_takes_the_lane_and_writes_what_romio_and_numpy_do(
    comm, mpi_tmp_path, lane_calls, hints, apart
):
    """``apart``: bytes between steps."""
    path, theirs = str(mpi_tmp_path / "lane.bin"), str(mpi_tmp_path / "romio.bin")
    p, steps, want = comm.size, 9, bytearray()
    span = ROWS * COLS * 8 * p
    with collio.open(path, "w", comm=comm, hints=HINTS[hints]) as f:
        for s in range(steps):
            piece, lay, whole = _step(comm, s, at=s * (span + apart))
            f.write_all(piece, lay)
            romio_write(theirs, piece, lay, comm)
            want += bytes(lay.offset - len(want)) + whole
            last = f.stats.last_call
            assert last["path"] == "two-phase" and last["runs"] == (ROWS * p if p > 1 else 1)
            assert last["extent"] == [lay.offset, lay.offset + span]
            if s and not (apart and hints == "aggregators"):  # (step 0: maybe the last test's)
                assert last["plan_reused"]
            assert (last["rounds"] > 1) == (hints == "rounds" and p > 1)
        st = f.stats.as_dict()
    assert lane_calls[0] == steps - 1
    assert st["bytes_written"] == steps * span
    assert st["collective_calls"] == steps
    _same_file(comm, path, bytes(want))
    ours, romio = read_file(path), read_file(theirs)
    for s in range(steps):  # (ROMIO's bytes between steps are its own)
        at = s * (span + apart)
        assert ours[at : at + span] == romio[at : at + span]


def test_ranks_leaving_the_lane_meet_the_others_in_one_head(comm, mpi_tmp_path, lane_calls):
    """Every rank moves to the next block at step 3 (a new layout: the general way), and
    back at step 5; at step 7 rank 0 passes an F-ordered copy (not a view: the general
    way), the others stay in the lane.  Every step is written right."""
    path, p = str(mpi_tmp_path / "mixed.bin"), comm.size
    turns = [0, 0, 0, 1, 1, 0, 0, 0, 0]
    lanes, want = [], b""
    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        for s, turn in enumerate(turns):
            piece, lay, whole = _step(comm, s, turn=turn)
            if s == 7 and comm.rank == 0:
                piece = np.asfortranarray(piece)
            before = lane_calls[0]
            f.write_all(piece, lay)
            lanes.append(lane_calls[0] - before)
            if s:  # (step 0: maybe the last test's)
                assert f.stats.last_call["plan_reused"] == (p == 1 or s not in (3, 5))
            want += whole
    moved = 1 if p == 1 else 0  # (at one rank the turned block is the same one)
    assert lanes == [0, 1, 1, moved, 1, moved, 1, 0 if comm.rank == 0 else 1, 1]
    _same_file(comm, path, want)


@pytest.mark.parametrize("fault", ["data", "io"])
def test_a_rank_failing_mid_series_fails_every_rank_and_the_series_goes_on(
    comm, mpi_tmp_path, lane_calls, fault
):
    """At step 5 the last rank passes float32 data (its checks fail) or the aggregator's
    write fails (past its file size limit): every rank raises the same error, step 5's
    bytes stay as an earlier pass wrote them, and the series goes on in the lane."""
    path, last, nsteps = str(mpi_tmp_path / "fail.bin"), comm.size - 1, 8
    steps = [_step(comm, s) for s in range(nsteps)]
    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        want = _first_pass(comm, f, path, steps)
        done = lane_calls[0]
        piece, lay, whole = steps[5]
        if fault == "data":
            bad = piece.astype(np.float32) if comm.rank == last else piece
            err = raises_everywhere(comm, collio.LayoutError, lambda: f.write_all(bad, lay))
            assert err.ranks == (last,) and f"rank {last}: data dtype float32" in str(err)
        else:
            with file_limit(comm.rank == 0, lay.offset):  # (rank 0 aggregates step 5)
                err = raises_everywhere(comm, collio.BackendError, lambda: f.write_all(piece, lay))
            assert err.ranks == (0,) and "backend I/O: rank 0:" in str(err)
        assert lane_calls[0] == done + (1 if fault == "io" or comm.rank != last else 0)
        for piece, lay, _ in steps[6:]:
            f.write_all(piece, lay)
        assert f.stats.last_call["plan_reused"]
    _same_file(comm, path, _step_5_kept(steps, want))
    assert lane_calls[0] >= done + 2  # (the steps after the failure: in the lane again)


def test_a_receive_that_cannot_be_posted_fails_every_rank_and_the_series_goes_on(
    comm, mpi_tmp_path, lane_calls, monkeypatch
):
    """At step 5 the aggregator's round buffer is read-only, so no receive of its kept
    round can be posted: each is replaced by a stand-in (its sender's message completes),
    every rank raises the same error naming rank 0, step 5 keeps an earlier pass's bytes,
    and the series goes on in the lane."""
    path, nsteps = str(mpi_tmp_path / "posting.bin"), 8
    steps = [_step(comm, s) for s in range(nsteps)]
    real = collio.keptround.round_buffers
    real_whole = collio.keptcall.rounds_allocation

    def frozen(*args, **kwargs):
        views = [b.view() for b in real(*args, **kwargs)]
        for v in views:
            v.flags.writeable = False
        return views

    def frozen_whole(*args, **kwargs):  # (the allocation the lane's step cuts its window from)
        view = real_whole(*args, **kwargs).view()
        view.flags.writeable = False
        return view

    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        want = _first_pass(comm, f, path, steps)
        done = lane_calls[0]
        piece, lay, _ = steps[5]
        if comm.rank == 0:  # (rank 0 aggregates; the lane's step takes its buffers too)
            monkeypatch.setattr(collio.keptround, "round_buffers", frozen)
            monkeypatch.setattr(collio.keptcall, "round_buffers", frozen)
            monkeypatch.setattr(collio.keptcall, "rounds_allocation", frozen_whole)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.write_all(piece, lay))
        monkeypatch.setattr(collio.keptround, "round_buffers", real)
        monkeypatch.setattr(collio.keptcall, "round_buffers", real)
        monkeypatch.setattr(collio.keptcall, "rounds_allocation", real_whole)
        assert err.ranks == (0,) and "backend I/O: rank 0: BufferError" in str(err)
        assert lane_calls[0] == done + 1
        for piece, lay, _ in steps[6:]:
            f.write_all(piece, lay)
            assert f.stats.last_call["plan_reused"]
    _same_file(comm, path, _step_5_kept(steps, want))
    assert lane_calls[0] == done + 3


@pytest.fixture
def own_copies(monkeypatch):
    """How many times this rank copied its own part of its window (``Own.copy``)."""
    made = [0]
    copy = collio.keptround.Own.copy

    def counted(self, data, wbuf):
        made[0] += 1
        return copy(self, data, wbuf)

    monkeypatch.setattr(collio.keptround.Own, "copy", counted)
    return made


@pytest.mark.parametrize("cols", [1, 128, 2048], ids=["8B-runs", "1KiB-runs", "16KiB-runs"])
@pytest.mark.parametrize("hints", ["one-round", "aggregators"])
def test_an_aggregators_own_part_is_copied_as_romio_and_numpy_write_it(
    comm, mpi_tmp_path, own_copies, cols, hints
):
    """Column blocks of ``cols`` float64 a run: an aggregator's own part of its window
    is one numpy copy in every call of the lane (not a message to itself), and every
    step's bytes are numpy's and ROMIO's."""
    path, theirs = str(mpi_tmp_path / "own.bin"), str(mpi_tmp_path / "own_romio.bin")
    p, r, steps = comm.size, comm.rank, 6
    rows = max(16, 512 // cols)  # (a step of whole 4 KiB units: moved domains are the same)
    want = b""
    with collio.open(path, "w", comm=comm, hints=HINTS[hints]) as f:
        for s in range(steps):
            glob = np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p) + 1e5 * s
            piece = np.ascontiguousarray(glob[:, r * cols : (r + 1) * cols])
            lay = Subarray(glob.shape, (0, r * cols), piece.shape, "<f8", offset=s * glob.nbytes)
            f.write_all(piece, lay)
            romio_write(theirs, piece, lay, comm)
            assert f.stats.last_call["path"] == "two-phase"
            want += glob.tobytes()
        local = f.stats.local
    mine = local["domain"] == r and local["bytes"] > 0  # (an aggregator of its own part)
    # (every rank learns every rank's count: a rank failing alone would leave the others
    # in the next collective)
    seen = comm.allgather((mine, own_copies[0]))
    assert all(n == steps - 1 for m, n in seen if m), seen
    assert any(m for m, _ in seen), seen  # (some rank's own part was copied)
    _same_file(comm, path, want)
    assert read_file(theirs) == want


def test_a_failed_own_copy_fails_every_rank_and_the_series_goes_on(
    comm, mpi_tmp_path, lane_calls, monkeypatch
):
    """At step 5 rank 0's copy of its own part fails: every rank raises the same error
    naming rank 0, step 5 keeps an earlier pass's bytes (rank 0 aggregates the whole
    step: nothing of it is written), and the series goes on in the lane."""
    path, nsteps = str(mpi_tmp_path / "own_fails.bin"), 8
    steps = [_step(comm, s) for s in range(nsteps)]
    real = collio.keptround.Own.copy

    def failing(self, data, wbuf):
        raise MemoryError("no room for the copy")

    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        want = _first_pass(comm, f, path, steps)
        done = lane_calls[0]
        piece, lay, _ = steps[5]
        if comm.rank == 0:
            monkeypatch.setattr(collio.keptround.Own, "copy", failing)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.write_all(piece, lay))
        monkeypatch.setattr(collio.keptround.Own, "copy", real)
        assert err.ranks == (0,) and "rank 0: MemoryError: no room for the copy" in str(err)
        for piece, lay, _ in steps[6:]:
            f.write_all(piece, lay)
            assert f.stats.last_call["plan_reused"]
    _same_file(comm, path, _step_5_kept(steps, want))
    assert lane_calls[0] == done + 3


def test_a_process_meeting_many_strided_shapes_takes_the_kept_round_for_each_and_frees_them(
    comm, mpi_tmp_path, monkeypatch
):
    """80 column-block layouts one after another (each an hvector shape of its own at
    the aggregator, more than any table of kept types would hold), each written in 3
    steps: the steps after each layout's first take its kept round (posted with the
    round's own hvectors), every step's bytes are numpy's and ROMIO's, and each round's
    hvectors are freed when the lane lets it go, the last one's at close: none is left."""
    path, theirs = str(mpi_tmp_path / "shapes.bin"), str(mpi_tmp_path / "shapes_romio.bin")
    p, r, rows, nlay, steps = comm.size, comm.rank, 4, 80, 3
    types = []
    kept = count_kept_rounds(monkeypatch)
    real_of = collio.keptcall.round_of

    def recorded(*args, **kwargs):
        got = real_of(*args, **kwargs)
        types.extend(got.types if got is not None else ())  # (the objects freed later)
        return got

    monkeypatch.setattr(collio.keptcall, "round_of", recorded)
    want, at, live, taken = bytearray(), 0, [], []
    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        for cols in range(1, nlay + 1):
            before = kept[0]
            for s in range(steps):
                glob = np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p)
                glob += 1e5 * cols + 1e3 * s
                piece = np.ascontiguousarray(glob[:, r * cols : (r + 1) * cols])
                lay = Subarray(glob.shape, (0, r * cols), piece.shape, "<f8", offset=at)
                f.write_all(piece, lay)
                romio_write(theirs, piece, lay, comm)
                want += bytes(at - len(want)) + glob.tobytes()
                at += -(-glob.nbytes // 4096) * 4096  # (whole 4 KiB units: the lane moves)
            taken.append(kept[0] - before)
            live.append(sum(1 for t in types if t))  # (not yet freed: the handle is not null)
        made = len(types)
    seen = comm.allgather((taken, made, max(live), sum(1 for t in types if t)))
    assert all(t == [steps - 1] * nlay for t, _, _, _ in seen), seen
    # (an aggregator receives strided runs from other ranks: an hvector per layout)
    assert p == 1 or any(m >= nlay for _, m, _, _ in seen), seen
    assert all(most <= 1 and left == 0 for _, _, most, left in seen), seen
    _same_file(comm, path, bytes(want))
    assert read_file(theirs) == bytes(want)


def test_a_rank_that_cannot_make_its_rounds_hvectors_posts_it_the_general_way(
    comm, mpi_tmp_path, monkeypatch
):
    """Rank 0 (the aggregator) cannot make its kept round's hvectors: it posts the same
    messages the general way (built each call) while the others post theirs from their
    kept rounds; nothing fails, and every step's bytes are numpy's and ROMIO's."""
    path, theirs = str(mpi_tmp_path / "no_types.bin"), str(mpi_tmp_path / "no_types_romio.bin")
    kept = count_kept_rounds(monkeypatch)

    def refused(r):
        raise MemoryError("no hvector")

    if comm.rank == 0:
        monkeypatch.setattr(collio.keptround, "_make_types", refused)
    want = b""
    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        for s in range(6):
            piece, lay, whole = _step(comm, s)
            f.write_all(piece, lay)
            romio_write(theirs, piece, lay, comm)
            assert f.stats.last_call["path"] == "two-phase"
            want += whole
    seen = comm.allgather(kept[0])
    assert seen[0] == 0 and all(n == 5 for n in seen[1:]), seen
    _same_file(comm, path, want)
    assert read_file(theirs) == want


def test_a_series_on_a_batchs_plan_writes_its_own_bytes(comm, mpi_tmp_path, lane_calls):
    """A batch writes a column block's two halves, the bottom half first (its buffer holds
    the rows in another order than one piece would), then a series writes the whole
    block: its first call takes the batch's plan, moved to its own buffer offsets
    (plancache), and the series must not form a lane on that plan, whose round would
    send from the batch's offsets (reading past the piece); every step holds numpy's
    bytes."""
    p, r, rows, cols = comm.size, comm.rank, 8, 32
    half = rows // 2

    def glob(s):
        return np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p) + 1e4 * s

    path = str(mpi_tmp_path / "batch_plan.bin")
    nbytes = glob(0).nbytes
    with collio.open(path, "w", comm=comm, hints=TWO_PHASE) as f:
        g = glob(0)
        f.write_all_many([
            (np.ascontiguousarray(g[half:, r * cols : (r + 1) * cols]),
             Subarray(g.shape, (half, r * cols), (half, cols), "<f8", offset=0)),
            (np.ascontiguousarray(g[:half, r * cols : (r + 1) * cols]),
             Subarray(g.shape, (0, r * cols), (half, cols), "<f8", offset=0)),
        ])  # fmt: skip
        for s in range(1, 6):
            g = glob(s)
            lay = Subarray(g.shape, (0, r * cols), (rows, cols), "<f8", offset=s * nbytes)
            f.write_all(np.ascontiguousarray(g[:, r * cols : (r + 1) * cols]), lay)
    _same_file(comm, path, b"".join(glob(s).tobytes() for s in range(6)))
