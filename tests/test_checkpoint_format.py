"""The checkpoint's pure parts: extent planning, the trailer, and the simulator's model."""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any

import numpy as np
import pytest

import collio
from collio import ChecksumError, layouts
from collio.checkpoint import extents, format
from collio.checkpoint.crc import CRC32, for_version
from collio.checkpoint.save import span_of
from collio.sim.checkpoint import checkpoint_plan, checkpoint_workload
from collio.testing.checkpoint import flip


def test_cut_at_the_grid_and_every_piece_edge() -> None:
    lo = np.array([0, 10, 25], np.int64)
    hi = np.array([10, 25, 40], np.int64)
    assert extents.cut(40, lo, hi, block=16).tolist() == [0, 10, 16, 25, 32]
    assert extents.cut(0, lo, hi).tolist() == []


def test_owners_cover_whole_extents_only() -> None:
    starts = np.array([0, 10, 16, 25, 32], np.int64)
    lo, hi = np.array([0, 10, 25], np.int64), np.array([10, 25, 40], np.int64)
    every = np.ones(3, bool)
    assert extents.owners(starts, 40, lo, hi, every).tolist() == [0, 1, 1, 2, 2]
    # a load in other pieces: [0, 20) and [20, 40) cover no extent that straddles 20
    lo2, hi2 = np.array([0, 20], np.int64), np.array([20, 40], np.int64)
    got = extents.owners(starts, 40, lo2, hi2, np.ones(2, bool))
    assert got.tolist() == [0, 0, -1, 1, 1]
    assert extents.deal(got < 0, 2).tolist() == [-1, -1, 0, -1, -1]
    # the whole array on every rank: dealt round-robin
    full = extents.owners(starts, 40, np.zeros(2, np.int64), np.full(2, 40), np.ones(2, bool))
    assert full.tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    "lay",
    [
        layouts.Subarray((6, 5, 4), (2, 0, 0), (3, 5, 4), "<f8"),
        layouts.Subarray((6, 5, 4), (2, 1, 0), (1, 3, 4), "<i2"),
        layouts.Subarray((6, 5, 4), (2, 1, 0), (2, 3, 4), "<i2"),
        layouts.Subarray((6, 5), (0, 1), (6, 2), "<f4", order="F"),
        layouts.Subarray((6, 5), (1, 1), (2, 2), "<f4", order="F"),
        layouts.Subarray((6, 5), (0, 0), (0, 5), "<f4"),
        layouts.block_cyclic((8, 8), "<f8", block=2, grid=(2, 1), rank=1, size=2),
    ],
)
def test_span_by_arithmetic_matches_the_runs(lay: layouts.Subarray) -> None:
    runs = lay.runs()
    assert span_of(lay) == extents.span(runs.file, runs.length, runs.mem)


def test_trailer_refuses_what_is_not_a_checkpoint() -> None:
    raw = format.trailer_bytes(5000, 100, 7)
    assert format.parse_trailer(raw, 5164, "x") == (5000, 100, 7, format.VERSION)
    with pytest.raises(ChecksumError, match="does not end"):
        format.parse_trailer(raw, 5165, "x")
    with pytest.raises(ChecksumError, match="no checkpoint trailer"):
        format.parse_trailer(b"\0" * format.TRAILER.size, 5164, "x")
    with pytest.raises(ChecksumError, match="too short"):
        format.parse_trailer(raw, 100, "x")


def test_place_aligns_every_array() -> None:
    offsets, end = format.place([1, 4096, 0, 5000])
    assert offsets.tolist() == [4096, 8192, 12288, 12288]
    assert end == 20480


def test_simulated_save_plans_one_extent_per_piece() -> None:
    work = checkpoint_workload(1024, 10, 10 * 1024 * 8192)
    plan = checkpoint_plan(work, 1024, 10)
    assert plan["extents"] == 10 * 1024 and plan["arrays"] == 10


def _v1_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "a": rng.standard_normal((37, 300)),
        "b": np.arange(10001, dtype="<i4"),
        "empty": np.zeros((0, 3), "<f4"),
        "small": np.arange(3, dtype="<u2"),
    }


