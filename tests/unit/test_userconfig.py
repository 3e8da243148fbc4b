"""The client config file: where the token comes from, and that it stays private."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

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
            return c._connections.first._headers.get("Authorization")

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


# The plain reader (issue 18: the CLI reads the file without importing PyYAML) must read every
# file exactly as PyYAML does, or decline. Lines mix the shapes `save_head` writes with what YAML
# reads otherwise: booleans, nulls, numbers, dates, quotes, flow style, comments, bad indents.
_WORDS = [
    *("gc_Ab-9_x", "http://127.0.0.1:8642", "https://far:1/x", "yes", "No", "null", "on", "1.5", "0x1F"),
    *("2026-01-01", ".inf", "~", "a:", "a:b", "'q'", "[a]", "{}", "a#b", "x=y", "y", "Off", "url", "heads"),
]
_word = st.sampled_from(_WORDS) | st.text(alphabet="aZ09_.:/-@%+~=#'\"[]{},!&* ", min_size=1, max_size=8)
_line = st.one_of(
    st.builds(lambda k, v: f"{k}: {v}", st.sampled_from(["url", "token", "other"]), _word),
    st.sampled_from(["heads:", "url:", "token:", "# a comment", "", "---", "heads: {}", "  # indented"]),
    st.builds(lambda k, v: f"  {k}: {v}", _word, _word),
    st.builds(lambda k, v, sep: f"{k}:{sep}{v}", _word, _word, st.sampled_from(["", "  ", "\t", " # "])),
)


@settings(max_examples=600, deadline=None)
@given(lines=st.lists(_line, max_size=6))
def test_the_plain_reader_reads_as_yaml_does_or_declines(lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    plain = userconfig._read_plain(text)
    if plain is None:
        return
    assert plain == (yaml.safe_load(text) or {}), text


@settings(max_examples=200, deadline=None)
@given(
    url=st.sampled_from(["http://127.0.0.1:8642", "https://head.example:8642", "http://[::1]:9"]),
    heads=st.dictionaries(
        st.builds(lambda p: f"http://127.0.0.1:{p}", st.integers(1, 65535)),
        st.builds(lambda t: f"gc_{t}", st.text(alphabet="abcXYZ0189-_", max_size=43)),
        max_size=3,
    ),
)
def test_the_file_up_writes_is_read_without_pyyaml(url: str, heads: dict[str, str], tmp_path_factory: Any) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    for head, token in heads.items():
        userconfig.save_head(head, token, path)
    userconfig.save_head(url, None, path)
    text = path.read_text()
    expected = yaml.safe_load(text)
    plain = userconfig._read_plain(text)
    if "[" in url:  # a flow-style character: PyYAML quotes it, and the plain reader declines
        assert plain is None or plain == expected
    else:
        assert plain == expected, text
