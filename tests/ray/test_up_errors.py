"""`gpucluster up --ray` refuses what cannot work in one line, before touching anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster.cli.main import app


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--ray", "127.0.0.1:6379", "--virtual-gpus", "2"],
            "--ray takes its nodes and GPUs from Ray; drop --virtual-gpus",
        ),
        (["--ray", " "], "--ray needs an address"),
        (["--ray", "127.0.0.1:99999"], "expected HOST:PORT of the Ray head"),
        (["--ray", f"127.0.0.1:{_closed_port()}"], "nothing answers at 127.0.0.1:"),
    ],
)
def test_up_with_ray_refuses_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path / "data"), "--port", str(_closed_port()), *args])
    assert result.exit_code == 1, result.output
    assert says in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
