"""`lazy`: a property worked out on first read and kept on the object, without a lock.

Why not `functools.cached_property`: on Python 3.11 (the project's floor) its every first read
takes a lock (an `RLock` per property, shared by all instances) and goes through Python code
around it. `JobRequest.demand` and `.need` are first read by the first plan that sees a job: a
head's first plan after a start reads them for every queued job, 0.19 CPU-s at 100,000 queued
with the collector paused (as the head plans), 0.10 with this. Python 3.12 dropped the lock for
the same reason. Like it, `lazy` is a non-data descriptor: once the value is in the instance's
`__dict__`, reads find it there and never call `__get__`; it works on frozen dataclasses (the
write goes to `__dict__`, not through `__setattr__`). Two threads reading it first at once may
both work it out: the values are equal (a pure function of the object), the last one is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class lazy(Generic[T]):
    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> lazy[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | lazy[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value
