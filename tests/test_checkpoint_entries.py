"""What a save takes as an entry, a load as a spec, and a symlink as a target, on one
process (no mpiexec)."""

from __future__ import annotations

import numpy as np
import pytest

import collio
import collio.checkpoint as ckpt


def test_a_tuple_that_is_not_array_and_layout_is_refused_naming_the_entry(tmp_path: object) -> None:
    """``(a, b)`` of two arrays (or an array and a name) is not a replicated value numpy
    would stack, and ``[a, b]`` of ragged arrays is no array: each is refused, naming the
    entry; a tuple of numbers (numpy's scalars and 0-d arrays too) is a replicated value as
    before."""
    path = f"{tmp_path}/c.ckpt"
    a = np.arange(3.0)
    for entry, text in (((a, a), "second item is a ndarray, not a collio layout"),
                        ((a, "x"), "second item is a str"),
                        ([a, np.ones(2)], "inhomogeneous")):  # fmt: skip
        with pytest.raises(collio.LayoutError, match=f"entry 't': .*{text}"):
            ckpt.save(path, {"t": entry})
    betas = (np.float64(0.9), np.float64(0.999))  # (numbers, numpy's scalars or 0-d arrays)
    ckpt.save(path, {"t": (3, 4), "b": betas, "z": (np.array(1.0), np.array(2.0))})
    got = ckpt.load(path, {"t": None, "b": None, "z": None})
    assert got["t"].tolist() == [3, 4] and got["b"].tolist() == [0.9, 0.999]
    assert got["z"].tolist() == [1.0, 2.0]


def test_a_nested_spec_names_arrays_as_a_nested_state_does(tmp_path: object) -> None:
    path = f"{tmp_path}/c.ckpt"
    ckpt.save(path, {"opt": {"m": np.arange(4.0), "v": {"w": np.ones(2, "i4")}}, "x": np.zeros(1)})
    got = ckpt.load(path, {"opt": {"v": {"w": None}, "m": None}})
    assert sorted(got) == ["opt/m", "opt/v/w"]
    assert got["opt/m"].tolist() == [0, 1, 2, 3] and got["opt/v/w"].tolist() == [1, 1]
    with pytest.raises(collio.LayoutError, match="spec names 'opt/m' twice"):
        ckpt.load(path, {"opt": {"m": None}, "opt/m": None})


def test_a_save_through_a_symlink_replaces_the_file_it_names_and_keeps_the_link(
    tmp_path: object,
) -> None:
    """A rename over the link would replace the link with a regular file and leave the
    file it named (elsewhere: a scratch file system, say) with the old bytes. The link
    may dangle at first (nothing saved yet); an atomic collio.open goes the same way."""
    import os

    real, link = f"{tmp_path}/scratch", f"{tmp_path}/c.ckpt"
    os.mkdir(real)
    os.symlink(f"{real}/c.ckpt", link)
    for n in (3, 4, 5):
        ckpt.save(link, {"x": np.arange(float(n))})
        assert os.path.islink(link) and os.readlink(link) == f"{real}/c.ckpt"
        assert ckpt.load(f"{real}/c.ckpt", {"x": None})["x"].tolist() == list(range(n))
    assert sorted(os.listdir(tmp_path)) == ["c.ckpt", "scratch"]  # (no temporary, no spare)
    with collio.open(link, "w", hints={"atomic_commit": True}) as f:
        f.write_all(np.arange(8, dtype="u1"), collio.layouts.block((8,), "u1"))
    with open(f"{real}/c.ckpt", "rb") as fh:
        assert os.path.islink(link) and fh.read() == bytes(range(8))


def test_a_save_into_a_missing_directory_names_the_target_not_its_temporary(
    tmp_path: object,
) -> None:
    import errno

    path = f"{tmp_path}/absent/c.ckpt"
    with pytest.raises(collio.BackendError) as got:
        ckpt.save(path, {"x": np.ones(2)})
    assert f"cannot create the temporary of {path!r}" in str(got.value), str(got.value)
    assert ".tmp" not in str(got.value) and got.value.errno == errno.ENOENT
