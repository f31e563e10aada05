-- Muster: one role per service (docs/security.md, "The database"); shared/db_roles.py
-- writes the same statements, `muster up` runs them. Run as the superuser AFTER the
-- migrations (the superuser owns the schema; the services cannot create or alter it):
--   psql -v ON_ERROR_STOP=1 -d muster -f roles.sql   (replace each CHANGE_ME first)
-- Written by `python -m shared.db_roles > deploy/postgres/roles.sql`; a unit test checks
-- that the two agree.
BEGIN;
REVOKE ALL ON DATABASE "muster" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- admission
DO $$ BEGIN CREATE ROLE muster_admission LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SET LOCAL password_encryption = 'scram-sha-256';
ALTER ROLE muster_admission LOGIN PASSWORD 'CHANGE_ME_admission';
GRANT CONNECT ON DATABASE "muster" TO muster_admission;
GRANT USAGE ON SCHEMA public TO muster_admission;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM muster_admission;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO muster_admission;
GRANT INSERT, UPDATE, DELETE ON jobs, partition_policy, qos_limits, reservations, api_nonces, node_policy, outbox, inbox TO muster_admission;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO muster_admission;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM muster_admission;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(double precision, integer) TO muster_admission;
-- placer
DO $$ BEGIN CREATE ROLE muster_placer LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SET LOCAL password_encryption = 'scram-sha-256';
ALTER ROLE muster_placer LOGIN PASSWORD 'CHANGE_ME_placer';
GRANT CONNECT ON DATABASE "muster" TO muster_placer;
GRANT USAGE ON SCHEMA public TO muster_placer;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM muster_placer;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO muster_placer;
GRANT INSERT, UPDATE, DELETE ON placer_lease, allocations, allocation_nodes, allocation_gpus, pending_reasons, placer_cycles, preemptions, outbox, inbox TO muster_placer;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO muster_placer;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM muster_placer;
-- launcher
DO $$ BEGIN CREATE ROLE muster_launcher LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SET LOCAL password_encryption = 'scram-sha-256';
ALTER ROLE muster_launcher LOGIN PASSWORD 'CHANGE_ME_launcher';
GRANT CONNECT ON DATABASE "muster" TO muster_launcher;
GRANT USAGE ON SCHEMA public TO muster_launcher;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM muster_launcher;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO muster_launcher;
GRANT INSERT, UPDATE, DELETE ON job_runs, attempts, worker_exits, node_cleanings, launcher_shards, launcher_replicas, launcher_mailbox, job_steps, outbox, inbox TO muster_launcher;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO muster_launcher;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM muster_launcher;
-- health
DO $$ BEGIN CREATE ROLE muster_health LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SET LOCAL password_encryption = 'scram-sha-256';
ALTER ROLE muster_health LOGIN PASSWORD 'CHANGE_ME_health';
GRANT CONNECT ON DATABASE "muster" TO muster_health;
GRANT USAGE ON SCHEMA public TO muster_health;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM muster_health;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO muster_health;
GRANT INSERT, UPDATE, DELETE ON nodes, gpus, health_lease, cluster_hours, outbox, inbox TO muster_health;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO muster_health;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM muster_health;
-- fairshare
DO $$ BEGIN CREATE ROLE muster_fairshare LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SET LOCAL password_encryption = 'scram-sha-256';
ALTER ROLE muster_fairshare LOGIN PASSWORD 'CHANGE_ME_fairshare';
GRANT CONNECT ON DATABASE "muster" TO muster_fairshare;
GRANT USAGE ON SCHEMA public TO muster_fairshare;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM muster_fairshare;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO muster_fairshare;
GRANT INSERT, UPDATE, DELETE ON usage, usage_charges, usage_hours, fairshare_state, job_priorities, outbox, inbox TO muster_fairshare;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO muster_fairshare;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM muster_fairshare;
COMMIT;
