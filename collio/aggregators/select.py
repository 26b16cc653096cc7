"""Choosing aggregator ranks, node-aware (pure)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..runs import displacements

__all__ = [
    "AGGREGATOR_BANDWIDTH",
    "STORAGE_TARGETS",
    "TARGET_BANDWIDTH",
    "choose_aggregators",
    "default_cb_nodes",
    "storage_aggregators",
]

I64 = npt.NDArray[np.int64]
#: The storage collio's defaults on several nodes are made for, and the cost model's
#: (:class:`collio.sim.Cluster`): a parallel file system of 64 targets (Lustre OSTs) of
#: 4 GB/s each, and 2 GB/s that one client process streams to it.
STORAGE_TARGETS = 64
TARGET_BANDWIDTH = 4e9
AGGREGATOR_BANDWIDTH = 2e9


def storage_aggregators(
    targets: int = STORAGE_TARGETS,
    target_bandwidth: float = TARGET_BANDWIDTH,
    aggregator_bandwidth: float = AGGREGATOR_BANDWIDTH,
) -> int:
    """Aggregators it takes for the storage targets' aggregate, not one aggregator's
    stream, to bound a call (128 with the defaults)."""
    return max(1, -(-int(targets * target_bandwidth) // max(1, int(aggregator_bandwidth))))


def default_cb_nodes(nprocs: int, nnodes: int, stripes: int | None = None) -> int:
    """collio's default aggregator count when ``cb_nodes`` is not given.

    On one node every rank aggregates: each rank then writes its share of the file
    concurrently, as the ceiling does (docs/design.md has the comparison of counts).
    On several nodes, at least one per node (each node's injection bandwidth takes an
    even share of the receiving, and in two-level calls an aggregator hears from few
    sources), one per stripe target (``stripes``, the hint ``striping_factor``), and
    :func:`storage_aggregators` (fewer leave the file system's targets idle: the cost
    model's storage term); never more than the ranks.  Not the rank count itself: at
    65,536 ranks that made every aggregator hear from every rank.
    """
    if nnodes <= 1:
        return max(1, nprocs)
    want = max(nnodes, int(stripes or 0), storage_aggregators())
    return max(1, min(nprocs, want))


def choose_aggregators(
    nodes: npt.ArrayLike,
    *,
    cb_nodes: int | None = None,
    per_node: int | None = None,
    stripes: int | None = None,
) -> I64:
    """Pick aggregator ranks, spread evenly over nodes and within each node.

    Parameters
    ----------
    nodes
        ``nodes[r]`` identifies the node of rank ``r`` (any integers).
    cb_nodes
        Total number of aggregators wanted (capped by the eligible ranks).
    per_node
        At most this many per node (``cb_config_list='*:N'``); None allows all.
    stripes
        The stripe count (hint ``striping_factor``) for :func:`default_cb_nodes`.

    Returns
    -------
    The chosen ranks, sorted, so file domain ``i`` belongs to the ``i``-th.
    """
    node = np.asarray(nodes, dtype=np.int64)
    nprocs = len(node)
    _, node_idx = np.unique(node, return_inverse=True)
    nnodes = int(node_idx.max()) + 1 if nprocs else 0
    order = np.argsort(node_idx, kind="stable")
    sizes = np.bincount(node_idx, minlength=nnodes)
    first = displacements(sizes)
    pos = np.empty(nprocs, np.int64)
    pos[order] = np.arange(nprocs) - first[node_idx[order]]
    size = sizes[node_idx]
    take = np.minimum(size, per_node) if per_node is not None else size
    # chosen positions: floor(i * size / take) for i < take; rank at pos p is the
    # i-th chosen where i = ceil(p * take / size) and floor(i*size/take) == p
    i = -(-pos * take // size)
    chosen = (i < take) & ((i * size) // take == pos)
    ranks = np.flatnonzero(chosen)
    # interleave nodes: all nodes' first choices, then their second, ...
    rr = np.lexsort((node_idx[ranks], i[ranks]))
    ranks = ranks[rr]
    want = default_cb_nodes(nprocs, nnodes, stripes) if cb_nodes is None else cb_nodes
    return np.sort(ranks[: max(1, min(want, len(ranks)))]).astype(np.int64)
