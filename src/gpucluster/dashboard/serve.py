"""How the head serves the dashboard (see the package's docstring); apart from the package so
that only the head, not the CLI, imports FastAPI."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"  # the dashboard's assets; `/` is its page
# The page is small and changes with the package: always revalidate, never serve a stale copy.
NO_CACHE = {"Cache-Control": "no-cache"}
DOCS = "/docs"
SWAGGER = f"{PREFIX}/swagger"  # Swagger UI's files (static/swagger/README.md says where from)


def mount(app: FastAPI) -> None:
    """Serve the dashboard page at `/`, its assets under `/ui/`, and the API's interactive docs
    at `/docs` (create the app with `docs_url=None`): Swagger UI from the head's own files, not
    FastAPI's default CDN, so the page is not blank on a cluster without internet access.

    Both are plain Starlette routes, not API operations: they stay out of the OpenAPI document
    and outside the API's token guard (which applies to API routes), because the browser must
    load the page before it can ask the user for a token.
    """

    async def index(_: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=NO_CACHE)

    async def docs(_: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
            # No badge from the online validator: it would send the document to swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    app.add_route("/", index, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route(DOCS, docs, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="dashboard")
