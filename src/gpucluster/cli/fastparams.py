"""Typer's parameter coercion, without pydantic for the plain values the CLI's options take.

Why: Typer (0.2x) coerces every parameter through a pydantic TypeAdapter, built when the
parameter is processed, even when its value is None; so `gpucluster jobs`, which has no
validation of its own to do, imported pydantic (~45 ms of CPU) and built three adapters (issue
19: a read command answers within 150 ms). Here each parameter gets a coercer that returns a
plain value itself when pydantic would return that very value: a str (valid UTF-8), a list of
them, a decimal int within the option's bounds; anything else (a bad number, a path, a float,
an out-of-range value) goes to the adapter Typer would have built, so what is accepted and
every error message stay Typer's own. If Typer's internals change shape, nothing is installed
and Typer works as it always did, only slower.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_DIGITS = re.compile(r"[0-9]{1,18}")
_NOT_PLAIN = object()


def _text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode()  # pydantic refuses lone surrogates (undecodable argv bytes): its message then
    except UnicodeEncodeError:
        return False
    return True


def _integer(value: Any, info: Any) -> Any:
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        return _NOT_PLAIN
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        return _NOT_PLAIN  # Typer's message (or clamp) for it
    return number


def plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """The value pydantic would return for `value`, when that is sure without it; else _NOT_PLAIN."""
    if getattr(info, "parser", None) is not None:
        return _NOT_PLAIN
    if annotation is str:
        return value if _text(value) else _NOT_PLAIN
    if annotation is int:
        return _integer(value, info)
    if annotation in (list[str], list[int]) and isinstance(value, list | tuple):
        items = [plain_value(annotation.__args__[0], info, v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    return _NOT_PLAIN


def install() -> bool:
    """Give each Typer parameter the coercer above; False (and nothing changed) if Typer differs."""
    try:
        from typer import core
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return False
    parameter = getattr(core, "_TyperParameter", None)
    if parameter is None or not hasattr(parameter, "get_runtime_param") or getattr(parameter, "_gc_plain", False):
        return bool(parameter is not None and getattr(parameter, "_gc_plain", False))

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        descriptor: Any = None
        _built: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, self.parameter_info, value)
            if plain is not _NOT_PLAIN:
                return plain
            if not self._built:
                self._built.append(build_runtime_param(self.descriptor))
            return self._built[0]._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            d = self.type_descriptor
            if d.file_annotation is None:
                self._runtime_param = PlainRuntimeParam(
                    parameter_info=d.parameter_info, annotation=d.annotation, descriptor=d
                )
            else:
                self._runtime_param = build_runtime_param(d)
        return self._runtime_param

    parameter.get_runtime_param = get_runtime_param
    parameter._gc_plain = True
    return True
