"""The services' gateway on a port of its own (`up --gateway-port`): connections to that port
reach the gateway at /NAME/ and nothing else; the head's own port keeps API and /serve/NAME/.
End to end over real HTTP: tests/e2e/test_services.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpucluster.services.gateway import MOUNT, GatewayRoutes


class Recorder:
    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)


def route(routes: GatewayRoutes, path: str, port: int, kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": kind, "path": path, "raw_path": path.encode(), "server": ("127.0.0.1", port)}
    asyncio.run(routes(scope, None, send))  # type: ignore[arg-type]
    return sent


def test_the_gateway_port_reaches_only_the_gateway_mounted_at_the_root() -> None:
    api, gateway = Recorder(), Recorder()
    routes = GatewayRoutes(api, gateway, gateway_port=9001)  # type: ignore[arg-type]
    for path in ("/clf/predict", "/v1/jobs", "/"):
        route(routes, path, 9001)
    assert api.scopes == [] and [s[MOUNT] for s in gateway.scopes] == ["/", "/", "/"]
    route(routes, "/serve/clf/predict", 9000)
    route(routes, "/v1/jobs", 9000)
    assert [s["path"] for s in api.scopes] == ["/v1/jobs"]
    assert MOUNT not in gateway.scopes[-1] and gateway.scopes[-1]["path"] == "/serve/clf/predict"
    # A WebSocket on the gateway port is refused at the handshake, never handed to the API.
    assert route(routes, "/clf/ws", 9001, kind="websocket") == [{"type": "websocket.close", "code": 1008}]
    assert len(api.scopes) == 1


def test_a_gateway_port_equal_to_the_api_port_is_one_clear_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpucluster.cli.main", "up", "--data-dir", str(tmp_path), "--port", "8123",
         "--gateway-port", "8123"],
        capture_output=True,
        text=True,
        timeout=60,  # refused before anything starts; a head that started instead would hang here
    )  # fmt: skip
    assert r.returncode == 1 and "--gateway-port must differ from --port (8123)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
