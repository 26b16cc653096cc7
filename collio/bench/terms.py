"""The cost model's terms measured on this machine, for ``collio-bench --calibrate``.

Each figure is what one physical cost takes here, measured the way a call's round pays
it: a core's memory copy with every rank copying, MPI's bandwidth and a message's cost
between two ranks (the other ranks asleep), the time all ranks take to meet, a round's
exchange with every rank polling (its bytes, its runs, the rendezvous of 64 KiB
messages), and the cores per node (the storage's write and read bandwidth come from
the ceiling's calls, in :mod:`collio.bench.calibrate`).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..waits import quiet_barrier

__all__ = ["SINGLE_COPY_BYTES", "measure_terms", "median_terms"]

_COPY_BYTES = 64 << 20  # past every cache: the copies of a round are megabytes
_MIN_COPY = 1 << 20  # (each rank's share of it, at least)
_MESSAGE_BYTES = 256  # the small pieces a block-cyclic round is made of
_MESSAGES = 2000
_MEETINGS = 30
_PAIR_BYTES = 1 << 20  # a column-block round's message from a rank to an aggregator
#: A message past MPICH's single-copy threshold (16 KiB; the cost model's
#: ``handshake_bytes``): a rendezvous, whose ends wait for each other, but few bytes.
_HANDSHAKE_BYTES = 64 << 10
#: MPICH's ``MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD`` default: messages this long or longer
#: move by single copy, after a rendezvous.
SINGLE_COPY_BYTES = 16 << 10
_EXCHANGES = 9


def _one_rank(comm: MPI.Intracomm, ranks: tuple[int, ...], work: Any) -> float:
    """Collective: ``work()`` timed on ``ranks`` while the others sleep; rank 0's figure."""
    value = work() if comm.rank in ranks else 0.0
    quiet_barrier(comm)
    return float(comm.bcast(value, root=0))


