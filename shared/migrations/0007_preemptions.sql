-- Placer: the preemptions it asked for, one per victim allocation, so a victim in its
-- grace time is neither asked twice nor counted as free capacity for another job.
CREATE TABLE preemptions (
    victim_alloc_id bigint PRIMARY KEY REFERENCES allocations (alloc_id),
    victim_job_id   bigint NOT NULL,
    for_job_id      bigint NOT NULL,
    epoch           bigint NOT NULL,
    requested_at    timestamptz NOT NULL DEFAULT now()
);

-- A spare node the placer granted a fixed-size job after a fault: it stays allocated
-- while the launcher restarts the job onto it, until the job's run lists it.
-- One the job never took up (it ended, or did not want it any more) goes back after a
-- minute.
ALTER TABLE allocation_nodes
    ADD COLUMN spare_pending boolean NOT NULL DEFAULT false,
    ADD COLUMN added_at timestamptz NOT NULL DEFAULT now();
