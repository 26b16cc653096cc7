"""Hints parsing and the error hierarchy."""

from __future__ import annotations

import errno
import pickle

import pytest
from mpi4py import MPI

import collio
from collio.errors import classify, make_error
from collio.hints import Hints, parse_size


@pytest.mark.parametrize(
    "text,value",
    [("16777216", 16 << 20), ("16m", 16 << 20), ("4MiB", 4 << 20), ("1g", 1 << 30), (65536, 65536)],
)
def test_sizes(text, value):
    assert parse_size(text) == value


def test_from_dict_and_info():
    h = Hints.coerce(
        {
            "cb_nodes": "4",
            "cb_buffer_size": "8m",
            "cb_config_list": "*:*",
            "atomic_commit": "true",
            "striping_unit": 1048576,
        }
    )
    assert (h.cb_nodes, h.cb_buffer_size, h.per_node(), h.atomic_commit, h.striping_unit) == (
        4,
        8 << 20,
        None,
        True,
        1 << 20,
    )
    info = MPI.Info.Create()
    info.Set("cb_nodes", "2")
    info.Set("romio_cb_read", "disable")
    info.Set("cb_config_list", "*:1")
    h = Hints.coerce(info)
    info.Free()
    assert (h.cb_nodes, h.romio_cb_read, h.per_node()) == (2, "disable", 1)
    assert Hints.coerce(h) is h
    assert Hints.coerce({"free_replaced": " Commit"}).free_replaced == "commit"
    assert Hints().free_replaced == "automatic"


def test_unknown_hints_are_reported_not_dropped():
    with pytest.warns(collio.HintWarning, match="unknown hints ignored by collio: banana"):
        h = Hints.coerce({"banana": 3, "romio_ds_write": "disable"})
    assert dict(h.extra) == {"banana": "3", "romio_ds_write": "disable"}
    assert h.as_dict()["banana"] == "3"


@pytest.mark.parametrize(
    "hints,text",
    [
        ({"cb_nodes": 0}, "cb_nodes=0"),
        ({"cb_buffer_size": "lots"}, "not a size"),
        ({"romio_cb_write": "maybe"}, "must be one of"),
        ({"cb_config_list": "node1:2"}, "understands"),
        ({"atomic_commit": "perhaps"}, "not a boolean"),
        (
            {"free_replaced": "later"},
            "free_replaced='later' must be automatic, background, commit or reuse",
        ),
    ],
)
def test_bad_hints(hints, text):
    with pytest.raises(collio.HintError, match=text):
        Hints.coerce(hints)


def test_error_hierarchy_mixes_builtins():
    assert issubclass(collio.LayoutError, ValueError)
    assert issubclass(collio.BackendError, OSError)
    assert issubclass(collio.OverlapError, collio.CollioError)
    assert issubclass(collio.MismatchError, collio.LayoutError)
    e = collio.BackendError("rank 1: disk full", ranks=(1,), errno=errno.ENOSPC)
    assert e.errno == errno.ENOSPC and str(e) == "rank 1: disk full"
    again = pickle.loads(pickle.dumps(e))
    assert (
        type(again) is collio.BackendError and again.errno == errno.ENOSPC and again.ranks == (1,)
    )


def test_classify_builtins():
    assert classify(FileNotFoundError(2, "No such file or directory", "/x"))[:2] == (
        "BackendError",
        "no such file or directory: '/x'",
    )
    assert classify(TypeError("bad"))[0] == "LayoutError"
    assert classify(RuntimeError("boom"))[0] == "CollioError"
    assert isinstance(make_error("OverlapError", "m"), collio.OverlapError)
