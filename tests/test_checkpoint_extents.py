"""The checkpoint's extents of every array at once match those planned array by array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collio.checkpoint import extents, format
from collio.checkpoint.save import direct


def _spans(rng: np.random.Generator, size: int, nbytes: list[int]) -> np.ndarray:
    """Every rank's (lo, hi, contiguous, bytes) of arrays of these sizes: row blocks,
    a whole array on every rank, some empty pieces, some pieces of several runs."""
    out = np.zeros((size, len(nbytes), 4), np.int64)
    for k, n in enumerate(nbytes):
        kind = rng.integers(0, 4)
        if kind == 0:  # row blocks, cut at random
            cuts = np.sort(rng.integers(0, n + 1, size - 1)) if size > 1 else []
            edges = np.concatenate([[0], cuts, [n]]).astype(np.int64)
            out[:, k, 0], out[:, k, 1] = edges[:-1], edges[1:]
            out[:, k, 2] = 1
        elif kind == 1:  # the whole array on every rank
            out[:, k, 1], out[:, k, 2] = n, 1
        elif kind == 2:  # one rank holds it, the others nothing
            out[rng.integers(0, size), k, 1] = n
            out[:, k, 2] = 1
        else:  # interleaved pieces of several runs: extents of the same span, not contiguous
            out[:, k, 1] = n
            out[:, k, 2] = rng.integers(0, 2, size) if n else 1
        out[:, k, 3] = out[:, k, 1] - out[:, k, 0]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_plan_of_every_array_matches_array_by_array(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 6))
    nbytes = [int(x) for x in rng.choice([0, 1, 7, 4096, 10_000, 3 * 4096 + 5], 9)]
    block = int(rng.choice([4096, 8192, 1 << 22]))
    spans = _spans(rng, size, nbytes)
    offsets, _ = format.place(nbytes)
    got = extents.plan(np.array(nbytes, np.int64), offsets, spans, block)
    uncovered = 0
    for k, n in enumerate(nbytes):
        lo, hi, contig = spans[:, k, 0], spans[:, k, 1], spans[:, k, 2].astype(bool)
        starts = extents.cut(n, lo[contig], hi[contig], block)
        owner = extents.owners(starts, n, lo, hi, contig)
        mine = got.aid == k
        assert got.starts[mine].tolist() == starts.tolist(), k
        assert got.ends[mine].tolist() == np.append(starts[1:], n).tolist()[: len(starts)], k
        assert got.owner[mine].tolist() == owner.tolist(), k
        uncovered += int((owner < 0).sum())
    # one reader for each extent no piece covers, dealt over the ranks in turn
    readers = got.reader[got.owner < 0]
    assert readers.tolist() == (np.arange(uncovered) % size).tolist()
    assert (got.reader[got.owner >= 0] == -1).all()


def test_direct_needs_one_range_per_rank_and_no_overlap() -> None:
    def every(pieces: list[tuple[int, int, int]]) -> np.ndarray:
        out = np.array([[[lo, hi, c, hi - lo]] for lo, hi, c in pieces], np.int64)
        return out

    assert direct(every([(0, 10, 1), (10, 20, 1), (20, 20, 1)])).tolist() == [True]
    assert direct(every([(10, 20, 1), (0, 10, 1)])).tolist() == [True]  # any rank order
    assert direct(every([(0, 10, 1), (0, 0, 1), (0, 10, 1)])).tolist() == [False]  # overlap
    assert direct(every([(0, 12, 1), (10, 20, 1)])).tolist() == [False]
    assert direct(every([(0, 20, 0), (20, 40, 1)])).tolist() == [False]  # several runs
    two = np.concatenate([every([(0, 5, 1), (5, 9, 1)]), every([(0, 9, 0), (0, 9, 0)])], axis=1)
    assert direct(two).tolist() == [True, False]


def _reference(name: str) -> Any:
    """The CRC of each format's checksum by a library the checkpoint does not use for it
    (zlib's own CRC-32: the standard one, which zlib-ng's must equal)."""
    import zlib

    import crc32c

    return {"crc32c": crc32c.crc32c, "crc32": zlib.crc32}[name]


@pytest.mark.parametrize("name", ["crc32", "crc32c"])
def test_each_format_version_sums_with_its_standard_crc(name: str) -> None:
    """Version 3's checksum is zlib's CRC-32 (by zlib-ng), 1 and 2's CRC-32C, going on
    from a previous value as a load sums a range chunk by chunk."""
    from collio.checkpoint import crc

    algo = {"crc32": crc.for_version(3), "crc32c": crc.for_version(2)}[name]
    assert algo.name == name and crc.for_version(1) is crc.CRC32C
    ref = _reference(name)
    rng = np.random.default_rng(4)
    data = rng.integers(0, 256, 300_000, np.uint8)
    assert algo.of(data) == ref(data.tobytes()) != 0
    assert algo.of(data[1000:], algo.of(data[:1000])) == ref(data.tobytes())
    lens = np.array([0, 7, 4096, 295_897], np.int64)
    cuts = np.r_[0, np.cumsum(lens)]
    want = [ref(data[a:b].tobytes()) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    assert algo.of_pieces(data, lens).tolist() == want


@pytest.mark.parametrize("name", ["crc32", "crc32c"])
def test_crc_of_two_ranges_from_the_crc_of_each(name: str) -> None:
    from collio.checkpoint.crc import CRC32, CRC32C, combine

    poly = {"crc32": CRC32, "crc32c": CRC32C}[name].poly
    ref = _reference(name)
    rng = np.random.default_rng(5)
    lens_a = rng.integers(0, 3000, 40)
    lens_b = np.concatenate([[0, 1, 4096, 1 << 20], rng.integers(0, 70_000, 36)])
    a = [rng.integers(0, 256, n, np.uint8).tobytes() for n in lens_a]
    b = [rng.integers(0, 256, n, np.uint8).tobytes() for n in lens_b]
    ca = np.array([ref(x) for x in a], np.uint32)
    cb = np.array([ref(x) for x in b], np.uint32)
    got = combine(ca, cb, lens_b.astype(np.int64), poly)
    assert got.tolist() == [ref(x + y) for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("poly", [0x82F63B78, 0xEDB88320])
def test_crc_combine_by_digit_as_by_bit(poly: int) -> None:
    """combine's advance a hexadecimal digit of the length at a time is the advance a
    bit at a time, for every length up to 2**48 (each digit value, the longest)."""
    from collio.checkpoint import crc

    rng = np.random.default_rng(6)
    lens = np.concatenate([
        [0, 1, 15, 16, 17, (1 << 48) - 1, 1 << 47],
        rng.integers(0, 1 << 48, 200), rng.integers(0, 1 << 22, 200),
    ]).astype(np.int64)  # fmt: skip
    c1 = rng.integers(0, 1 << 32, len(lens), np.uint64).astype(np.uint32)
    c2 = rng.integers(0, 1 << 32, len(lens), np.uint64).astype(np.uint32)
    tabs, want = crc._tables(poly), c1.copy()
    for k in range(crc.BITS):
        sel = ((lens >> k) & 1).astype(bool)
        want[sel] = crc._advance(tabs[k], want[sel])
    assert crc.combine(c1, c2, lens, poly).tolist() == (want ^ c2).tolist()


def test_parts_of_extents_across_piece_edges() -> None:
    """Two arrays in row pieces of a 3-rank load, extents cut at a 4-rank save's edges:
    the extents across the load's edges come in parts, one per rank holding bytes."""
    nbytes = np.array([120, 40], np.int64)
    offsets, _ = format.place(nbytes.tolist())
    load = np.array([[0, 40, 80, 120], [0, 10, 20, 40]], np.int64)  # per array: edges
    spans = np.zeros((3, 2, 4), np.int64)
    for k in range(2):
        spans[:, k, 0], spans[:, k, 1] = load[k, :-1], load[k, 1:]
    spans[:, :, 2], spans[:, :, 3] = 1, spans[:, :, 1] - spans[:, :, 0]
    starts = np.array([0, 30, 60, 90, 0, 10, 20, 30], np.int64)  # the saver's: 4 pieces
    aid = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int64)
    x = extents.assign(starts, aid, nbytes, offsets, spans, join=True)
    assert x.owner.tolist() == [0, -1, -1, 2, 0, 1, 2, 2]
    assert x.joined.tolist() == [1, 2] and (x.reader == -1).all()
    pe, lo, hi, rk = x.part
    assert list(zip(pe.tolist(), lo.tolist(), hi.tolist(), rk.tolist(), strict=True)) == [
        (1, 30, 40, 0), (1, 40, 60, 1), (2, 60, 80, 1), (2, 80, 90, 2),
    ]  # fmt: skip


