"""The user's client configuration: which head to talk to, and the token to show it.

Where: $GPUCLUSTER_CONFIG, else $XDG_CONFIG_HOME/gpucluster/config.yaml, else
~/.config/gpucluster/config.yaml. The file holds credentials, so it is written with mode 0600
(its directory 0700). Format:

    url: https://head.example:8642     # the default head (optional)
    token: gc_...                      # the token for any head not listed under `heads`
    heads:                             # a token per head URL; the first `gpucluster up` adds its own
      http://127.0.0.1:8642: gc_...

Tokens per head let one user (or one test) talk to several clusters without a token meant for
one being sent to another.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucluster.atomicfile import atomic_write_bytes
from gpucluster.errors import GpuclusterError

ENV_PATH = "GPUCLUSTER_CONFIG"


class ConfigError(RuntimeError, GpuclusterError):
    """The config file exists but cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class UserConfig:
    path: Path
    url: str | None = None
    token: str | None = None
    heads: dict[str, str] = field(default_factory=dict)

    def token_for(self, url: str) -> str | None:
        return self.heads.get(url.rstrip("/")) or self.token


def config_path() -> Path:
    explicit = os.environ.get(ENV_PATH)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpucluster" / "config.yaml"


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    data = _read_plain(text)
    if data is None:
        import yaml  # only for a file beyond the plain shape `up` writes (issue 18: the CLI starts light)

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping (url:, token:, heads:)")
    return data


# One plain YAML scalar that can only mean a string: it starts with a letter (YAML 1.1's numbers,
# dates and `.inf` start with a digit, a sign or a dot), holds no space, quote, `#`, `=`, `,`, or
# bracket, and (below) is none of YAML 1.1's booleans or nulls.
_PLAIN = r"[A-Za-z][A-Za-z0-9_./:@%+~-]*"
_TOP_LINE = re.compile(rf"(url|token|heads):(?: ({_PLAIN}))?")
_HEAD_LINE = re.compile(rf"  ({_PLAIN}): ({_PLAIN})")
_NOT_STRINGS = frozenset(["y", "yes", "n", "no", "true", "false", "on", "off", "null"])


def _is_string(scalar: str) -> bool:
    return not scalar.endswith(":") and scalar.lower() not in _NOT_STRINGS


def _read_plain(text: str) -> dict[str, Any] | None:
    """The file as `yaml.safe_load` reads it, when it has the plain shape `save_head` writes
    (`url: U`, `token: T`, `heads:` with `  U: T` lines, comments); None for anything else.

    Why: importing PyYAML is ~20 ms of CPU, a sixth of a CLI `submit` (issue 18), for a file of
    three kinds of line. Anything this reader is not sure of (quotes, flow style, a value YAML
    might read as a number or a boolean, a duplicate key) goes to PyYAML, so both read alike.
    """
    data: dict[str, Any] = {}
    heads: dict[str, str] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        top = _TOP_LINE.fullmatch(line)
        if top is not None:
            key, value = top.groups()
            if key in data or (value is not None and (key == "heads" or not _is_string(value))):
                return None
            heads = {} if key == "heads" else None
            data[key] = heads if key == "heads" else value
            continue
        entry = _HEAD_LINE.fullmatch(line)
        if entry is None or heads is None or entry[1] in heads or not (_is_string(entry[1]) and _is_string(entry[2])):
            return None
        heads[entry[1]] = entry[2]
    if data.get("heads") == {}:
        data["heads"] = None  # `heads:` alone is a null in YAML
    return data


def load(path: Path | None = None) -> UserConfig:
    path = path or config_path()
    data = _read(path)
    heads = data.get("heads") or {}
    if not isinstance(heads, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in heads.items()):
        raise ConfigError(f"{path}: heads must map head URLs to tokens")
    for key in ("url", "token"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string")
    return UserConfig(
        path=path, url=data.get("url"), token=data.get("token"), heads={k.rstrip("/"): v for k, v in heads.items()}
    )


def save_head_token(url: str, token: str, path: Path | None = None) -> Path:
    """Record `token` for the head at `url`, keeping the rest of the file; mode 0600."""
    return save_head(url, token, path, make_default=False)


def save_head(url: str, token: str | None, path: Path | None = None, make_default: bool = True) -> Path:
    """Record the head at `url` as the default (`url:`) and, when given, its token; keeps the rest.

    `gpucluster up` calls this at each start, so `up --port 9000` then `gpucluster jobs` reach the
    new head without --url or $GPUCLUSTER_URL (which still win over the file)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two heads starting at once must not lose an entry
        data = _read(path)
        if make_default:
            data["url"] = url.rstrip("/")
        if token is not None:
            found = data.get("heads")
            heads: dict[str, Any] = found if isinstance(found, dict) else {}
            heads[url.rstrip("/")] = token
            data["heads"] = heads
        import yaml  # here only: `up` writes the file, every command reads it

        text = "# gpucluster client configuration (holds tokens: keep it private)\n"
        text += yaml.safe_dump(data, sort_keys=False)
        atomic_write_bytes(path, text.encode(), mode=0o600)
    return path
