"""How the head serves the dashboard (see the package's docstring); apart from the package so
that only the head, not the CLI, imports FastAPI."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"  # the dashboard's assets; `/` is its page
# The page is small and changes with the package: always revalidate, never serve a stale copy.
NO_CACHE = {"Cache-Control": "no-cache"}


def mount(app: FastAPI) -> None:
    """Serve the dashboard page at `/` and its assets under `/ui/`.

    Both are plain Starlette routes, not API operations: they stay out of the OpenAPI document
    and outside the API's token guard (which applies to API routes), because the browser must
    load the page before it can ask the user for a token.
    """

    async def index(_: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=NO_CACHE)

    app.add_route("/", index, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="dashboard")