def test_a_version_1_file_still_loads_byte_for_byte(tmp_path: object) -> None:
    """Written by the version 1 writer kept for tests: info and a one-rank load (whole
    arrays, row pieces, mapped or read) see every byte, and offsets in it are the
    arrays' own (one range each)."""
    import collio.checkpoint as ckpt
    from collio.testing.checkpoint_v1 import write_v1

    path = f"{tmp_path}/v1.ckpt"
    want = _v1_arrays()
    write_v1(path, want, metadata={"step": 1})
    meta = ckpt.info(path)
    assert meta.metadata == {"step": 1} and sorted(meta) == sorted(want)
    with open(path, "rb") as fh:
        assert int.from_bytes(fh.read(12)[8:], "little") == 1  # (the header's version)
    assert meta.file_runs("a") == [(meta["a"]["offset"], want["a"].nbytes)]
    for maps in ("enable", "disable"):
        got = ckpt.load(path, {n: None for n in want}, hints={"checkpoint_map": maps})
        for name, arr in want.items():
            assert got[name].dtype == arr.dtype and got[name].tobytes() == arr.tobytes(), name
    rows = layouts.Subarray((37, 300), (10, 0), (13, 300), "<f8")
    assert ckpt.load(path, {"a": rows})["a"].tobytes() == want["a"][10:23].tobytes()


def test_a_flipped_byte_of_a_version_1_file_names_the_array(tmp_path: object) -> None:
    import collio.checkpoint as ckpt
    from collio.testing.checkpoint_v1 import write_v1

    path = f"{tmp_path}/v1.ckpt"
    want = _v1_arrays()
    write_v1(path, want)
    flip(path, ckpt.info(path).file_offset("b", 4 * 9000), 1)
    with pytest.raises(ChecksumError) as err:
        ckpt.load(path, {n: None for n in want}, hints={"checkpoint_map": "disable"})
    assert err.value.names == ("b",)
    got = ckpt.load(path, {"a": None, "small": None})
    assert got["a"].tobytes() == want["a"].tobytes()


#: A version 2 checkpoint (CRC-32C) as collio's version 2 writer saved it at one rank
V2 = os.path.join(os.path.dirname(__file__), "data", "v2.ckpt")


def _v2_arrays() -> dict[str, np.ndarray]:
    """What :data:`V2` holds (saved with metadata ``{"step": 2}``)."""
    rng = np.random.default_rng(2)
    return {
        "a": rng.standard_normal((37, 30)),
        "b": np.arange(2001, dtype="<i4"),
        "empty": np.zeros((0, 3), "<f4"),
        "nested/small": np.arange(3, dtype="<u2"),
    }


def test_a_version_2_file_still_loads_byte_for_byte() -> None:
    """Saved by the version 2 writer, checked with CRC-32C: info and one-rank loads (whole
    arrays mapped or read, a row piece read back) see every byte."""
    import collio.checkpoint as ckpt

    with open(V2, "rb") as fh:
        raw = fh.read()
    assert int.from_bytes(raw[8:12], "little") == 2  # (the header's version)
    want = _v2_arrays()
    meta = ckpt.info(V2)
    assert meta.metadata == {"step": 2} and sorted(meta) == sorted(want)
    assert meta.index.version == 2 and meta.index.algo.name == "crc32c"
    for maps in ("enable", "disable"):
        got = ckpt.load(V2, {n: None for n in want}, hints={"checkpoint_map": maps})
        for name, arr in want.items():
            assert got[name].dtype == arr.dtype and got[name].tobytes() == arr.tobytes(), name
    rows = layouts.Subarray((37, 30), (10, 0), (13, 30), "<f8")
    assert ckpt.load(V2, {"a": rows})["a"].tobytes() == want["a"][10:23].tobytes()


def test_a_flipped_byte_of_a_version_2_file_names_the_array(tmp_path: object) -> None:
    import collio.checkpoint as ckpt

    path = f"{tmp_path}/v2.ckpt"
    shutil.copyfile(V2, path)
    want = _v2_arrays()
    flip(path, ckpt.info(path).file_offset("b", 4 * 1500), 1)
    with pytest.raises(ChecksumError) as err:
        ckpt.load(path, {n: None for n in want}, hints={"checkpoint_map": "disable"})
    assert err.value.names == ("b",)
    got = ckpt.load(path, {"a": None, "nested/small": None})
    assert got["a"].tobytes() == want["a"].tobytes()


def _rewritten(tmp_path: object, edit: Any, version: int | None = None) -> str:
    """A version 3 checkpoint whose JSON index ``edit`` rewrote (its trailer made anew:
    the index's length and checksum, ``version`` where given), so only what the edit
    says is wrong with it."""
    import collio.checkpoint as ckpt

    path = f"{tmp_path}/edited.ckpt"
    ckpt.save(path, {"x": np.arange(100, dtype="<i8")})
    with open(path, "rb") as fh:
        raw = fh.read()
    _, v, off, length, _, _ = format.TRAILER.unpack(raw[-format.TRAILER.size :])
    assert v == format.VERSION == 3
    doc = edit(raw[off : off + length])
    v = v if version is None else version
    tail = format.trailer_bytes(
        off, len(doc), for_version(v if v in format.READS else 3).of(doc), v
    )
    with open(path, "wb") as fh:
        fh.write(raw[:off] + doc + tail)
    return path


