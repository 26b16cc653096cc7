"""A save, a load and a file's calls leave nothing for the cycle collector: a reference
cycle made per call keeps what it holds (a map of the file, a buffer) until the next
full collection, and that collection's time lands in some later call."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import collio
import collio.checkpoint as ckpt
from collio import layouts


@pytest.fixture
def garbage() -> Iterator[Callable[[Callable[[], Any]], list[str]]]:
    """``garbage(fn)``: the kinds of objects in cycles that ``fn`` left (after a first call
    of it, which may fill caches)."""

    def left(fn: Callable[[], Any]) -> list[str]:
        fn()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            fn()
            gc.collect()
            return sorted({type(o).__name__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    yield left


def test_a_checkpoint_save_and_load_make_no_cycles(tmp_path: Any, garbage: Any) -> None:
    path = f"{tmp_path}/c.ckpt"
    state = {"w": np.arange(300_000, dtype="<f4"), "b": np.arange(7, dtype="<i8")}
    assert garbage(lambda: ckpt.save(path, state)) == []

    def load() -> None:
        for maps in ("enable", "disable"):
            got = ckpt.load(path, {"w": None, "b": None}, hints={"checkpoint_map": maps})
            assert got["w"].tobytes() == state["w"].tobytes()

    assert garbage(load) == []
    assert garbage(lambda: ckpt.info(path)) == []


def test_a_files_calls_make_no_cycles(tmp_path: Any, garbage: Any) -> None:
    path = f"{tmp_path}/f.bin"
    lay = layouts.block((1000, 64), "<f8", grid=(1, 1))
    data = np.arange(64_000, dtype="<f8").reshape(1000, 64)

    def calls() -> None:
        with collio.open(path, "w") as f:
            f.write_all(data, lay)
        with collio.open(path, "r") as f:
            assert f.read_all(lay).tobytes() == data.tobytes()

    assert garbage(calls) == []


def test_an_error_whose_text_fails_is_still_named() -> None:
    """An agreement carries each rank's error as text: an exception whose ``__str__``
    raises still gives its class, on that rank as on the others."""
    from collio.errors import classify

    class Unsayable(RuntimeError):
        def __str__(self) -> str:
            raise ValueError("no text")

    name, text, _ = classify(Unsayable())
    assert name == "CollioError" and "Unsayable" in text
    assert classify(KeyError("k")) == ("CollioError", "KeyError: 'k'", None)
