"""A batch's memory span: it keeps its items alive and is never touched between them."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import batch, boxes, layouts
from collio.testing.guarded import guarded_like


def _items() -> tuple[list[tuple[Any, Any]], list[bytes]]:
    """Three items whose arrays live only in the returned list, each in its own pages
    of one mapping (unmapped when the last of them goes), and their bytes."""
    datas = guarded_like([np.arange(n, dtype="<f8") + n for n in (3, 600, 40)])
    lays = [layouts.Subarray((d.size,), (0,), (d.size,), "<f8", offset=k * 8192)
            for k, d in enumerate(datas)]  # fmt: skip
    return list(zip(datas, lays, strict=True)), [d.tobytes() for d in datas]


def test_span_holds_the_items_it_covers(tmp_path):
    """Dropping every other reference to the items (temporaries) leaves the span valid:
    were it a bare address range, reading it would touch unmapped memory and fault."""
    with collio.open(str(tmp_path / "x.bin"), "w", comm=MPI.COMM_SELF) as f:
        items, want = _items()
        runs, whole, arrays, _ = batch.gather(f.backend, items, writing=True)
        del items, arrays
        gc.collect()
        got = [whole[m : m + n].tobytes() for m, n in zip(runs.mem, runs.length, strict=True)]
    assert not whole.flags.writeable  # (a write's span: nothing writes through it)
    assert b"".join(got) == b"".join(want)  # runs in file order: the items' order here


def test_read_only_data_and_temporaries(tmp_path):
    """A write's data may be read-only (bytes) or made for the call alone."""
    path = str(tmp_path / "ro.bin")
    seg = layouts.Segments([0, 100], [5, 3])
    lay = layouts.Subarray((4,), (0,), (4,), "<i4", offset=16)
    with collio.open(path, "w", comm=MPI.COMM_SELF) as f:
        f.write_all_many([(b"abcdefgh", seg), (np.arange(4, dtype="<i4") * 7, lay)])
        back = f.read_all_many([seg, lay])
    assert back[0].tobytes() == b"abcdefgh"
    np.testing.assert_array_equal(back[1], [0, 7, 14, 21])
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw[:5] == b"abcde" and raw[100:103] == b"fgh"
    assert raw[16:32] == (np.arange(4, dtype="<i4") * 7).tobytes()  # the Subarray at offset 16


def _boxes() -> list[tuple[Any, Any]]:
    """Items of three shapes (C and F order, a block-cyclic piece), interleaved in item
    order and out of file order, one of them empty."""
    items: list[tuple[Any, Any]] = []
    for k, off in enumerate((4096, 0, 12288, 8192, 20480)):
        lay = layouts.Subarray((6, 8), (1, 2), (4, 5), "<f4", offset=off)
        items.append((np.arange(20, dtype="<f4").reshape(4, 5) + 100 * k, lay))
        f = layouts.Subarray((5, 7), (0, 1), (3, 4), "<i2", order="F", offset=off + 1024)
        items.append((np.asfortranarray(np.arange(12, dtype="<i2").reshape(3, 4) - k), f))
    cyc = layouts.block_cyclic((9, 10), "<f8", block=2, grid=(2, 2), rank=1, size=4, offset=30000)
    items.insert(
        3, (np.arange(np.prod(cyc.local_shape), dtype="<f8").reshape(cyc.local_shape), cyc)
    )
    items.insert(5, (np.zeros((0, 5), "<f4"), layouts.Subarray((6, 5), (6, 0), (0, 5), "<f4")))
    return items


