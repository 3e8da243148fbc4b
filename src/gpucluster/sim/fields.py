"""Typed reading of one YAML mapping, with errors that name the file, line and key.

Why a helper and not pydantic: the spec's errors must carry the YAML line of the exact key, and
its units (durations like `4h`, memory like `80GiB`) read the way the rest of gpucluster reads
them; a dozen small typed getters do that with less machinery than a pydantic model plus a
mapping from pydantic's error locations back to lines.
"""

from __future__ import annotations

import math
from typing import Any

from gpucluster.durations import parse_duration
from gpucluster.sim.yamlspec import Located, Path_
from gpucluster.sizes import parse_mib


class Fields:
    """The mapping at `path` in a located document; every getter validates and explains."""

    def __init__(self, doc: Located, path: Path_, allowed: tuple[str, ...]) -> None:
        self.doc = doc
        self.path = path
        value = _get(doc.data, path)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise doc.error(path, f"must be a mapping of {', '.join(allowed)}; got {_kind(value)}")
        self.data: dict[Any, Any] = value
        for key in value:
            if key not in allowed:
                raise doc.error((*path, key), f"unknown key; allowed here: {', '.join(allowed)}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def fail(self, key: str, message: str) -> Exception:
        return self.doc.error((*self.path, key), message)

    def text(self, key: str, default: str | None = None) -> str:
        v = self.data.get(key, default)
        if v is None:
            raise self.fail(key, "is required")
        if isinstance(v, bool) or not isinstance(v, str | int | float) or not str(v).strip():
            raise self.fail(key, f"must be a non-empty name; got {_kind(v)}")
        return str(v).strip()

    def integer(self, key: str, default: int | None = None, minimum: int = 0, maximum: int | None = None) -> int:
        v = self.data.get(key, default)
        if v is None:
            raise self.fail(key, "is required")
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
            raise self.fail(key, f"must be a whole number; got {v!r}")
        if v < minimum or (maximum is not None and v > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise self.fail(key, f"must be {bound}; got {int(v)}")
        return int(v)

    def number(self, key: str, default: float | None = None, minimum: float = 0.0) -> float:
        v = self.data.get(key, default)
        if v is None:
            raise self.fail(key, "is required")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(key, f"must be a number; got {v!r}")
        if v < minimum:
            raise self.fail(key, f"must be at least {minimum:g}; got {v!r}")
        return float(v)

    def duration(self, key: str, default: str | float) -> float:
        v = self.data.get(key, default)
        try:
            seconds = parse_duration(str(v)) if not isinstance(v, bool) else math.nan
        except ValueError as e:
            raise self.fail(key, str(e)) from None
        if math.isnan(seconds):
            raise self.fail(key, f"must be a duration such as 90s, 30m, 4h or 1d; got {v!r}")
        return seconds

    def memory_mb(self, key: str, default: str | None = None) -> int:
        v = self.data.get(key, default)
        if v is None:
            raise self.fail(key, "is required")
        try:
            return parse_memory_mb(str(v))
        except ValueError as e:
            raise self.fail(key, str(e)) from None

    def boolean(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false; got {v!r}")
        return v

    def mapping(self, key: str) -> dict[Any, Any]:
        v = self.data.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.fail(key, f"must be a mapping; got {_kind(v)}")
        return v

    def sequence(self, key: str) -> list[Any]:
        v = self.data.get(key)
        if not isinstance(v, list) or not v:
            raise self.fail(key, f"must be a non-empty list; got {_kind(v)}")
        return v


def parse_memory_mb(text: str) -> int:
    """'80GiB' -> 81920 MiB; 'GB' and 'GiB' both mean GiB here, as NVML and vendors mix them
    (sizes.py: the one size parser)."""
    try:
        return parse_mib(text)
    except ValueError:
        raise ValueError(f"cannot read memory size {text!r}; use e.g. 80GiB or 16384MiB") from None


def _get(data: Any, path: Path_) -> Any:
    for p in path:
        if isinstance(p, int):
            data = data[p] if isinstance(data, list) and p < len(data) else None
        else:
            data = data.get(p) if isinstance(data, dict) else None
    return data


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return repr(v)
