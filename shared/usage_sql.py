"""SQL shared by the services that show what a job used: its workers' exits, as the
launcher records them (`worker_exits`: each node's cgroup memory peak and CPU time)."""

from __future__ import annotations


def used_by_attempt(job: str, attempt: str) -> str:
    """What an attempt used, from its workers' exits (every generation, every node): the
    highest memory peak of one node and that node (MaxRSS, MaxRSSNode), and the CPU
    time of them all (TotalCPU); a subquery of the outer query's `job` and `attempt`
    columns (one row, NULLs before any exit)."""
    return f"""
  SELECT max(x.mem_peak_bytes) AS max_rss,
         (array_agg(x.node ORDER BY x.mem_peak_bytes DESC, x.node)
           FILTER (WHERE x.mem_peak_bytes IS NOT NULL))[1] AS max_rss_node,
         sum(x.cpu_usec)::bigint AS cpu_usec
  FROM worker_exits x WHERE x.job_id = {job} AND x.attempt = {attempt}
"""
