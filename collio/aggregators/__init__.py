"""The planner: who aggregates, which file domain each owns, and the rounds.

Pure functions of numpy arrays and hints: no MPI, no files.  That is what lets
:mod:`collio.bench` simulate 65,536 ranks on a laptop and what the tests check
against brute force.
"""

from .domains import active_domains, call_domains, file_domains, spread_domains, window_size
from .plan import AggregatorPlan, SenderPlan, plan_aggregator, plan_sender
from .select import choose_aggregators, default_cb_nodes

__all__ = [
    "AggregatorPlan",
    "active_domains",
    "call_domains",
    "SenderPlan",
    "choose_aggregators",
    "default_cb_nodes",
    "file_domains",
    "plan_aggregator",
    "plan_sender",
    "spread_domains",
    "window_size",
]