@pytest.mark.parametrize(
    "edit, version, match",
    [
        (lambda d: d.replace(b'"version":3', b'"version":2'), None,
         "the index says checkpoint format version 2, the trailer 3"),
        (lambda d: d.replace(b'"version":3', b'"version":3.0'), None, "version 3.0"),
        (lambda d: d.replace(b'"crc32":', b'"crc32c":'), None,
         "holds no 'crc32' checksum of its extent table"),
        (lambda d: d, 4, "checkpoint format version 4; this reads 1, 2, 3"),
        (lambda d: d.replace(b'"arrays":', b'"arrays_":'), None, "unreadable index"),
    ],
)  # fmt: skip
def test_an_index_that_disagrees_with_its_version_is_refused(
    tmp_path: object, edit: Any, version: int | None, match: str
) -> None:
    """Whatever a reader cannot trust about a file's version is a ChecksumError saying
    what, once (not wrapped in an 'unreadable index')."""
    import collio.checkpoint as ckpt

    path = _rewritten(tmp_path, edit, version)
    with pytest.raises(ChecksumError, match=match) as err:
        ckpt.info(path)
    assert str(err.value).count(path) == 1
    with pytest.raises(ChecksumError, match=match):
        ckpt.load(path, {"x": None})


def test_without_zlib_ng_the_standard_librarys_crc32_sums_alike(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zlib-ng missing (an install from before it was a dependency), a save and a load
    sum with the standard library's zlib.crc32: the same checkpoint, byte for byte."""
    import sys
    import zlib

    import collio.checkpoint as ckpt

    state = {"x": np.arange(50_000, dtype="<f8"), "y": np.arange(7, dtype="<i2")}
    ckpt.save(f"{tmp_path}/fast.ckpt", state)
    for mod in ("zlib_ng", "zlib_ng.zlib_ng"):  # (importing either raises ImportError)
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setattr(CRC32, "_fn", None)
    assert CRC32.fn is zlib.crc32
    ckpt.save(f"{tmp_path}/slow.ckpt", state)
    with open(f"{tmp_path}/fast.ckpt", "rb") as a, open(f"{tmp_path}/slow.ckpt", "rb") as b:
        assert a.read() == b.read()
    got = ckpt.load(f"{tmp_path}/slow.ckpt", {"x": None, "y": None})
    assert all(got[n].tobytes() == v.tobytes() for n, v in state.items())


def test_a_checksum_library_that_cannot_be_imported_is_said() -> None:
    from collio.checkpoint.crc import Algo

    assert Algo("crc32", CRC32.poly, "no_such_module.crc32", "zlib.crc32").of(b"1") == 0x83DCEFB7
    with pytest.raises(ImportError, match="no_such_module"):
        Algo("crc32", CRC32.poly, "no_such_module.crc32").of(b"1")


def test_place_ranks_puts_each_ranks_pieces_one_after_another() -> None:
    """Two direct arrays over two ranks (one rank holds nothing of the second) and one
    array written two-phase: rank 0's pieces, rank 1's, then the whole array; each
    piece aligned; the extents' file offsets follow their pieces."""
    lo = np.array([[0, 0, 0], [100, 0, 0]], np.int64)
    hi = np.array([[100, 5000, 0], [300, 0, 0]], np.int64)
    direct = np.array([True, True, False])
    nbytes = np.array([300, 5000, 64], np.int64)
    pieces, whole, end = format.place_ranks(lo, hi, direct, nbytes)
    A = format.ALIGN
    assert pieces.tolist() == [[A, 2 * A, -1], [4 * A, -1, -1]]
    assert whole.tolist() == [-1, -1, 5 * A] and end == 6 * A
    starts = np.array([0, 100, 0, 0], np.int64)
    aid = np.array([0, 0, 1, 2], np.int64)
    owner = np.array([0, 1, 0, -1], np.int64)
    got = format.extent_files(starts, aid, owner, lo, pieces, whole)
    assert got.tolist() == [A, 4 * A, 2 * A, 5 * A]


def test_place_ranks_puts_large_pieces_on_their_arrays_huge_page_grid() -> None:
    """Pieces of PLACE_MIN bytes or more that start on a page of their array start at
    the same offset modulo a huge page in the file (the gap before them left), the
    others on the page grid: a small piece after a large one, a large one starting
    within a page; without ``huge`` (an S3 object) every piece on the page grid."""
    A, H, M = format.ALIGN, format.HUGE_PAGE, format.PLACE_MIN
    # rank 0: a large piece at 3 MiB + 4 KiB of its array, a small one, a large one at
    # 100 bytes; rank 1: a large piece at 1 MiB of the first array
    lo = np.array([[3 * 2**20 + A, 0, 100], [2**20, 0, 0]], np.int64)
    hi = lo + np.array([[M, 10, M + 1], [M, 0, 0]], np.int64)
    direct = np.array([True, True, True])
    nbytes = np.array([8 * M, 10, 2 * M], np.int64)
    pieces, whole, end = format.place_ranks(lo, hi, direct, nbytes)
    first = 2**20 + A  # (after the header: the first offset at 1 MiB + 4 KiB mod H)
    small = first + M
    odd = small + A
    big = -(-(odd + M + 1 - 2**20) // H) * H + 2**20
    assert pieces.tolist() == [[first, small, odd], [big, -1, -1]]
    assert whole.tolist() == [-1, -1, -1] and end == format.aligned(big + M)
    flat, _, flat_end = format.place_ranks(lo, hi, direct, nbytes, huge=False)
    assert flat.tolist() == [[A, A + M, 2 * A + M], [3 * A + 2 * M, -1, -1]]
    assert flat_end == 3 * A + 3 * M


def test_runs_sharing_a_page_from_two_places_in_the_file_are_not_mapped() -> None:
    """A piece whose second part starts within the page its first part ends in, stored
    elsewhere in the file, cannot be mapped in place (the page would hold both); where
    that part follows the first in the file it can."""
    from collio.checkpoint.wanted import _stitchable

    A = format.ALIGN
    vlo = np.array([0], np.int64)
    length = np.array([A + 100, 5000], np.int64)
    src = np.zeros(2, np.int64)
    within = np.array([0, A + 100], np.int64)
    apart = np.array([10 * A, 20 * A + 100], np.int64)
    together = np.array([10 * A, 11 * A + 100], np.int64)
    size = 30 * A
    assert not _stitchable(vlo, (apart, length, src, within), size)[0]
    assert _stitchable(vlo, (together, length, src, within), size)[0]


def test_chunks_map_array_ranges_to_file_runs() -> None:
    from collio.checkpoint.chunks import Chunks

    # virtual [0, 20) stored as [500, 510) + [510, 520) (one chunk), [20, 25) at 1000
    c = Chunks.of_runs(np.array([0, 10, 20, 100]), np.array([500, 510, 1000, 50]),
                       np.array([10, 10, 5, 8]))  # fmt: skip
    assert c.vstart.tolist() == [0, 20, 100] and c.length.tolist() == [20, 5, 8]
    file, length, src, within = c.runs(np.array([5, 18, 100, 0]), np.array([10, 5, 8, 0]))
    assert file.tolist() == [505, 518, 1000, 50] and length.tolist() == [10, 2, 3, 8]
    assert src.tolist() == [0, 1, 1, 2] and within.tolist() == [0, 0, 2, 0]
    one, at = c.within(np.array([0, 18, 100]), np.array([20, 25, 108]))
    assert one.tolist() == [True, False, True] and at.tolist() == [500, -1, 50]
    assert c.reads().split(18, 5) == [(518, 2, 0), (1000, 3, 2)]
    with pytest.raises(ValueError):
        c.runs(np.array([30]), np.array([5]))  # (between arrays: no chunk)


def test_chunks_of_empty_arrays_alone_are_none() -> None:
    """A load of arrays that hold no bytes (a dimension of length 0) maps no chunk."""
    from collio.checkpoint.chunks import Chunks

    z = np.zeros(0, np.int64)
    for v, f, n in [(z, z, z), (np.array([0, 0]), np.array([64, 64]), np.array([0, 0]))]:
        c = Chunks.of_runs(v, f, n)
        assert len(c.vstart) == len(c.fstart) == len(c.length) == 0
        assert [len(a) for a in c.runs(z, z)] == [0, 0, 0, 0]


def test_info_of_what_is_no_file_raises_as_a_load_does_and_never_waits(tmp_path: object) -> None:
    """A FIFO at the target would block ``open`` until a writer came (a load refuses it
    without opening it for long): info refuses it too, and a missing file or a directory,
    with the BackendError a load raises (errno kept), not the OS's own exception."""
    import collio.checkpoint as ckpt

    fifo = os.path.join(str(tmp_path), "fifo")
    os.mkfifo(fifo)
    for path, code, text in ((fifo, errno.EINVAL, "is a FIFO"),
                             (os.path.join(str(tmp_path), "none"), errno.ENOENT, "no such file"),
                             (str(tmp_path), errno.EISDIR, "is a directory")):  # fmt: skip
        with pytest.raises(collio.BackendError, match=text) as got:
            ckpt.info(path)
        assert got.value.errno == code