def test_spans_of_boxes_in_one_pass_are_their_runs_spans() -> None:
    """A load's spans of Subarrays (one numpy pass) are what their runs give, for boxes of
    1 to 4 dimensions in either order, empty ones, and another layout kind beside them."""
    from collio.checkpoint.save import spans
    from collio.checkpoint.wanted import _spans
    from collio.layouts import Subarray, block_cyclic

    rng = np.random.default_rng(3)
    lays: list[Any] = []
    for _ in range(300):
        d = int(rng.integers(1, 5))
        g = rng.integers(1, 6, d)
        st = rng.integers(0, g)
        sh = rng.integers(0, g - st + 1)
        if rng.random() < 0.3:  # (rows of the last dimensions whole: often one range)
            k = int(rng.integers(0, d))
            st[k + 1 :], sh[k + 1 :] = 0, g[k + 1 :]
        order = "F" if rng.random() < 0.3 else "C"
        dtype = ["<f8", "<i2", "u1", "<c8"][int(rng.integers(0, 4))]
        lays.append(Subarray(tuple(g), tuple(st), tuple(sh), dtype, order))
    lays.insert(7, block_cyclic((9, 7), "<f4", block=(2, 3), grid=(2, 1), rank=1, size=2))
    assert _spans(lays).tolist() == spans(lays).tolist()
    assert {bool(c) for c in spans(lays)[:, 2]} == {True, False}


