-- GPU time by the hour and by what the GPUs were doing (`muster report --cluster`, sreport's
-- `cluster Utilization`): the health monitor's liveness pass adds the seconds since its
-- previous pass to the state of every GPU (services/health/utilization.py), in the
-- transaction that holds its lease, so two monitors never count the same second. Kept
-- `MUSTER_USAGE_KEEP_S` (two years), trimmed by the health service's pruner.
CREATE TABLE cluster_hours (
    hour        timestamptz NOT NULL,
    state       text NOT NULL CHECK (state IN ('ALLOCATED', 'IDLE', 'PLANNED_DOWN', 'DOWN')),
    gpu_seconds double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, state)
);
