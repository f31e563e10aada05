-- The CPU time the job's processes used on the node a worker exited on (cgroup v2
-- cpu.stat usage_usec, v1 cpuacct.usage; NULL: no cgroup, or not readable): sacct's
-- TotalCPU, and seff's CPU efficiency against its CPUs times its wall-clock time.
ALTER TABLE worker_exits ADD COLUMN cpu_usec bigint;
