"""HDF5 storage through the ordinary (serial) h5py wheel, shared by all ranks.

Every rank's HDF5 library makes the same calls through h5py's ``fileobj`` driver on a
:class:`~.vfile.VFile`: metadata lands in a per-rank overlay, the ranks agree that they
wrote the same (:mod:`.replica`) and rank 0 publishes it; raw data goes through the
two-phase engine, at a contiguous dataset's offset (:class:`~.storage.FileBackend`) or
as whole chunks encoded as HDF5 stores them (:mod:`.chunked`, :mod:`.codec`).

Two front ends use it: :mod:`collio.h5` (h5py objects, the ``collio`` driver) and
``collio.open(path, mode, backend="hdf5", dataset=...)`` (one dataset as a collio file,
:class:`~.dataset.Hdf5Backend`).  Importing this package imports no h5py; its modules do.
"""
