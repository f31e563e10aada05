-- launcher: replicas share the jobs by shard (job_id % 32). Each shard is a lease row
-- with a fencing epoch (services/launcher/owners.py): its holder renews it; an expired
-- shard is taken by another replica, which bumps the epoch. Holder names are unique per
-- process incarnation, so a restarted or deposed replica is never taken for the owner.
CREATE TABLE launcher_shards (
    shard      int PRIMARY KEY,
    holder     text NOT NULL DEFAULT '',
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT 'epoch'
);
INSERT INTO launcher_shards (shard) SELECT generate_series(0, 31);

CREATE FUNCTION launcher_shard(job_id bigint) RETURNS int LANGUAGE sql IMMUTABLE
    AS $$ SELECT (job_id % 32)::int $$;

-- Replicas seen lately: the fair share of shards is 32 over their number.
CREATE TABLE launcher_replicas (
    holder  text PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);

-- Events a replica received for a job it does not own, kept for the owner (which
-- drains its shards' rows), so no event is lost to a replica that cannot act on it.
CREATE TABLE launcher_mailbox (
    id        bigserial PRIMARY KEY,
    job_id    bigint NOT NULL,
    event     bytea NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX launcher_mailbox_shard ON launcher_mailbox (launcher_shard(job_id), id);

-- A persisted restart backoff / requeue delay: a new owner resumes the start (or the
-- end) of a STARTING (COMPLETING) run no earlier than this.
ALTER TABLE job_runs ADD COLUMN resume_at timestamptz;

-- The last line of defence: a launcher transaction names its replica and the epoch it
-- holds the job's shard at (`muster.launcher_holder`, `muster.launcher_epoch`, set by
-- owners.py with the shard check); a write of a job's rows by a replica that does not
-- hold the job's shard at that epoch, unexpired, is refused. Writes
-- that name no replica (migrations, operators' tools, tests) are not launcher writes.
CREATE FUNCTION launcher_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    me text := current_setting('muster.launcher_holder', true);
BEGIN
    IF me IS NULL OR me = '' THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM launcher_shards
        WHERE shard = launcher_shard(NEW.job_id) AND holder = me
          AND epoch = current_setting('muster.launcher_epoch', true)::bigint
          AND expires_at > now();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'launcher % does not own job % (shard %): fenced off',
            me, NEW.job_id, launcher_shard(NEW.job_id) USING ERRCODE = 'P0001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER job_runs_fenced BEFORE INSERT OR UPDATE ON job_runs
    FOR EACH ROW EXECUTE FUNCTION launcher_fence();
CREATE TRIGGER attempts_fenced BEFORE INSERT OR UPDATE ON attempts
    FOR EACH ROW EXECUTE FUNCTION launcher_fence();
CREATE TRIGGER worker_exits_fenced BEFORE INSERT OR UPDATE ON worker_exits
    FOR EACH ROW EXECUTE FUNCTION launcher_fence();
