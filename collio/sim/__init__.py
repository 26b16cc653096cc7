"""The planner for virtual ranks: what a collective call would do, without MPI or files.

``collio-bench --simulate`` is its command line.  Pure numpy: the layouts of every
virtual rank (:mod:`collio.sim.batch`), per-window counts by arithmetic
(:mod:`collio.sim.windows`), the engine's own choices from :mod:`collio.policy`
(:mod:`collio.sim.simulator`), and the report (:mod:`collio.sim.report`).
"""

from .report import format_sim, plan_speed, sim_json
from .simulator import SimConfig, SimResult, simulate

__all__ = ["SimConfig", "SimResult", "format_sim", "plan_speed", "sim_json", "simulate"]
