"""``collio-bench --sweep``: time per collective call from 8 bytes to 128 MiB per rank.

A time series writes one step per call into a file it keeps open; the sweep does the
same with collio and with ROMIO through mpi4py, the APIs alternating call by call, at
each size and in two patterns (:mod:`.work`), then reads the steps back.  A batch
writes many arrays in one call (``collio.File.write_all_many``) against as many single
calls, and open / sync / close are timed on their own.  Modules: :mod:`.work` (what a
step holds, pure), :mod:`.callers` (the APIs), :mod:`.run` (the loops under MPI),
:mod:`.report` (medians, ratios, tables, plot), :mod:`.config` and :mod:`.main` (the
command line).
"""
