"""An mpi4py MPI-IO program moved to collio by its import line alone.

    mpiexec -n 4 python examples/mpi_dropin.py [DIR]     # its file goes to DIR (default: .)

Below is a program as it was written for mpi4py's ``MPI.File``: a header written by
rank 0 at an explicit offset, a 2-D field through a subarray file view (``Write_all``),
a log of one line per rank in rank order (``Write_ordered``), a nonblocking collective
read back (``Iread_all``), then ``MODE_APPEND``; ``Set_size`` and ``Get_size``.  Its only change is
the import: ``from collio.mpi import MPI`` gives mpi4py's module with collio's ``File``,
so every ``MPI.File`` call below runs through collio (the collective ones through its
two-phase engine).  ``main`` then checks the file byte for byte with numpy.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from collio.mpi import MPI  # was: from mpi4py import MPI

SHAPE = (240, 320)  # the field, float64, C order, after a 64-byte header
HEADER = 64


def my_box(comm):
    """This rank's rows and columns of the field on a 2-D process grid."""
    dims = MPI.Compute_dims(comm.size, 2)
    cart = comm.Create_cart(dims)
    coords = cart.Get_coords(cart.rank)
    cart.Free()
    sizes = [n // d for n, d in zip(SHAPE, dims, strict=True)]
    starts = [c * s for c, s in zip(coords, sizes, strict=True)]
    return sizes, starts


def field(sizes, starts):
    rows = np.arange(starts[0], starts[0] + sizes[0])[:, None]
    cols = np.arange(starts[1], starts[1] + sizes[1])[None, :]
    return (rows * SHAPE[1] + cols).astype(np.float64)


def write_checkpoint(comm, path, step):
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_size(0)  # (an older checkpoint's bytes go)
    if comm.rank == 0:
        header = np.zeros(HEADER, np.uint8)
        header[:8] = np.frombuffer(np.int64(step).tobytes(), np.uint8)
        fh.Write_at(0, header)
    sizes, starts = my_box(comm)
    box = MPI.DOUBLE.Create_subarray(SHAPE, sizes, starts).Commit()
    fh.Set_view(HEADER, MPI.DOUBLE, box)
    fh.Write_all(field(sizes, starts))
    box.Free()
    end = HEADER + 8 * SHAPE[0] * SHAPE[1]
    fh.Set_view(end, MPI.CHAR, MPI.CHAR)  # the log: one line per rank, in rank order
    fh.Write_ordered(f"rank {comm.rank:4d} wrote step {step}\n".encode())
    fh.Close()


def read_checkpoint(comm, path):
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    step = np.empty(1, np.int64)
    fh.Read_at_all(0, step)
    sizes, starts = my_box(comm)
    box = MPI.DOUBLE.Create_subarray(SHAPE, sizes, starts).Commit()
    fh.Set_view(HEADER, MPI.DOUBLE, box)
    mine = np.empty(sizes)
    req = fh.Iread_all(mine)
    req.Wait()
    box.Free()
    size = fh.Get_size()
    fh.Close()
    return int(step[0]), mine, size


def append_note(comm, path):
    fh = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_APPEND)
    if comm.rank == 0:
        fh.Write(b"done\n")  # at the end: MODE_APPEND starts the pointer there
    fh.Close()


def main(comm=MPI.COMM_WORLD, directory="."):
    path = os.path.join(directory, "dropin.bin")
    write_checkpoint(comm, path, step=42)
    step, mine, size = read_checkpoint(comm, path)
    append_note(comm, path)
    assert step == 42
    np.testing.assert_array_equal(mine, field(*my_box(comm)))
    if comm.rank == 0:
        with open(path, "rb") as f:
            data = f.read()
        end = HEADER + 8 * SHAPE[0] * SHAPE[1]
        want = np.arange(SHAPE[0] * SHAPE[1], dtype=np.float64).tobytes()
        log = b"".join(f"rank {r:4d} wrote step 42\n".encode() for r in range(comm.size))
        assert data[:8] == np.int64(42).tobytes() and data[8:HEADER] == bytes(HEADER - 8)
        assert data[HEADER:end] == want, "the field differs"
        assert data[end:] == log + b"done\n", data[end:]
        assert size == end + len(log)
        print(f"{SHAPE} field, log and note over {comm.size} ranks through collio.mpi.File")
    comm.Barrier()


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
