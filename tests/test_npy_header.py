"""``collio.npy.npy_header``: the .npy header numpy itself writes, for every format version."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from collio.npy import npy_header


@pytest.mark.parametrize(
    "shape,dtype,order",
    [((3, 4), "<f8", "C"), ((3, 4), ">i2", "F"), ((), "<c16", "C"), ((5,), [("x", "<f4")], "C"),
     ((2,), [(f"field_with_a_long_name_{i}", "<f8") for i in range(3000)], "C"),
     ((3,), [("温度", "<f4"), ("x", "<i2")], "C")],  # utf-8 field names: format 3.0
)  # fmt: skip
def test_header_is_numpys_own(shape, dtype, order):
    arr = np.zeros(shape, dtype, order=order)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "stored array in format 2.0" (3.0)
        np.save(buf, arr)
    head = npy_header(shape, dtype, order)
    assert buf.getvalue()[: len(head)] == head
    assert len(head) % 64 == 0 and len(buf.getvalue()) == len(head) + arr.nbytes
