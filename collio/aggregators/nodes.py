"""Nodes and the local aggregators of two-level aggregation (pure).

A node map is an array ``nodes[r]``: any integer naming rank ``r``'s node (collio's
private communicator builds it from ``COMM_TYPE_SHARED``).  ``COLLIO_RANKS_PER_NODE=k``
replaces it by consecutive groups of ``k`` ranks (:func:`consecutive_nodes`), so that
tests and experiments on one machine see several nodes; every part of collio that
asks which node a rank is on asks the same map.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import numpy.typing as npt

from ..errors import HintError
from ..runs import displacements

__all__ = [
    "ENV_RANKS_PER_NODE",
    "LocalGroups",
    "consecutive_nodes",
    "local_groups",
    "node_shape",
    "ranks_per_node_from_env",
]

I64 = npt.NDArray[np.int64]
#: Environment variable: consecutive groups of this many ranks count as one node each.
ENV_RANKS_PER_NODE = "COLLIO_RANKS_PER_NODE"


def ranks_per_node_from_env() -> int | None:
    """``COLLIO_RANKS_PER_NODE`` as a positive int, None when unset or empty."""
    text = os.environ.get(ENV_RANKS_PER_NODE, "").strip()
    if not text:
        return None
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise HintError(f"{ENV_RANKS_PER_NODE}={text!r} must be a positive integer")
    return k


def consecutive_nodes(nranks: int, ranks_per_node: int) -> I64:
    """The node map of ``nranks`` ranks placed ``ranks_per_node`` to a node, in rank order."""
    return np.arange(nranks, dtype=np.int64) // max(1, int(ranks_per_node))


def node_shape(nodes: npt.ArrayLike) -> tuple[int, int]:
    """(number of nodes, ranks on the fullest node) of a node map."""
    node = np.asarray(nodes, dtype=np.int64)
    if not len(node):
        return 0, 0
    _, counts = np.unique(node, return_counts=True)
    return len(counts), int(counts.max())


@dataclasses.dataclass(frozen=True, slots=True)
class LocalGroups:
    """Ranks grouped around their local aggregators.

    ``leader[r]`` is the local aggregator of rank ``r`` (a rank of the same node, itself
    for a local aggregator); ``leaders`` are the local aggregators, sorted; ``group[r]``
    is the index of ``leader[r]`` in ``leaders``.
    """

    leader: I64
    leaders: I64
    group: I64

    @property
    def ngroups(self) -> int:
        return len(self.leaders)


def local_groups(nodes: npt.ArrayLike, per_node: int) -> LocalGroups:
    """Split each node's ranks into ``per_node`` groups of consecutive node positions.

    Group ``i`` of a node of ``S`` ranks starts at position ``floor(i*S/T)`` with
    ``T = min(per_node, S)`` (positions by rank order within the node), and its first
    rank is its local aggregator: the ranks :func:`~collio.aggregators.choose_aggregators`
    picks with ``per_node`` on every node.
    """
    node = np.asarray(nodes, dtype=np.int64)
    n = len(node)
    if n == 0:
        z = np.zeros(0, np.int64)
        return LocalGroups(z, z, z)
    _, idx = np.unique(node, return_inverse=True)
    idx = idx.reshape(-1).astype(np.int64)
    order = np.argsort(idx, kind="stable")
    sizes = np.bincount(idx).astype(np.int64)
    first = displacements(sizes)
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n, dtype=np.int64) - first[idx[order]]
    size = sizes[idx]
    take = np.minimum(size, max(1, int(per_node)))
    # the largest i with floor(i*S/T) <= p
    i = ((pos + 1) * take + size - 1) // size - 1
    lead_pos = (i * size) // take
    leader = order[first[idx] + lead_pos].astype(np.int64)
    leaders = np.unique(leader)
    group = np.searchsorted(leaders, leader).astype(np.int64)
    return LocalGroups(leader, leaders, group)
