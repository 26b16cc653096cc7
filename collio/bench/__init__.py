"""collio-bench: an IOR-style benchmark, and the command line of the planner simulator.

``collio.bench.cli.main`` is the ``collio-bench`` console script; the simulator
(:mod:`collio.sim`, ``--simulate``) is pure numpy and needs no MPI job.  The APIs the
benchmark compares are a registry (:mod:`collio.bench.apis`).
"""

from .cli import main

__all__ = ["main"]
