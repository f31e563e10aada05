"""Pure: what `--export` passes of the submitter's environment, as sbatch does.

Admission folds the exported part of the environment a client sent with its submission
into the job's `env` (`with_environment`), so the launcher never needs, and never
uses, the environment of any daemon (services/launcher/env.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.jobspec import JobSpec


def _export_terms(export: str) -> list[str]:
    return [t.strip() for t in export.split(",") if t.strip()]


def exported_env(export: str, base_env: Mapping[str, str]) -> dict[str, str]:
    """`base_env` as `--export` lets it through: ALL, NONE, or a list of names.

    Like Slurm: `ALL` (the default) passes everything; `NONE` passes nothing; a list
    passes only the named variables unless it also contains `ALL`
    (`--export=ALL,FOO=1`). `VAR=val` terms are assignments, see `export_assignments`.
    """
    terms = _export_terms(export)
    upper = {t.upper() for t in terms}
    if "ALL" in upper or not terms:
        return dict(base_env)
    if "NONE" in upper:
        return {}
    names = {t for t in terms if "=" not in t}
    return {k: v for k, v in base_env.items() if k in names}


def export_assignments(export: str) -> dict[str, str]:
    """The `VAR=val` terms of an `--export` list, as a dict."""
    pairs = (t.split("=", 1) for t in _export_terms(export) if "=" in t)
    return {k: v for k, v in pairs if k}


def with_environment(spec: JobSpec, environment: Mapping[str, str]) -> JobSpec:
    """`spec` with the exported part of the submitter's `environment` under its own
    explicit values (`--export=NAME=value` wins over the environment's NAME)."""
    if not environment:
        return spec
    return msgspec.structs.replace(spec, env=exported_env(spec.export, environment) | spec.env)
