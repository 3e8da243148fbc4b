"""`Lazies`: values worked out on first read and kept in the object's own slots.

Why: the core's value types are slotted dataclasses (core/types.py), and a `JobRequest`'s
`demand`, `need` and `host` are worked out from its fields the first time a cycle reads them,
then read at every cycle after. A slot holds such a value inside the object, so a read after the
first is a C-speed member read, with no per-object `__dict__`.

Why slotted types at all: a cold scheduling cycle at 100,000 queued jobs reads every job's
fields several times (sorting in, ranking, answering each request), and with a `__dict__` per
job each read went through the object, its dict and the dict's values, each somewhere else in
memory: a pass reading one field of 100,000 jobs cost ~35 ms inside a cycle. Slotted, the fields
lie in the object itself (bench/RESULTS.md, "slotted value types").

How: a slot not yet set makes normal attribute lookup fail, and only then does Python call
`__getattr__`, which works the value out with the class's `_make_<name>` method and puts it in
the slot; later reads never reach `__getattr__` again. Two threads reading it first at once may
both work it out: the values are equal (a pure function of the frozen object), the last kept.
The slots are not dataclass fields: equality, hashing, `replace` and pickling read the fields
alone, and a copy works its values out again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


class Lazies:
    """Base of a slotted class whose subclass declares, in a `__slots__` of its own, values it
    works out on first read with a method `_make_<name>(self)` each (see the module)."""

    __slots__ = ()

    if not TYPE_CHECKING:  # hidden from mypy, which would then let any attribute name pass

        def __getattr__(self, name: str) -> object:
            make = getattr(type(self), "_make_" + name, None)
            if make is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            value = make(self)
            object.__setattr__(self, name, value)  # frozen dataclasses too: a slot, not a field
            return value
