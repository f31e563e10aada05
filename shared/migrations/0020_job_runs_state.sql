-- The launcher's sweeps and reconcile ask for runs by state every fraction of a second
-- (STARTING, RUNNING, COMPLETING, REQUEUED: a handful); without an index each read every
-- run that ever ended (3.5-4.4 ms a query after 20,000, and rising).
CREATE INDEX job_runs_state ON job_runs (state);
