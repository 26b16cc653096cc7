"""The planner for virtual ranks: what a collective call would do, without MPI or files.

``collio-bench --simulate`` is its command line.  Pure numpy: the layouts of every
virtual rank (:mod:`collio.sim.batch`), per-window counts by arithmetic
(:mod:`collio.sim.windows`), the engine's own choices from :mod:`collio.policy`
(:mod:`collio.sim.simulator`), the report (:mod:`collio.sim.report`) and the cost
model that predicts a call's time from its plan (:mod:`collio.sim.cost`).
"""

from .cost import Cluster, format_predictions, predict, predictions_json, strategies
from .report import format_sim, plan_speed, sim_json
from .simulator import SimConfig, SimResult, simulate

__all__ = [
    "Cluster",
    "SimConfig",
    "SimResult",
    "format_predictions",
    "format_sim",
    "plan_speed",
    "predict",
    "predictions_json",
    "sim_json",
    "simulate",
    "strategies",
]