def test_boxes_share_runs_of_one_template_each(tmp_path):
    """A batch of box layouts takes the shifted-template path, and its union is the one
    each item's own runs make (file, length and memory offset of every run)."""
    items = _boxes()
    with collio.open(str(tmp_path / "b.bin"), "w", comm=MPI.COMM_SELF) as f:
        fast = boxes.gather_boxes(f.backend, items, writing=True, outs=None)
        assert fast is not None
        bufs = [lay.as_bytes(d) for d, lay in items]
        slow, whole = batch._union([lay.runs() for _, lay in items], bufs, bufs, writing=True)
        sigs = tuple(lay.signature() for _, lay in items)
        assert fast[3] == ("items", sigs)
        # the digest's repr: the same short key as the per-item path makes
        assert repr(fast[3]) == repr(("items", batch.ItemSigs(sigs)))
        assert repr(fast[3]) != repr(("items", batch.ItemSigs((*sigs[:-1], sigs[0]))))
        for a, b in ((fast[0].file, slow.file), (fast[0].length, slow.length),
                     (fast[0].mem, slow.mem)):  # fmt: skip
            np.testing.assert_array_equal(a, b)
        assert fast[1].__array_interface__["data"] == whole.__array_interface__["data"]
        # an item that is not a contiguous array of its layout: every item checked alone
        odd = [(d.T.copy().T if d.ndim == 2 and d.flags.c_contiguous and d.size else d, lay)
               for d, lay in items]  # fmt: skip
        assert boxes.gather_boxes(f.backend, odd, writing=True, outs=None) is None
        f.write_all_many(odd)
        back = f.read_all_many([lay for _, lay in items])
    for (d, _), got in zip(items, back, strict=True):
        np.testing.assert_array_equal(got, d)


def test_boxes_match_one_call_each(tmp_path):
    """The batch's bytes in the file are those of one write_all per item; reads give the
    same arrays into given outputs (guarded memory) and new ones."""
    items = _boxes()
    many, single = str(tmp_path / "many.bin"), str(tmp_path / "single.bin")
    with collio.open(many, "w", comm=MPI.COMM_SELF) as f:
        datas = guarded_like([d for d, _ in items])
        f.write_all_many(list(zip(datas, [lay for _, lay in items], strict=True)))
        outs = guarded_like([np.zeros_like(d) for d, _ in items])
        back = f.read_all_many([lay for _, lay in items], out=outs)
        fresh = f.read_all_many([lay for _, lay in items])
    with collio.open(single, "w", comm=MPI.COMM_SELF) as f:
        for d, lay in items:
            f.write_all(d, lay)
    with open(many, "rb") as a, open(single, "rb") as b:
        assert a.read() == b.read()
    for (d, _), got, out, new in zip(items, back, outs, fresh, strict=True):
        assert got is out
        np.testing.assert_array_equal(got, d)
        np.testing.assert_array_equal(new, d)
        assert new.flags.f_contiguous if d.ndim and not d.flags.c_contiguous else True


def test_boxes_errors_name_the_item(tmp_path):
    """Errors of a box batch are the ones each item's own check raises, naming it."""
    items = _boxes()
    with collio.open(str(tmp_path / "e.bin"), "w", comm=MPI.COMM_SELF) as f:
        twice = [*items, items[1]]
        with pytest.raises(collio.OverlapError, match="items 1 and 12 both write them"):
            f.write_all_many(twice)
        bad = list(items)
        bad[4] = (items[4][0].astype("<f8"), items[4][1])
        with pytest.raises(collio.LayoutError, match="item 4: data dtype float64"):
            f.write_all_many(bad)
        neg = list(items)
        neg[2] = (items[2][0], layouts.Subarray((6, 8), (1, 2), (4, 5), "<f4", offset=-8))
        with pytest.raises(collio.LayoutError, match="item 2: offset -8 is negative"):
            f.write_all_many(neg)


