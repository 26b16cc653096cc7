"""Helpers for collio's own tests and for backends that want to prove themselves.

* :mod:`collio.testing.backend_suite`: the conformance suite.  A backend's test class
  subclasses ``ByteBackendTests`` or ``ArrayBackendTests`` and supplies a target and a
  reader that bypasses collio; the suite tests what the backend's capabilities promise.
* :mod:`collio.testing.romio`: the same decompositions through mpi4py's ``MPI.File``
  (ROMIO), for byte-for-byte comparisons in the same run.
* :mod:`collio.testing.jobs`: a test's own ``mpiexec`` job or fresh Python, under a timeout.
* :mod:`collio.testing.s3`: moto's S3 server on 127.0.0.1 and a proxy that injects faults.
"""
