"""Every table the migrations create has one writing role, and no role writes another
service's table (shared/db_roles.py against shared/migrations/)."""

from __future__ import annotations

import re
from pathlib import Path

from shared import db_roles
from shared.db import migration_files


def created_tables() -> set[str]:
    sql = "\n".join(text for _, text in migration_files())
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql))


def test_every_table_the_migrations_create_has_a_writer() -> None:
    owned = {t for tables in db_roles.OWNED.values() for t in tables}
    known = owned | set(db_roles.PLUMBING) | set(db_roles.DERIVED) | {db_roles.MIGRATIONS_TABLE}
    missing = created_tables() - known
    assert not missing, f"name the writing service of {sorted(missing)} in shared/db_roles.py"


def test_no_table_has_two_writers() -> None:
    seen: dict[str, str] = {}
    for service, tables in db_roles.OWNED.items():
        for table in tables:
            assert table not in seen, f"{table}: {seen.get(table)} and {service}"
            seen[table] = service


def test_a_role_writes_its_own_tables_and_the_plumbing_only() -> None:
    statements = db_roles.role_statements("placer", "pw'd", "muster")
    writes = [s for s in statements if s.startswith("GRANT INSERT")]
    assert writes == [
        "GRANT INSERT, UPDATE, DELETE ON placer_lease, allocations, allocation_nodes,"
        " allocation_gpus, pending_reasons, placer_cycles, preemptions, outbox, inbox"
        " TO muster_placer"
    ]
    assert "ALTER ROLE muster_placer LOGIN PASSWORD 'pw''d'" in statements


def test_only_admission_may_call_the_purge_and_no_role_keeps_an_older_call() -> None:
    """Every role's earlier function grants are revoked; admission alone gets the purge
    (migration 0027), and the function's signature is the one the migration creates."""
    purge = "GRANT EXECUTE ON FUNCTION purge_finished_jobs(double precision, integer)"
    sql = "\n".join(text for _, text in migration_files())
    assert "CREATE FUNCTION purge_finished_jobs(keep_s double precision, batch int)" in sql
    for service in db_roles.OWNED:
        statements = db_roles.role_statements(service, "pw", "muster")
        role = db_roles.role_of(service)
        assert f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {role}" in statements
        calls = [s for s in statements if s.startswith("GRANT EXECUTE")]
        assert calls == ([f"{purge} TO {role}"] if service == "admission" else [])


def test_the_script_for_a_real_server_grants_what_muster_up_grants() -> None:
    """deploy/postgres/roles.sql is `db_roles.roles_script()`: it once fell behind (no
    write on `usage_hours` for fairshare, so every charge on a real server failed)."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "roles.sql"
    assert path.read_text() == db_roles.roles_script(), (
        "regenerate: python -m shared.db_roles > deploy/postgres/roles.sql"
    )
