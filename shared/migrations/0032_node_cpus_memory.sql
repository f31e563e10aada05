-- What a node has besides its GPUs, as its agent announces it at registration (the
-- machine's CPUs and memory, or MUSTER_CPUS / MUSTER_MEMORY_MIB where set): sinfo's
-- CPUS and MEMORY, admission's refusal of a --mem or --cpus-per-task no node of the
-- partition has, and the placer's choice of nodes big enough for a job. 0: not known
-- (an agent from before this), which every job fits.
ALTER TABLE nodes ADD COLUMN cpus int NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN memory_mib bigint NOT NULL DEFAULT 0;
