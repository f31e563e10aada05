-- The job's memory peak on the node a worker exited on, as its cgroup counted it
-- (memory.peak / memory.max_usage_in_bytes; NULL: no cgroup, or not readable): sacct's
-- MaxRSS and MaxRSSNode, and seff's memory efficiency against the job's --mem. Users
-- size --mem from it, and the placer counts --mem out of a node's memory.
ALTER TABLE worker_exits ADD COLUMN mem_peak_bytes bigint;
