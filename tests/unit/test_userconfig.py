"""The client config file: where the token comes from, and that it stays private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpucluster import userconfig
from gpucluster.client import Client


def test_the_head_token_is_saved_private_and_other_entries_survive(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "config.yaml"
    path.parent.mkdir()
    path.write_text("url: https://far:1\ntoken: gc_default\n")
    userconfig.save_head_token("http://127.0.0.1:1/", "gc_one", path)
    userconfig.save_head_token("http://127.0.0.1:2", "gc_two", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cfg = userconfig.load(path)
    assert cfg.url == "https://far:1" and cfg.token == "gc_default"
    assert cfg.token_for("http://127.0.0.1:1") == "gc_one" and cfg.token_for("http://127.0.0.1:2/") == "gc_two"
    assert cfg.token_for("http://elsewhere:3") == "gc_default"


def test_the_client_takes_the_token_from_argument_then_env_then_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    monkeypatch.setenv(userconfig.ENV_PATH, str(path))
    monkeypatch.delenv("GPUCLUSTER_URL", raising=False)
    userconfig.save_head_token("http://127.0.0.1:8642", "gc_file", path)

    def sent(**kw: str) -> str | None:
        with Client(**kw) as c:
            return c._http.headers.get("authorization")

    assert sent() == "Bearer gc_file"
    monkeypatch.setenv("GPUCLUSTER_TOKEN", "gc_env")
    assert sent() == "Bearer gc_env"
    assert sent(token="gc_arg") == "Bearer gc_arg"
    monkeypatch.delenv("GPUCLUSTER_TOKEN")
    assert sent(url="http://127.0.0.1:9") is None  # a token is never sent to another head


def test_a_broken_config_file_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("heads: [not, a, mapping]\n")
    with pytest.raises(userconfig.ConfigError, match=f"{path}: heads must map head URLs to tokens"):
        userconfig.load(path)
    path.write_text("url: [\n")
    with pytest.raises(userconfig.ConfigError, match="is not valid YAML"):
        userconfig.load(path)