def test_a_batch_of_the_same_layouts_keeps_its_union(tmp_path):
    """The same layout objects over arrays at the same addresses give the same read-only
    union object (the engine knows it by identity); other arrays, or equal layouts made
    anew, give a union of their own with the runs the per-item path makes."""
    items = _boxes()
    with collio.open(str(tmp_path / "k.bin"), "w", comm=MPI.COMM_SELF) as f:
        first = batch.gather(f.backend, items, writing=True)
        again = batch.gather(f.backend, [(d, lay) for d, lay in items], writing=True)
        assert again[0] is first[0] and not first[0].file.flags.writeable
        copies = [(d.copy(order="K"), lay) for d, lay in items]
        other = batch.gather(f.backend, copies, writing=True)
        anew = [(d, layouts.Subarray(lay.global_shape, lay.start, lay.shape, lay.dtype,
                                     lay.order, lay.offset) if type(lay) is layouts.Subarray
                 else lay) for d, lay in items]  # fmt: skip
        remade = batch.gather(f.backend, anew, writing=True)
        bufs = [lay.as_bytes(d) for d, lay in copies]
        slow, _ = batch._union([lay.runs() for _, lay in items], bufs, bufs, writing=True)
    assert other[0] is not first[0] and remade[0] is not first[0]
    np.testing.assert_array_equal(remade[0].file, first[0].file)
    assert remade[3] == first[3] == other[3] and repr(remade[3]) == repr(first[3])
    for a, b in ((other[0].file, slow.file), (other[0].length, slow.length),
                 (other[0].mem, slow.mem)):  # fmt: skip
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("most", [2, 4096])
def test_templates_of_known_shapes_move_to_new_offsets(tmp_path, monkeypatch, most):
    """Layouts made anew at other offsets, of shapes an earlier batch had, take those
    shapes' templates (all kept, or forgotten past ``most``) and give the runs each item's
    own layout makes."""
    from collio import boxes

    monkeypatch.setattr(boxes, "TEMPLATES_MAX", most)
    monkeypatch.setattr(boxes, "_TEMPLATES", {})
    monkeypatch.setattr(boxes, "_KEPT", [None])
    items = _boxes()
    with collio.open(str(tmp_path / "t.bin"), "w", comm=MPI.COMM_SELF) as f:
        batch.gather(f.backend, items, writing=True)
        moved = [(d, lay) if type(lay) is not layouts.Subarray else
                 (d, layouts.Subarray(lay.global_shape, lay.start, lay.shape, lay.dtype,
                                      lay.order, lay.offset + 65536 + 8 * k))
                 for k, (d, lay) in enumerate(items)]  # fmt: skip
        fast = batch.gather(f.backend, moved, writing=True)
        shapes = {boxes.shape_key(lay) for _, lay in items}
        assert 0 < len(boxes._TEMPLATES) <= min(most, len(shapes))
        bufs = [lay.as_bytes(d) for d, lay in moved]
        slow, _ = batch._union([lay.runs() for _, lay in moved], bufs, bufs, writing=True)
    for a, b in ((fast[0].file, slow.file), (fast[0].length, slow.length),
                 (fast[0].mem, slow.mem)):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    assert fast[3] == ("items", tuple(lay.signature() for _, lay in moved))


def test_release_buffers_forgets_what_batches_keep(tmp_path):
    """collio.release_buffers() drops the last batch's layouts and the templates; the next
    batch makes them again and writes its bytes, as one write_all per item does."""
    from collio import boxes

    items = _boxes()
    again = [((d + 1).astype(d.dtype), lay) for d, lay in items]  # (new bytes, same layouts)
    path, single = str(tmp_path / "r.bin"), str(tmp_path / "single.bin")
    with collio.open(path, "w", comm=MPI.COMM_SELF) as f:
        f.write_all_many(items)
        assert boxes._KEPT[0] is not None and boxes._TEMPLATES
        collio.release_buffers()
        assert boxes._KEPT[0] is None and boxes._UNION[0] is None and not boxes._TEMPLATES
        f.write_all_many(again)
        assert boxes._KEPT[0] is not None  # (made again)
        back = f.read_all_many([lay for _, lay in items])
    for (d, _), got in zip(again, back, strict=True):
        np.testing.assert_array_equal(got, d)
    with collio.open(single, "w", comm=MPI.COMM_SELF) as f:
        for d, lay in again:
            f.write_all(d, lay)
    with open(path, "rb") as a, open(single, "rb") as b:
        assert a.read() == b.read()