def test_a_pieces_span_keeps_no_layout(tmp_path: Any) -> None:
    """The span of a box (a row shard by arithmetic, a column shard from its runs) is
    kept by its values, never by the layout object: a job that makes its layouts anew
    at every save and load would keep each one (and its runs) otherwise.  The spans
    are the runs' own."""
    import sys

    import collio.checkpoint as ckpt
    from collio.checkpoint.save import span_of
    from collio.layouts import Subarray

    rows = [Subarray((64, 64), (16, 0), (16, 64), "f8") for _ in range(3)]
    cols = [Subarray((64, 64), (0, 16), (64, 16), "f8", "C") for _ in range(3)]
    counts = [sys.getrefcount(lay) for lay in rows + cols]
    assert [span_of(lay) for lay in rows] == [(16 * 64 * 8, 32 * 64 * 8, True)] * 3
    runs = cols[0].runs()
    want = (int(runs.file[0]), int(runs.file[-1] + runs.length[-1]), False)
    assert [span_of(lay) for lay in cols] == [want] * 3
    path = str(tmp_path / "c.ckpt")
    glob = np.arange(64 * 64, dtype="f8").reshape(64, 64)
    whole = Subarray((64, 64), (0, 0), (64, 64), "f8")
    ckpt.save(path, {"x": (glob, whole)})
    got = ckpt.load(path, {"x": cols[1]})
    assert got["x"].tobytes() == np.ascontiguousarray(glob[:, 16:32]).tobytes()
    assert [sys.getrefcount(lay) for lay in rows + cols] == counts


