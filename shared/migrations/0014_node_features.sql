-- Node features (Slurm's Features=) and GPU types, for --constraint and --gres=gpu:TYPE:N.
-- health: what a node's agent announces from its topology file.
ALTER TABLE nodes ADD COLUMN features text[] NOT NULL DEFAULT '{}';

-- admission: what the cluster config's node sets give each node (published with the
-- partition policy); the placer adds these features to the node's own and takes the
-- GPU type from here when set (else it derives it from the NVML model name).
CREATE TABLE node_policy (
    node     text PRIMARY KEY,
    features text[] NOT NULL DEFAULT '{}',
    gpu_type text
);