def _copy_bandwidth(comm: MPI.Intracomm, cores: int) -> float:
    """Collective over `comm`: bytes per second a core copies while every rank copies at
    once, as a round's copies run (the page cache's, a read's packing, a two-level
    group's staging): a host's bytes over the time from its first rank's start to its
    last rank's end (ranks sharing a core copy in turns), per core busy.  One process
    alone copies faster: the others' copies share the memory with it.  The host's ranks
    share :data:`_COPY_BYTES` (past every cache, whatever their number)."""
    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        n = max(_COPY_BYTES // host.size, _MIN_COPY)
        src = np.ones(n, np.uint8)
        dst = np.zeros_like(src)  # (touched: a first copy into fresh pages costs more)
        spans = []
        for _ in range(5):
            comm.Barrier()
            t0 = time.perf_counter()
            np.copyto(dst, src)
            t1 = time.perf_counter()
            quiet_barrier(comm)  # (ranks done sleep: polling, they would take turns)
            # (perf_counter is the host's monotonic clock: comparable between its ranks)
            first = host.allreduce(t0, op=MPI.MIN)
            spans.append(host.allreduce(t1, op=MPI.MAX) - first)
        slowest = float(comm.allreduce(statistics.median(spans), op=MPI.MAX))
        return host.size * n / slowest / max(1, min(host.size, cores))
    finally:
        host.Free()


def _one_way(comm: MPI.Intracomm, spec: Any, ack: Any) -> float:
    """Median seconds of ``spec`` sent from rank 0 to rank 1 and a small ``ack`` back
    (the ack makes the time the transfer's, not the send's return), of five."""
    return statistics.median(_round_trips(comm, spec, ack, 1) for _ in range(5))


def _round_trips(comm: MPI.Intracomm, spec: Any, ack: Any, n: int) -> float:
    """Seconds of ``n`` round trips between ranks 0 and 1: ``spec`` from rank 0, ``ack``
    back."""
    peer = 1 - comm.rank
    t0 = time.perf_counter()
    for _ in range(n):
        if comm.rank == 0:
            comm.Send(spec, dest=peer)
            comm.Recv(ack, source=peer)
        else:
            comm.Recv(spec, source=peer)
            comm.Send(ack, dest=peer)
    return time.perf_counter() - t0


def _message_bandwidth(comm: MPI.Intracomm) -> float:
    """Bytes per second of a large message from rank 0 to rank 1: the copy MPI does
    for a round's bytes between two processes (single-copy or through its cells)."""
    buf = np.ones(_COPY_BYTES, np.uint8)
    return _COPY_BYTES / _one_way(comm, buf, buf[:1])


def _message_seconds(comm: MPI.Intracomm) -> float:
    """One-way time of a small message between ranks 0 and 1 (half a round trip)."""
    buf = np.zeros(_MESSAGE_BYTES, np.uint8)
    runs = [_round_trips(comm, buf, buf, _MESSAGES) / (2 * _MESSAGES) for _ in range(3)]
    return statistics.median(runs)


def _meeting_seconds(comm: MPI.Intracomm) -> float:
    """Collective over `comm`: the slowest rank's median time for every rank to send a
    tiny message to every other and receive theirs, every rank polling as in a round."""
    buf = np.zeros(8 * comm.size, np.uint8)
    out = np.empty_like(buf)
    peers = range(1, comm.size)
    times = []
    for _ in range(_MEETINGS):
        comm.Barrier()
        t0 = time.perf_counter()
        reqs = [comm.Isend(buf[:8], dest=(comm.rank + d) % comm.size) for d in peers]
        reqs += [comm.Irecv(out[8 * d : 8 * d + 8], source=(comm.rank - d) % comm.size)
                 for d in peers]  # fmt: skip
        MPI.Request.Waitall(reqs)
        times.append(time.perf_counter() - t0)
    return float(comm.allreduce(statistics.median(times), op=MPI.MAX))


def _exchange_seconds(comm: MPI.Intracomm, runs: bool, n: int = _PAIR_BYTES) -> float:
    """Collective over `comm`: the slowest rank's median time of a round's exchange,
    every rank sending ``n`` bytes to every rank (itself too) at once, all
    polling; with ``runs``, each message received as runs of :data:`_MESSAGE_BYTES`
    apart (a write's aggregator receives a round's small pieces so).

    A round's copies run on every core at once and share the memory: one pair alone
    (:func:`_message_bandwidth`, the others asleep) moves bytes faster than each of
    them does in a round.
    """
    p = comm.size
    src = np.ones(p * n, np.uint8)
    dst = np.zeros(2 * p * n, np.uint8)
    vec = MPI.BYTE.Create_vector(n // _MESSAGE_BYTES, _MESSAGE_BYTES, 2 * _MESSAGE_BYTES)
    vec.Commit()
    times = []
    try:
        for _ in range(_EXCHANGES):
            comm.Barrier()
            t0 = time.perf_counter()
            reqs = []
            for d in range(p):
                to, frm = (comm.rank + d) % p, (comm.rank - d) % p
                part = dst[2 * frm * n :]
                reqs.append(comm.Irecv([part, 1, vec] if runs else part[:n], source=frm))
                reqs.append(comm.Isend(src[to * n : (to + 1) * n], dest=to))
            MPI.Request.Waitall(reqs)
            times.append(time.perf_counter() - t0)
    finally:
        vec.Free()
    return float(comm.allreduce(statistics.median(times), op=MPI.MAX))


def measure_terms(comm: MPI.Intracomm, nnodes: int) -> dict[str, float]:
    """Collective over `comm`: copy bandwidth (a core's, every rank copying), message
    cost, the time ranks take to meet (a round's synchronisation), a round's exchange
    (its bytes and its runs), and cores per node, here.

    A round's exchange is measured as a round runs it, every rank at once, and its
    figures are per core: a node's bytes (``node_exchange_bandwidth``) and runs
    (``run_seconds``) are shared by its cores, whatever ranks it runs in turns.
    """
    p = comm.size
    hosts = len(set(comm.allgather(MPI.Get_processor_name())))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    copy = _copy_bandwidth(comm, cores or 1)
    mbw = _one_rank(comm, (0, 1), lambda: _message_bandwidth(comm)) if p > 1 else copy
    meet = _meeting_seconds(comm) if p > 1 else 0.0
    whole, pieces = _exchange_seconds(comm, False), _exchange_seconds(comm, True)
    shaken = _exchange_seconds(comm, False, _HANDSHAKE_BYTES)
    msg = _one_rank(comm, (0, 1), lambda: _message_seconds(comm)) if p > 1 else 0.0
    # emulated nodes on one host share its cores
    per_node = max(1, (cores or 1) * hosts // max(nnodes, 1))
    turns = max(1.0, p / max(nnodes, 1) / per_node)  # ranks sharing a core
    # the bytes' time is the large exchange's beyond the small one's (both pay a meeting
    # and a rendezvous a message); the small one's beyond its bytes and the meeting is
    # the rendezvous' waits, less what a message's processing in turns is priced already
    per_byte = max(whole - shaken, 0.1 * whole) / (p * (_PAIR_BYTES - _HANDSHAKE_BYTES))
    waits = shaken - meet - p * _HANDSHAKE_BYTES * per_byte
    runs = p * _PAIR_BYTES // _MESSAGE_BYTES  # each rank's in one exchange
    return {"copy_bandwidth": copy, "message_bandwidth": mbw, "message_seconds": msg,
            "cores_per_node": per_node, "round_seconds": meet,
            "run_seconds": max(pieces - whole, 0.0) / (runs * turns),
            "host_cores": float(cores or 1), "hosts": float(hosts),
            "node_exchange_bandwidth": p / per_byte / max(nnodes, 1),
            "handshake_seconds": max(waits / max(p - 1, 1) - msg * turns, 0.0) if p > 1 else 0.0,
            }  # fmt: skip


def median_terms(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each term's median over samples taken through the job (a shared machine's load
    changes during it, for the terms as for the calls)."""
    return {k: float(statistics.median(t[k] for t in samples)) for k in samples[0]}
