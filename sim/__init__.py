"""Trace simulator: replays GPU-cluster traces through the placer's pure core.

from sim import run, load, make_cluster
result = run(load(path, "philly"), make_cluster(nodes=64), "muster")
"""

from sim.cluster import load_topology, make_cluster, openb_cluster
from sim.engine import POLICIES, PriorityFn, run
from sim.metrics import SimResult
from sim.workload import FORMATS, TraceJob, load

__all__ = [
    "FORMATS",
    "POLICIES",
    "PriorityFn",
    "SimResult",
    "TraceJob",
    "load",
    "load_topology",
    "make_cluster",
    "openb_cluster",
    "run",
]
