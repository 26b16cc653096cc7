"""collio-bench: an IOR-style benchmark and a planner simulator for virtual ranks.

``collio.bench.cli.main`` is the ``collio-bench`` console script; the simulator
(:mod:`collio.bench.simulate`) is pure numpy and needs no MPI job.  The APIs the
benchmark compares are a registry (:mod:`collio.bench.apis`).
"""

from .cli import main

__all__ = ["main"]
