-- launcher: job steps (srun inside an allocation; docs/steps.md). One row per step,
-- written by the launcher replica that ran it; `muster show job` lists them.
CREATE TABLE job_steps (
    job_id     bigint NOT NULL REFERENCES jobs (job_id),
    step_id    int NOT NULL CHECK (step_id >= 0),
    attempt    int NOT NULL,
    argv       text[] NOT NULL,
    nodes      text[] NOT NULL,
    ntasks     int NOT NULL,
    state      text NOT NULL CHECK (state IN ('RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    exit_code  int,
    signal     int,
    message    text NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at   timestamptz,
    PRIMARY KEY (job_id, step_id)
);
