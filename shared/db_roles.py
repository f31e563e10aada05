"""Pure core: one PostgreSQL role per service, and the statements that grant it what
it may do. Every service reads every table (its snapshot joins other services' tables);
it writes only the tables it owns (docs/architecture.md, "Processes") and the plumbing
every service shares (outbox, inbox). The schema is owned by the superuser, who runs the
migrations before any service starts (`muster up`), so no service role can alter or
drop a table.
"""

from __future__ import annotations

ROLE_PREFIX = "muster_"
PLUMBING = ("outbox", "inbox")
# Kept by the database's own triggers from other tables' writes (migration 0019): no
# role writes them.
DERIVED = ("waiting_jobs",)
MIGRATIONS_TABLE = "schema_migrations"  # the superuser's: services only read it
OWNED: dict[str, tuple[str, ...]] = {
    "admission": (
        "jobs",
        "partition_policy",
        "qos_limits",
        "reservations",
        "api_nonces",
        "node_policy",
    ),
    "placer": (
        "placer_lease",
        "allocations",
        "allocation_nodes",
        "allocation_gpus",
        "pending_reasons",
        "placer_cycles",
        "preemptions",
    ),
    "launcher": (
        "job_runs",
        "attempts",
        "worker_exits",
        "node_cleanings",
        "launcher_shards",
        "launcher_replicas",
        "launcher_mailbox",
        "job_steps",
    ),
    "health": ("nodes", "gpus", "health_lease", "cluster_hours"),
    "fairshare": ("usage", "usage_charges", "usage_hours", "fairshare_state", "job_priorities"),
}
# Functions (the migrations') a role may call beyond what every role may: admission
# purges finished jobs, with every service's rows about them, in one transaction
# (migration 0027: the function sets its own floor and conditions, and runs with its
# owner's rights, so the role gains no write on those tables).
CALLS: dict[str, tuple[str, ...]] = {
    "admission": ("purge_finished_jobs(double precision, integer)",),
}


def role_of(service: str) -> str:
    if service not in OWNED:
        raise ValueError(f"unknown service {service!r}; one of {', '.join(OWNED)}")
    return ROLE_PREFIX + service


def role_statements(service: str, password: str, database: str) -> list[str]:
    """Create or update `service`'s role (SCRAM password) and set its grants exactly:
    what it held before is revoked first, so a table that changed owner loses its
    writer."""
    role = role_of(service)
    quoted = password.replace("'", "''")
    tables = ", ".join(OWNED[service] + PLUMBING)
    return [
        f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        "SET LOCAL password_encryption = 'scram-sha-256'",
        f"ALTER ROLE {role} LOGIN PASSWORD '{quoted}'",
        f'GRANT CONNECT ON DATABASE "{database}" TO {role}',
        f"GRANT USAGE ON SCHEMA public TO {role}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
        f"GRANT INSERT, UPDATE, DELETE ON {tables} TO {role}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {role}",
        *(f"GRANT EXECUTE ON FUNCTION {f} TO {role}" for f in CALLS.get(service, ())),
    ]


def lockdown_statements(database: str) -> list[str]:
    """Nobody but the roles granted above (and the superuser) connects or creates."""
    return [
        f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC',
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    ]


SCRIPT_HEAD = """\
-- Muster: one role per service (docs/security.md, "The database"); shared/db_roles.py
-- writes the same statements, `muster up` runs them. Run as the superuser AFTER the
-- migrations (the superuser owns the schema; the services cannot create or alter it):
--   psql -v ON_ERROR_STOP=1 -d muster -f roles.sql   (replace each CHANGE_ME first)
-- Written by `python -m shared.db_roles > deploy/postgres/roles.sql`; a unit test checks
-- that the two agree.
"""


def roles_script(database: str = "muster") -> str:
    """Every statement `muster up` runs for the roles, as a psql script for a real
    server (deploy/postgres/roles.sql), each password a placeholder."""
    lines = ["BEGIN;", *(f"{s};" for s in lockdown_statements(database))]
    for service in OWNED:
        lines.append(f"-- {service}")
        lines += [f"{s};" for s in role_statements(service, f"CHANGE_ME_{service}", database)]
    return SCRIPT_HEAD + "\n".join([*lines, "COMMIT;"]) + "\n"


if __name__ == "__main__":
    print(roles_script(), end="")