def _raw_pieces() -> list[tuple[Any, Any]]:
    """Raw byte pieces as a checkpoint writes them: out of file order, one of several
    segments (unsorted, two of them adjacent), an empty one, one of an empty segment."""
    rng = np.random.default_rng(7)
    segs = [([4096], [100]), ([0], [64]), ([], []), ([9000, 5000, 5100], [10, 100, 50]),
            ([300], [0]), ([8192], [1])]  # fmt: skip
    return [(rng.integers(0, 256, sum(n), dtype=np.uint8), layouts.Segments(o, n))
            for o, n in segs]  # fmt: skip


def test_raw_pieces_take_one_pass_and_match_the_per_item_path(tmp_path, monkeypatch):
    """A batch of (uint8, Segments) pairs is joined in numpy passes (no layout's runs are
    built), into the union the per-item path makes, and the file gets the same bytes."""
    items = _raw_pieces()
    with collio.open(str(tmp_path / "a.bin"), "w", comm=MPI.COMM_SELF) as f:
        fast = batch.gather(f.backend, items, writing=True)
        assert all(lay._runs is None for _, lay in items)  # (the fast path built none)
        monkeypatch.setattr(batch, "gather_raw", lambda *a, **k: None)
        slow = batch.gather(f.backend, items, writing=True)
        monkeypatch.undo()
    for name in ("file", "length"):
        np.testing.assert_array_equal(getattr(fast[0], name), getattr(slow[0], name))
    got = [fast[1][m : m + n].tobytes() for m, n in zip(fast[0].mem, fast[0].length, strict=True)]
    want = [slow[1][m : m + n].tobytes() for m, n in zip(slow[0].mem, slow[0].length, strict=True)]
    assert got == want and repr(fast[3][1]) == repr(slow[3][1])
    many, single = str(tmp_path / "many.bin"), str(tmp_path / "single.bin")
    with collio.open(many, "w", comm=MPI.COMM_SELF) as f:
        f.write_all_many(items)
    with collio.open(single, "w", comm=MPI.COMM_SELF) as f:
        for d, lay in items:
            f.write_all(d, lay)
    with open(many, "rb") as a, open(single, "rb") as b:
        assert a.read() == b.read()


def test_raw_pieces_errors_name_the_item(tmp_path):
    """A raw batch with a bad item is checked item by item: the errors name it."""
    items = _raw_pieces()
    with collio.open(str(tmp_path / "e.bin"), "w", comm=MPI.COMM_SELF) as f:
        with pytest.raises(collio.OverlapError, match="items 0 and 6 both write them"):
            f.write_all_many([*items, (np.zeros(2, np.uint8), layouts.Segments([4150], [2]))])
        with pytest.raises(collio.OverlapError, match="item 3 writes them twice"):
            again = layouts.Segments([9000, 5000, 5090], [10, 100, 50])
            f.write_all_many([*items[:3], (items[3][0], again)])
        short = list(items)
        short[1] = (items[1][0][:10], items[1][1])
        with pytest.raises(collio.LayoutError, match="item 1: "):
            f.write_all_many(short)
        neg = list(items)
        neg[5] = (items[5][0], layouts.Segments([-3], [1]))
        with pytest.raises(collio.LayoutError, match="item 5: segment 0 has negative offset -3"):
            f.write_all_many(neg)


