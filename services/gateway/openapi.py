"""Pure: the gateway's OpenAPI 3.1 document, its schemas generated from the very
`shared.api` structs the routes decode and answer (msgspec's JSON Schema), so the
document cannot drift from the contracts."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from services.gateway.core import GpuMap, Page, Utilisation
from shared.api import (
    ApiError,
    JobSelector,
    NodesReply,
    Ok,
    ShowJobReply,
    SubmitReply,
    SubmitRequest,
)

_STRUCTS = (
    SubmitRequest,
    SubmitReply,
    JobSelector,
    Ok,
    Page,
    ShowJobReply,
    NodesReply,
    GpuMap,
    Utilisation,
    ApiError,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _query(*params: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "query", "required": False, "schema": {"type": t}, "description": d}
        for n, t, d in params
    ]


def _answer(schema: dict[str, Any], ok: str = "200") -> dict[str, Any]:
    refusal = {"content": {"application/json": {"schema": _ref("ApiError")}}}
    return {
        ok: {"description": "the result", "content": {"application/json": {"schema": schema}}},
        "4XX": {"description": "refused: `error` is the message the CLI prints", **refusal},
        "503": {"description": "the control plane is away; try again", **refusal},
    }


def _get(summary: str, schema: dict[str, Any], params: list[dict[str, Any]]) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": params, "responses": _answer(schema)}}


def _post(summary: str, body: str, schema: dict[str, Any], ok: str = "200") -> dict[str, Any]:
    content = {"application/json": {"schema": _ref(body)}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": content},
            "responses": _answer(schema, ok),
        }
    }


LISTS = "comma-separated; repeatable"
# A report's window: whole hours (services/fairshare/report.py `window`).
WINDOW = (
    ("since", "number", "epoch seconds; default yesterday 00:00 UTC"),
    ("until", "number", "epoch seconds; default now (today 00:00 without since)"),
)
JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer"}}
ANY_JSON: dict[str, Any] = {"type": "object"}


@cache
def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        _STRUCTS, ref_template="#/components/schemas/{name}"
    )
    paths = {
        "/api/whoami": _get("the user this gateway acts as", ANY_JSON, []),
        "/api/queue": _get(
            "one page of the queue (squeue), with counts by state and pending reason",
            _ref("Page"),
            _query(
                ("user", "string", LISTS),
                ("partition", "string", LISTS),
                ("state", "string", LISTS),
                ("account", "string", LISTS),
                ("name", "string", LISTS),
                ("job", "string", "job refs: 12, 12_3, 12_[1-3]"),
                ("all", "boolean", "every state, ended jobs too"),
                ("page", "integer", "from 1"),
                ("per_page", "integer", "at most 500"),
            ),
        ),
        "/api/jobs/{job_id}": {
            "get": {
                "summary": "one job (muster show): attempts, reasons, and its output's tail",
                "parameters": [
                    {
                        "name": "job_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer"},
                    }
                ],
                "responses": _answer(_ref("ShowJobReply")),
            }
        },
        "/api/nodes": _get("every node and its GPUs (muster nodes)", _ref("NodesReply"), []),
        "/api/gpumap": _get(
            "the GPU map: each GPU's state and job, counts by state",
            _ref("GpuMap"),
            _query(("page", "integer", "from 1"), ("per_page", "integer", "nodes per page")),
        ),
        "/api/share": _get(
            "the fair-share tree (muster share)",
            ANY_JSON,
            _query(("account", "string", LISTS), ("user", "string", LISTS)),
        ),
        "/api/report": _get(
            "GPU time used per account and user over whole hours (muster report)",
            ANY_JSON,
            _query(
                *WINDOW,
                ("account", "string", LISTS),
                ("user", "string", LISTS),
                ("accounts_only", "boolean", "no user rows"),
            ),
        ),
        "/api/cluster_report": _get(
            "the cluster's GPU time by state over whole hours (muster report --cluster)",
            ANY_JSON,
            _query(*WINDOW),
        ),
        "/api/sizes_report": _get(
            "allocated GPU time by job size per account (muster report --sizes)",
            ANY_JSON,
            _query(
                *WINDOW,
                ("account", "string", LISTS),
                ("grouping", "string", "the size ranges' lower bounds, e.g. 8,64,256"),
            ),
        ),
        "/api/acct": _get(
            "accounting records (muster acct)",
            ANY_JSON,
            _query(
                ("job", "string", LISTS),
                ("user", "string", LISTS),
                ("account", "string", LISTS),
                ("state", "string", LISTS),
                ("since", "number", "epoch seconds"),
                ("until", "number", "epoch seconds"),
                ("allocations", "boolean", "one record per job, no attempts"),
                ("limit", "integer", "at most 100000"),
            ),
        ),
        "/api/utilisation": _get(
            "mean GPUs held per time bucket over the last hours",
            _ref("Utilisation"),
            _query(("hours", "number", "default 6"), ("bucket_s", "number", "bucket width")),
        ),
        "/api/submit": _post(
            "submit a job (muster submit)", "SubmitRequest", _ref("SubmitReply"), "201"
        ),
        "/api/cancel": _post("cancel jobs (muster cancel)", "JobSelector", _ref("Ok")),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Muster gateway",
            "version": "1",
            "description": "The REST face of muster's request contracts (shared/api.py); "
            "every request acts as the gateway's one user. See docs/dashboard.md.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }
