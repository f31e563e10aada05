-- Admission: approval, operator holds, and the policy a job was admitted under.
-- Written by admission (it owns `jobs`); read by the placer in load_pending.

ALTER TABLE jobs
    ADD COLUMN needs_approval   boolean NOT NULL DEFAULT false,
    ADD COLUMN approved_by      text,
    ADD COLUMN approved_at      timestamptz,
    -- an operator's hold (on someone else's job) is lifted only by an operator
    ADD COLUMN held_by_operator boolean NOT NULL DEFAULT false,
    -- from the partition and QOS at admission, for the placer's JobRequest
    ADD COLUMN tier             int NOT NULL DEFAULT 0,
    ADD COLUMN preemptible      boolean NOT NULL DEFAULT true,
    ADD COLUMN can_preempt      boolean NOT NULL DEFAULT false,
    ADD COLUMN grace_s          int NOT NULL DEFAULT 0,
    ADD COLUMN min_runtime_s    int NOT NULL DEFAULT 0;

CREATE INDEX jobs_array ON jobs (array_job_id) WHERE array_job_id IS NOT NULL;
CREATE INDEX jobs_user_name ON jobs (user_name, name);
