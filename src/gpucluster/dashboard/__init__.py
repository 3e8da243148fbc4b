"""The web dashboard: static HTML, CSS and JavaScript served by the head at `/`.

It holds no data and no logic of its own on the server: the page reads only the public HTTP API
(/v1/...) with the user's bearer token, like any other client. So it is served without
authentication (nothing secret is in it), needs no build step and no network beyond the head
(no CDN), and ships inside the package.

This package's `__init__` imports nothing: the CLI imports `dashboard.link` on every command, and
FastAPI (what `dashboard.serve` needs) would cost it a fifth of a second of CPU each time.
"""
