-- launcher: a job step (srun) outlives the launcher replica that started it. Each
-- RUNNING step has a coordinator (the replica waiting on its agents, a lease holder
-- name) and a lease it renews; a step whose lease ran out is claimed by another replica,
-- which asks the agents for the step again (adopt: they answer with its outcome, they
-- never start it twice) and records its end. srun names its step by its output folder,
-- so a request it sends again finds the step instead of starting a second one.
ALTER TABLE job_steps
    ADD COLUMN output_dir  text NOT NULL DEFAULT '',
    ADD COLUMN generation  int NOT NULL DEFAULT 0,
    ADD COLUMN coordinator text,
    ADD COLUMN lease_until timestamptz;
CREATE INDEX job_steps_by_folder ON job_steps (job_id, output_dir);
CREATE INDEX job_steps_leases ON job_steps (lease_until) WHERE state = 'RUNNING';
