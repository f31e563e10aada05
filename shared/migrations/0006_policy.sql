-- Admission publishes the placement policy of the cluster configuration here on every
-- load and reload (it owns these tables); the placer reads them in its cycle.

CREATE TABLE partition_policy (
    partition text PRIMARY KEY,
    nodes     text[],          -- NULL: every node
    tier      int NOT NULL DEFAULT 0,
    reserved_gpus int NOT NULL DEFAULT 0  -- GPUs on its nodes kept for its jobs alone
);

CREATE TABLE qos_limits (
    qos                  text PRIMARY KEY,
    max_gpus_per_user    int,
    max_jobs_per_user    int,
    max_gpus_per_account int,
    max_jobs_per_account int
);

-- Advance reservations and maintenance windows ([reservations.NAME] in the config).
CREATE TABLE reservations (
    name        text PRIMARY KEY,
    start_at    double precision NOT NULL,  -- epoch seconds
    duration_s  int NOT NULL,
    nodes       text[] NOT NULL DEFAULT '{}',
    gpus        int NOT NULL DEFAULT 0,
    accounts    text[] NOT NULL DEFAULT '{}',
    recurrence  text NOT NULL DEFAULT 'none',
    maintenance boolean NOT NULL DEFAULT false
);
