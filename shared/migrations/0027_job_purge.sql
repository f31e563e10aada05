-- Finished jobs are purged once they ended longer ago than the cluster keeps them
-- (`MUSTER_JOB_KEEP_S`, a year by default; services/admission/purge.py). Before this, a
-- job's rows (the job, its run, attempts, steps, allocations, charges) stayed for ever,
-- and every table a busy cluster writes per job grew without bound.
--
-- One function removes a job and every row about it in one transaction, so no reader
-- ever sees half a job: a job whose run row is gone but whose job row is left would read
-- as PENDING. Its rows belong to four services; it runs with its owner's rights
-- (SECURITY DEFINER, as the waiting-set triggers do), and only admission's role may call
-- it (shared/db_roles.py). It decides the floor itself, so even that role can never
-- remove a job that ended less than 8 days ago (what the event stream can still
-- redeliver, plus a day: shared/retention.py INBOX_FLOOR_S), nor one not finished.
--
-- A job goes only once nothing about it can change: its run is in a terminal state
-- (the list below is `shared/states.py TERMINAL`; tests/service/test_purge.py checks
-- them against each other), ended before the cutoff, no allocation of it is live, no
-- step of it is RUNNING, its usage is settled, and no waiting job depends on it. A
-- batch takes at most `batch` of the oldest such jobs from the index below, skipping
-- rows another pruner or writer holds.
CREATE INDEX job_runs_ended ON job_runs (ended_at) WHERE ended_at IS NOT NULL;

CREATE FUNCTION purge_finished_jobs(keep_s double precision, batch int) RETURNS int
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    cutoff timestamptz := now() - make_interval(secs => greatest(keep_s, 8 * 86400));
    gone bigint[];
    depended bigint[];
    allocs bigint[];
BEGIN
    -- Nothing ended before the cutoff (a pass most periods): done, by the index's head.
    IF coalesce((SELECT min(ended_at) FROM job_runs), cutoff) >= cutoff THEN
        RETURN 0;
    END IF;
    -- A job a waiting job depends on stays while that job waits: its end is what the
    -- dependency is judged by (a FAILED job's afterok is never met; gone, it would read
    -- as met). An array's tasks stay while a waiting job names the array. Read first,
    -- so a batch is whole: the waiting set's specs, a few milliseconds a call.
    SELECT coalesce(array_agg(DISTINCT id), '{}') INTO depended FROM (
        SELECT jsonb_array_elements_text(d->'job_ids')::bigint AS id
          FROM waiting_jobs w JOIN jobs j USING (job_id),
               jsonb_array_elements(j.spec->'dependencies') d
    ) named;
    SELECT coalesce(array_agg(job_id), '{}') INTO gone FROM (
        SELECT r.job_id FROM job_runs r JOIN jobs j USING (job_id)
         WHERE r.ended_at < cutoff
           AND NOT (r.job_id = ANY(depended) OR coalesce(j.array_job_id, 0) = ANY(depended))
           AND r.state IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
                           'OUT_OF_MEMORY', 'PREEMPTED')
           AND NOT EXISTS (SELECT 1 FROM allocations a
                            WHERE a.job_id = r.job_id AND a.released_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM job_steps s
                            WHERE s.job_id = r.job_id AND s.state = 'RUNNING')
           AND NOT EXISTS (SELECT 1 FROM usage_charges c
                            WHERE c.job_id = r.job_id AND NOT c.settled)
         ORDER BY r.ended_at
         LIMIT greatest(batch, 0)
         FOR UPDATE OF r SKIP LOCKED
    ) head;
    IF cardinality(gone) = 0 THEN
        RETURN 0;
    END IF;
    SELECT coalesce(array_agg(alloc_id), '{}') INTO allocs
      FROM allocations WHERE job_id = ANY(gone);
    -- placer
    DELETE FROM preemptions WHERE victim_alloc_id = ANY(allocs);  -- by key: its victim's
    DELETE FROM allocation_gpus WHERE alloc_id = ANY(allocs);
    DELETE FROM allocation_nodes WHERE alloc_id = ANY(allocs);
    DELETE FROM allocations WHERE alloc_id = ANY(allocs);
    DELETE FROM pending_reasons WHERE job_id = ANY(gone);
    -- fairshare
    DELETE FROM usage_charges WHERE job_id = ANY(gone);
    DELETE FROM job_priorities WHERE job_id = ANY(gone);
    -- launcher
    DELETE FROM job_steps WHERE job_id = ANY(gone);
    DELETE FROM attempts WHERE job_id = ANY(gone);
    DELETE FROM worker_exits WHERE job_id = ANY(gone);
    DELETE FROM launcher_mailbox WHERE job_id = ANY(gone);
    DELETE FROM job_runs WHERE job_id = ANY(gone);
    -- admission (the waiting set follows by its cascade)
    DELETE FROM jobs WHERE job_id = ANY(gone);
    RETURN cardinality(gone);
END $$;
REVOKE ALL ON FUNCTION purge_finished_jobs(double precision, int) FROM PUBLIC;