def test_equal_layouts_share_one_shape_key(monkeypatch):
    """Layouts equal but for their offsets have the same key object; any other field, or
    another kind, another key; a key made after the kept ones were forgotten, or carried
    by a pickled layout, is equal to the first but not the same object."""
    import pickle

    from collio.layouts import arrays

    def box(offset: int, **kw: Any) -> Any:
        args = {"global_shape": (6, 8), "start": (1, 2), "shape": (4, 5), "dtype": "<f4"}
        return layouts.Subarray(**{**args, **kw}, offset=offset)

    a, b = box(0), box(4096)
    assert arrays.shape_keys([a])[0] is arrays.shape_keys([b])[0]
    others = [box(0, start=(0, 2)), box(0, shape=(4, 4)), box(0, dtype="<f8"),
              box(0, global_shape=(6, 9)), layouts.Subarray((6, 8), (1, 2), (4, 5), "<f4",
              order="F"), layouts.block_cyclic((9, 10), "<f8", block=2, grid=(2, 2), rank=1,
              size=4)]  # fmt: skip
    keys = arrays.shape_keys([a, *others])
    assert len({id(k) for k in keys}) == len(keys) and len(set(keys)) == len(keys)
    assert arrays.shape_keys([layouts.ArrayLayout((4,), [], "<f4")]) == [None]
    np.testing.assert_array_equal(arrays.offsets_of([b, a, box(2**40)]), [4096, 0, 2**40])
    monkeypatch.setattr(arrays, "_SHAPE_KEYS", {})
    c, d = box(8192), pickle.loads(pickle.dumps(b))
    for lay in (c, d):
        key = arrays.shape_keys([lay])[0]
        assert key == arrays.shape_keys([a])[0] and key is not arrays.shape_keys([a])[0]


