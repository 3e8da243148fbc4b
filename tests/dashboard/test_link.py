"""The dashboard's signed-in link: `gpucluster dashboard` and what `gpucluster up` announces."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster import userconfig
from gpucluster.cli.main import app
from gpucluster.dashboard.link import announce, dashboard_url


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.yaml"
    monkeypatch.setenv(userconfig.ENV_PATH, str(path))
    monkeypatch.delenv("GPUCLUSTER_TOKEN", raising=False)
    monkeypatch.delenv("GPUCLUSTER_URL", raising=False)
    return path


def test_token_goes_in_the_fragment_quoted() -> None:
    assert dashboard_url("http://h:1/") == "http://h:1/"
    assert dashboard_url("http://h:1", "gc_a/b+c") == "http://h:1/#token=gc_a%2Fb%2Bc"


def test_cli_prints_a_signed_in_link_from_the_config(config: Path) -> None:
    userconfig.save_head_token("http://127.0.0.1:9999", "gc_secret")
    runner = CliRunner()
    signed = runner.invoke(app, ["dashboard", "--url", "http://127.0.0.1:9999"])
    assert signed.exit_code == 0 and signed.stdout.strip() == "http://127.0.0.1:9999/#token=gc_secret"
    plain = runner.invoke(app, ["dashboard", "--url", "http://127.0.0.1:9999", "--no-token"])
    assert plain.stdout.strip() == "http://127.0.0.1:9999/"
    bad = runner.invoke(app, ["dashboard", "--url", "ftp://x"])
    assert bad.exit_code == 1 and "must be an http(s) URL" in bad.output and "Traceback" not in bad.output


def test_up_prints_the_token_only_to_a_terminal(config: Path) -> None:
    userconfig.save_head_token("http://127.0.0.1:9999", "gc_secret")
    log = io.StringIO()
    announce("http://127.0.0.1:9999", log)
    assert "gc_secret" not in log.getvalue() and "http://127.0.0.1:9999/" in log.getvalue()
    terminal = Tty()
    announce("http://127.0.0.1:9999", terminal)
    assert "http://127.0.0.1:9999/#token=gc_secret" in terminal.getvalue()
