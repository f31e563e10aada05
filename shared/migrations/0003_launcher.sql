-- launcher: the coordinator core's state of each run (services/launcher/coordinator_core
-- JobRun as msgspec JSON) and when its next timer (settle, --signal, time limit) is due.
ALTER TABLE job_runs ADD COLUMN core jsonb;
ALTER TABLE job_runs ADD COLUMN due_at timestamptz;
CREATE INDEX job_runs_due ON job_runs (due_at) WHERE due_at IS NOT NULL;
