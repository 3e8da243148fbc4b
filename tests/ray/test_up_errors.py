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


CLOSED = "<a closed port>"  # replaced in the test by a port it holds closed


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--ray", "127.0.0.1:6379", "--virtual-gpus", "2"],
            "--ray takes its nodes and GPUs from Ray; drop --virtual-gpus",
        ),
        (["--ray", " "], "--ray needs an address"),
        (["--ray", "127.0.0.1:99999"], "expected HOST:PORT of the Ray head"),
        (["--ray", CLOSED], "nothing answers at 127.0.0.1:"),
    ],
)
def test_up_with_ray_refuses_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    # A port bound and never listened on refuses connections, and stays ours while the test runs:
    # one picked at collection time was taken by another test's Ray cluster 14 minutes later.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        args = [f"127.0.0.1:{held.getsockname()[1]}" if a == CLOSED else a for a in args]
        result = CliRunner().invoke(
            app, ["up", "--data-dir", str(tmp_path / "data"), "--port", str(_closed_port()), *args]
        )
    assert result.exit_code == 1, result.output
    assert says in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