def test_items_of_one_key_keep_their_own_offsets(tmp_path, monkeypatch):
    """200 boxes of one shape out of file order, among them layouts whose equal keys are
    other objects (made after the keys were forgotten, unpickled) and a second shape:
    the batch takes the box path, its runs are the per-item path's, and the file holds
    each item at its own offset (numpy's image of the items)."""
    import pickle

    from collio.layouts import arrays

    n, step = 200, 8192  # (one global array per slot)
    where = np.random.default_rng(5).permutation(n)  # (item k at slot where[k])
    lays: list[Any] = [layouts.Subarray((1024,), (256,), (512,), "<i8", offset=int(w) * step)
                       for w in where]  # fmt: skip
    lays[7] = pickle.loads(pickle.dumps(lays[7]))
    monkeypatch.setattr(arrays, "_SHAPE_KEYS", {})
    lays[150] = layouts.Subarray((1024,), (256,), (512,), "<i8", offset=lays[150].offset)
    lays[99] = layouts.Subarray((64, 16), (1, 2), (8, 8), "<i8", offset=lays[99].offset)
    datas = [np.arange(lay.nbytes // 8, dtype="<i8").reshape(lay.local_shape) + 10_000 * k
             for k, lay in enumerate(lays)]  # fmt: skip
    items = list(zip(datas, lays, strict=True))
    want = np.zeros(n * step, np.uint8)  # (what the file must hold)
    for d, lay in items:
        for f, length, m in zip(lay.runs().file, lay.runs().length, lay.runs().mem,
                                strict=True):  # fmt: skip
            want[f : f + length] = d.reshape(-1).view(np.uint8)[m : m + length]
    path = str(tmp_path / "keys.bin")
    with collio.open(path, "w", comm=MPI.COMM_SELF) as f:
        fast = boxes.gather_boxes(f.backend, items, writing=True, outs=None)
        assert fast is not None  # (the box path: keys equal by value group alike)
        bufs = [lay.as_bytes(d) for d, lay in items]
        slow, _ = batch._union([lay.runs() for lay in lays], bufs, bufs, writing=True)
        for x, y in ((fast[0].file, slow.file), (fast[0].length, slow.length),
                     (fast[0].mem, slow.mem)):  # fmt: skip
            np.testing.assert_array_equal(x, y)
        keys = arrays.shape_keys(lays)
        assert keys[150] == keys[0] and keys[150] is not keys[0] and keys[7] is not keys[0]
        sigs = [lay.signature() for lay in lays]
        assert list(fast[3][1]) == sigs and repr(fast[3][1]) == repr(batch.ItemSigs(sigs))
        f.write_all_many(items)
        back = f.read_all_many(lays)
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw == want[: len(raw)].tobytes() and not want[len(raw) :].any()
    for d, got in zip(datas, back, strict=True):
        np.testing.assert_array_equal(got, d)


def test_item_signatures_are_made_when_asked():
    """A box batch's signatures: a key the ranks compare at once, the signature tuples
    only when asked (a mismatch); both equal to those of the per-item path, and the
    same after a pickle (how they travel to other ranks)."""
    import pickle

    from collio.itemsigs import ItemSigs, array_sigs, sig_key

    heads = [("array", (16,), "<f8", "C"), ("array", (4, 4), "<i2", "F")]
    group = np.array([0, 1, 1, 0], np.intp)  # (numbered in order of their first items)
    offsets = np.array([0, 64, 8, 4096], np.int64)
    want = tuple(heads[g] + (int(o),) for g, o in zip(group, offsets, strict=True))
    sigs = array_sigs(heads, group, offsets)
    assert repr(sigs) == sig_key(want) == repr(ItemSigs(want))
    made = []
    lazy = ItemSigs(key=repr(sigs), make=lambda: made.append(1) or want)
    assert repr(lazy) == repr(sigs) and not made  # (the key alone: nothing made)
    assert lazy[2] == want[2] and len(lazy) == 4 and made == [1]
    assert sigs == want and sigs == ItemSigs(want) and list(sigs) == list(want)
    back = pickle.loads(pickle.dumps(sigs))
    assert repr(back) == repr(sigs) and back == sigs
    assert sigs != ItemSigs((*want[:-1], want[0]))


def test_a_batch_moved_whole_digests_alike_at_its_own_offset():
    """A batch's key ends with its first item's offset and hashes the others from it: a
    batch moved whole (a time series' next step) has the same placement key and digest
    (collio.checkfacts.digest_kept), so its repeat may be guessed, while the head still
    compares the offsets; one item moved alone changes the digest."""
    from collio.checkfacts import digest_kept, placed
    from collio.itemsigs import ItemSigs, array_sigs

    heads = [("array", (16,), "<f8", "C"), ("array", (4, 4), "<i2", "F")]
    group = np.array([0, 1, 1, 0], np.intp)
    offsets = np.array([64, 192, 320, 4096], np.int64)
    a, b = array_sigs(heads, group, offsets), array_sigs(heads, group, offsets + 8192)
    assert a.placement() == (b.placement()[0], 64) and b.placement()[1] == 64 + 8192
    assert repr(a) != repr(b)
    one = offsets.copy()
    one[2] += 8
    c = array_sigs(heads, group, one)
    assert c.placement()[0] != a.placement()[0]
    want = tuple(heads[g] + (int(o),) for g, o in zip(group, offsets + 8192, strict=True))
    assert ItemSigs(want).placement() == b.placement()  # (the per-item path's key)
    (da, at), (db, bt) = digest_kept(("items", a)), digest_kept(("items", b))
    assert da == db and (at, bt) == (64, 64 + 8192) and placed(da, at) != placed(db, bt)
    assert digest_kept(("items", c))[0] != da
    odd = ItemSigs(key="a key of its own", make=lambda: ())  # (not key_of's: compared whole)
    assert odd.placement() == ("a key of its own", 0)


def _moved(items: list[tuple[Any, Any]], d: int, odd: int = -1) -> list[tuple[Any, Any]]:
    """``items`` through layouts made anew ``d`` bytes further on (item ``odd``: 8 more)."""
    out = []
    for k, (data, lay) in enumerate(items):
        to = lay.offset + d + (8 if k == odd else 0)
        if type(lay) is layouts.Subarray:
            lay = layouts.Subarray(lay.global_shape, lay.start, lay.shape, lay.dtype,
                                   lay.order, to)  # fmt: skip
        else:
            lay = layouts.block_cyclic((9, 10), "<f8", block=2, grid=(2, 2), rank=1, size=4,
                                       offset=to)  # fmt: skip
        out.append((data, lay))
    return out


@pytest.mark.parametrize("writing", [True, False])
def test_a_batch_moved_as_a_whole_takes_the_last_union_moved(tmp_path, writing):
    """Layouts made anew, every one ``d`` bytes after the last batch's item of the same
    place, over the same arrays (a time series' next step): the union is the last one
    moved (known to be so without comparing runs), with the runs and signatures the
    per-item path makes; one item moved otherwise, or other arrays, are gathered anew."""
    items = _boxes()
    arrays = [d for d, _ in items]
    with collio.open(str(tmp_path / "m.bin"), "w", comm=MPI.COMM_SELF) as f:

        def gather(its: list[tuple[Any, Any]]) -> Any:
            if writing:
                return batch.gather(f.backend, its, writing=True)
            return batch.gather(f.backend, [lay for _, lay in its], writing=False, outs=arrays)

        first = gather(items)
        for d in (65536, 65536 + 4096, 8):  # (each step from the last: then back towards it)
            step = _moved(items, d)
            got = gather(step)
            assert got[0].shift_from(first[0]) == d  # (the kept plan finds it by this)
            bufs = [lay.as_bytes(a) for a, (_, lay) in zip(arrays, step, strict=True)]
            slow, _ = batch._union([lay.runs() for _, lay in step], bufs, bufs, writing=writing)
            for a, b in ((got[0].file, slow.file), (got[0].length, slow.length),
                         (got[0].mem, slow.mem)):  # fmt: skip
                np.testing.assert_array_equal(a, b)
            assert got[3] == ("items", tuple(lay.signature() for _, lay in step))
            assert repr(got[3]) == repr(("items", batch.ItemSigs(got[3][1].signatures())))
        odd = gather(_moved(items, 131072, odd=2))
        assert odd[0].shift_from(first[0]) is None
        assert odd[3] == ("items", tuple(lay.signature() for _, lay in _moved(items, 131072, 2)))


def test_moved_batches_write_what_one_call_each_writes(tmp_path):
    """A series of batches through layouts moved step by step over the same arrays, their
    values changed in place between steps: the file is that of one write_all per item,
    and reads through the moved layouts give each step's arrays back; an item passed
    twice in a moved batch is refused as in the first."""
    items = _boxes()
    many, single = str(tmp_path / "many.bin"), str(tmp_path / "single.bin")
    steps = [_moved(items, 65536 * s) for s in range(4)]
    values = []
    with collio.open(many, "w", comm=MPI.COMM_SELF) as f:
        for s, step in enumerate(steps):
            for data, _ in step:
                data += 1
            values.append([d.copy() for d, _ in step])
            f.write_all_many(step)
            if s:
                assert boxes._KEPT[0] is not None and boxes._KEPT[0].origin is not None
        twice = _moved(items, 65536 * 4)
        twice[7] = twice[1]
        with pytest.raises(collio.OverlapError, match="items 1 and 7 both write them"):
            f.write_all_many(twice)
        back = [f.read_all_many([lay for _, lay in step]) for step in steps]
    with collio.open(single, "w", comm=MPI.COMM_SELF) as f:
        for step, vals in zip(steps, values, strict=True):
            for v, (_, lay) in zip(vals, step, strict=True):
                f.write_all(v, lay)
    with open(many, "rb") as a, open(single, "rb") as b:
        assert a.read() == b.read()
    for got, vals in zip(back, values, strict=True):
        for g, v in zip(got, vals, strict=True):
            np.testing.assert_array_equal(g, v)