def test_uncut_answers_as_the_plan_alone() -> None:
    """verify.uncut (the search of a rank's piece edges among the extents) says what
    verify.alone says from the rank's whole plan: every piece one range, no extent cut,
    empty pieces and pieces not at the start of their array included."""
    from collio.checkpoint.crc import CRC32
    from collio.checkpoint.verify import Stored, alone, uncut

    rng = np.random.default_rng(11)
    seen = set()
    for _ in range(2000):
        na = int(rng.integers(1, 5))
        nbytes = rng.integers(0, 50, na).astype(np.int64)
        offsets, _ = format.place(nbytes.tolist())
        starts, aid = [], []
        for a in range(na):
            if nbytes[a]:
                cuts = np.unique(np.r_[0, rng.integers(0, nbytes[a], rng.integers(0, 4))])
                starts += cuts.tolist()
                aid += [a] * len(cuts)
        st_, aid_ = np.array(starts, np.int64), np.array(aid, np.int64)
        ends = extents.ends_of(st_, aid_, nbytes)
        none: Any = None  # (no chunks: uncut does not read)
        st = Stored(st_, np.zeros(len(st_), np.uint32), aid_, nbytes, offsets, none, CRC32)
        spans = np.zeros((na, 4), np.int64)
        for a in range(na):
            lo = int(rng.integers(0, nbytes[a] + 1))
            hi = int(rng.integers(lo, nbytes[a] + 1))
            if rng.random() < 0.5 and nbytes[a]:  # (on the extents' edges)
                i = int(rng.integers(0, int((aid_ == a).sum())))
                j = int(rng.integers(i, int((aid_ == a).sum())))
                lo, hi = int(st_[aid_ == a][i]), int(ends[aid_ == a][j])
            spans[a] = [lo, hi, rng.random() < 0.95, hi - lo]
        want = alone(st.plan(spans[None], join=False), spans, 0)[1]
        assert uncut(st, spans) == want
        seen.add(want)
    assert seen == {True, False}


@pytest.mark.parametrize("name", ["crc32", "crc32c"])
def test_extents_summed_from_the_windows_of_an_upload(name: str) -> None:
    """``writer._fold``: each extent's checksum from the sums of its parts as windows of
    an upload cut them (in any order, several per extent), the ranges no window held
    (no rank wrote there) summed as zeros, the same as the checksum of the whole."""
    from collio.checkpoint.crc import CRC32, CRC32C
    from collio.checkpoint.writer import _fold

    algo = {"crc32": CRC32, "crc32c": CRC32C}[name]
    ref = _reference(name)

    rng = np.random.default_rng(5)
    lens = np.array([1000, 4096, 7, 3000], np.int64)
    data = [rng.integers(0, 256, n, dtype=np.uint8) for n in lens]
    # (extent 1 has a gap no window held at 1000-1500, extent 3 one at its end)
    cuts = {0: [0, 300, 1000], 1: [0, 1000, 1500, 4096], 2: [0, 7], 3: [0, 2999]}
    rows = []
    for k, c in cuts.items():
        for a, b in zip(c[:-1], c[1:], strict=True):
            if (k, a) == (1, 1000):
                data[1][a:b] = 0
                continue
            rows.append((k, a, b - a, ref(data[k][a:b].tobytes())))
    data[3][2999:] = 0
    rows = [rows[i] for i in rng.permutation(len(rows))]
    got = _fold(np.array(rows, np.int64), lens, algo)
    want = [ref(d.tobytes()) for d in data]
    assert got.tolist() == want


def test_a_range_summed_twice_is_an_error_not_a_wrong_sum() -> None:
    """Two windows' sums overlapping in one extent cannot make its checksum: ``_fold``
    raises instead of storing a checksum no load would pass."""
    from collio.checkpoint.crc import CRC32
    from collio.checkpoint.writer import _fold
    from collio.errors import BackendError

    rows = np.array([(0, 0, 100, 1), (0, 50, 100, 2)], np.int64)
    with pytest.raises(BackendError, match="summed twice"):
        _fold(rows, np.array([150], np.int64), CRC32)
