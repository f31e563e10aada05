-- A pending job's placement fields (partition, QOS, nodes, GPUs, excluded nodes,
-- features) may now change in place (`muster update`, scontrol's Partition=, NumNodes=,
-- Gres=, ...). Admission counts each such change here; the placer reads the count with
-- the queue and, once it has written a cycle's allocations, withdraws any whose job's
-- count moved meanwhile (it planned by the old fields). Admission locks the job's row
-- FOR UPDATE, which waits on the key-share lock an allocation's insert takes on it, so
-- one of the two always sees the other: the update finds the job allocated (no longer
-- pending), or the placer finds the count moved.
ALTER TABLE jobs ADD COLUMN spec_version int NOT NULL DEFAULT 0;
