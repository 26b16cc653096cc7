"""Helpers for collio's own tests and for backends that want to prove themselves.

``collio.testing.backend_suite.BackendTests`` is the shared conformance suite:
a backend's test file subclasses it and sets ``backend`` and ``target``.
``collio.testing.romio`` writes and reads the same decompositions through
mpi4py's ``MPI.File`` (ROMIO) for byte-for-byte comparisons.
"""
