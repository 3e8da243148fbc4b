"""The API's error answers, declared in one place so that the OpenAPI document tells the truth.

Every error has the one shape `ErrorBody` ({"error": "...", "detail": [...]}), in JSON, even
where the success is plain text (a job's logs). Which errors a route can answer follows from
what it is, not from a list kept by hand beside each route:

- a route that needs a token (every rule but `public`): 401, 403, 429;
- a route with path or query parameters, or a body: 422; with a body: 400 (unreadable JSON)
  and 413 (too large);
- a route with path parameters (a job, node, user or token), or one that declares `x-job-query`
  (a `job` query parameter that must name a job the caller may see): 404;
- a route that changes something (any method but GET/HEAD): 409 (the state forbids it now),
  503 and 507 (the data dir is read-only or full: nothing was changed).

`document_errors` makes the app publish them: `openapi_with_errors` adds them to each operation
of the document FastAPI generates, from what the operation itself says (its `x-access` rule, its
parameters, its body, its method).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import FastAPI, Path

from gpucluster.auth.rules import ACCESS_KEY, Rule
from gpucluster.models import MAX_SQL_INT, ErrorBody

# Ids are SQL integers: a larger one is a 422 at the edge, not an overflow in the store.
MAX_ID = MAX_SQL_INT
Id = Annotated[int, Path(ge=1, le=MAX_ID)]

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "the body is not readable JSON",
    401: "no token, or one that is unknown, expired or revoked",
    403: "the caller may not do this; `error` says why",
    404: "no such job, attempt, node, user or token",
    409: "the current state forbids it (e.g. cancelling a job that has ended)",
    413: "the request body is larger than the head accepts",
    422: "a parameter or the body is not valid; `error` names the field and what is allowed",
    429: "too many requests with this token; retry after `Retry-After` seconds",
    503: "the data dir is read-only: nothing was changed",
    507: "the data dir is full: nothing was changed",
}

# Declared (openapi_extra) by a route whose `job` query parameter answers 404 for a job the
# caller may not see, as a path's job id does.
JOB_QUERY_KEY = "x-job-query"

_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def errors_of(method: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses an operation of the OpenAPI document can answer (see the docstring)."""
    out: set[int] = set()
    if operation.get(ACCESS_KEY, Rule.SIGNED_IN.value) != Rule.PUBLIC.value:
        out |= {401, 403, 429}
    params = operation.get("parameters", [])
    has_body = "requestBody" in operation
    if params or has_body:
        out.add(422)
    if has_body:
        out |= {400, 413}
    if operation.get(JOB_QUERY_KEY) or any(p.get("in") == "path" for p in params):
        out.add(404)
    if method.upper() not in ("GET", "HEAD"):
        out |= {409, 503, 507}
    return out


def document_errors(app: FastAPI) -> None:
    """Publish every operation's error answers in the app's OpenAPI document."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_with_errors(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_with_errors(doc: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document with each operation's error answers, every one a JSON ErrorBody.

    Done on the document rather than on the routes: it sees every route however it was added
    (FastAPI keeps included routers' routes apart), with the facts that decide: its `x-access`
    rule, parameters, body and method."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}"))
    for operations in doc.get("paths", {}).values():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status in sorted(errors_of(method, operation)):
                declared = responses.setdefault(str(status), {})
                if _own_body(declared):
                    continue
                declared["description"] = ERROR_DESCRIPTIONS[status]
                declared["content"] = dict(_ERROR_CONTENT)
            operation["responses"] = dict(sorted(responses.items()))
    # FastAPI's own 422 shape is never answered (create_app's handler answers an ErrorBody).
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'"#/components/schemas/{unused}"' not in json.dumps(doc.get("paths", {})):
            schemas.pop(unused, None)
    return doc


def _own_body(response: dict[str, Any]) -> bool:
    """Whether a route declared this answer with a body of its own (GET /v1/health's 503 is its
    usual report, saying what is wrong), which stays as declared."""
    refs = [str(m.get("schema", {}).get("$ref", "")) for m in (response.get("content") or {}).values()]
    return any(r and not r.endswith(("/ErrorBody", "/HTTPValidationError")) for r in refs)
