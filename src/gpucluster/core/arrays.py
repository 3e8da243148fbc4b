"""Job arrays and sweeps, as pure rules: which indices an array spec names, and what values
element `i` of a sweep sees.

Why here and not in the API: the head, the simulator and the CLI all read the same syntax
(Slurm's `--array 0-199:2%16`), and an element's sweep values are derived from its index at
launch time, so the elements of a 100,000-element sweep can share one stored spec.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpucluster.core.states import JobState
from gpucluster.errors import GpuclusterError

MAX_ARRAY_ELEMENTS = 100_000  # above this a submission must say it means it (`--yes`)
MAX_ARRAY_ELEMENTS_CONFIRMED = 1_000_000  # the hard cap, even with `--yes`
MAX_ARRAY_INDEX = 10_000_000

SweepValue = str | int | float | bool
SWEEP_RESERVED = ("random", "seed")  # keys of a `sweep:` mapping that are options, not parameters
_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


# What `gpucluster cancel|hold|release|requeue ID --state S` selects among an array's elements (as
# `scancel --state=PENDING`): queued: waiting in the queue, held or not; held: only the held ones.
ELEMENT_STATES = ("queued", "held", "running", "preempted")


def selected(state: JobState, held: bool, wanted: Collection[str]) -> bool:
    """Whether an element in `state` (held or not) is among the `wanted` ELEMENT_STATES."""
    if state is JobState.QUEUED:
        return "queued" in wanted or (held and "held" in wanted)
    return state.value in wanted


class ArraySyntaxError(ValueError, GpuclusterError):
    """An array spec or a sweep that cannot be read; the message says how to write it."""


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, no repeats
    throttle: int | None  # at most this many elements run at once; None: no limit


def parse_array(text: str, max_elements: int = MAX_ARRAY_ELEMENTS_CONFIRMED) -> ArraySpec:
    """`0-199%16`, `0-99:2`, `1,5,7`, `0-9,20-29%4` -> the indices and the throttle."""
    body, pct, throttle_text = text.strip().partition("%")
    throttle: int | None = None
    if pct:
        if not throttle_text.isdigit():
            raise ArraySyntaxError(f"array {text!r}: the throttle after % must be a whole number, e.g. 0-199%16")
        throttle = int(throttle_text)
        if throttle < 1:
            raise ArraySyntaxError(f"array {text!r}: a throttle of {throttle} would never run anything; use %1 or more")
    if not body:
        raise ArraySyntaxError("array is empty; write indices such as 0-199, 0-99:2 or 1,5,7")
    indices: set[int] = set()
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ArraySyntaxError(
                f"array {text!r}: cannot read {part.strip()!r}; "
                "write N, N-M, N-M:STEP or a list N,M,... (e.g. 0-99:2%8)"
            )
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first:
            raise ArraySyntaxError(f"array {text!r}: the range {part.strip()!r} ends before it starts")
        if step < 1:
            raise ArraySyntaxError(f"array {text!r}: the step in {part.strip()!r} must be 1 or more")
        if last > MAX_ARRAY_INDEX:
            raise ArraySyntaxError(f"array {text!r}: indices go up to {MAX_ARRAY_INDEX:,}")
        if (last - first) // step + 1 + len(indices) > max_elements:
            raise ArraySyntaxError(f"array {text!r}: more than {max_elements:,} elements")
        indices.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(indices)), throttle)


def check_size(count: int, confirmed: bool) -> None:
    """Refuse an array or sweep too large to have been meant, unless confirmed (`--yes`)."""
    if count > MAX_ARRAY_ELEMENTS_CONFIRMED:
        raise ArraySyntaxError(f"{count:,} elements; an array may have at most {MAX_ARRAY_ELEMENTS_CONFIRMED:,}")
    if count > MAX_ARRAY_ELEMENTS and not confirmed:
        raise ArraySyntaxError(
            f"{count:,} elements is more than {MAX_ARRAY_ELEMENTS:,}; confirm with --yes (allow_large_array: true)"
        )


@dataclass(frozen=True)
class Sweep:
    """A sweep's parameters (name -> values) and, for random sampling, how many points and the seed."""

    params: tuple[tuple[str, tuple[SweepValue, ...]], ...]
    random: int | None = None
    seed: int = 0

    @property
    def count(self) -> int:
        if self.random is not None:
            return self.random
        n = 1
        for _, values in self.params:
            n *= len(values)
        return n

    def values(self, index: int) -> dict[str, SweepValue]:
        """Element `index`'s values: the grid in row-major order (the last parameter varies
        fastest), or the `index`-th of `random` points drawn with `seed` (each element's draw
        depends only on the seed and its index, so no element needs another's)."""
        if not 0 <= index < self.count:
            raise IndexError(f"sweep element {index} out of 0..{self.count - 1}")
        if self.random is not None:
            rng = random.Random(f"{self.seed}:{index}")
            return {name: rng.choice(values) for name, values in self.params}
        out: dict[str, SweepValue] = {}
        for name, values in reversed(self.params):
            index, at = divmod(index, len(values))
            out[name] = values[at]
        return dict(reversed(list(out.items())))

    def all_values(self) -> list[dict[str, SweepValue]]:
        if self.random is not None:
            return [self.values(i) for i in range(self.count)]
        names = [n for n, _ in self.params]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in self.params))]


def parse_sweep(raw: Mapping[str, object]) -> Sweep:
    """`{lr: [1e-3, 3e-4], batch: [32, 64]}` (grid) or with `random: N` and `seed: S` (sampled)."""
    params: list[tuple[str, tuple[SweepValue, ...]]] = []
    for name, values in raw.items():
        if name in SWEEP_RESERVED:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.upper().startswith("GPUCLUSTER_"):
            raise ArraySyntaxError(f"sweep: {name!r} is not usable as an environment variable name (A-Z, 0-9, _)")
        if not isinstance(values, Sequence) or isinstance(values, str) or not values:
            raise ArraySyntaxError(f"sweep: {name}: give a non-empty list of values, e.g. {name}: [1, 2]")
        for v in values:
            if not isinstance(v, str | int | float):
                raise ArraySyntaxError(f"sweep: {name}: values are numbers or text, not {type(v).__name__}")
        params.append((name, tuple(values)))
    if not params:
        raise ArraySyntaxError("sweep: no parameters; e.g. sweep: {lr: [0.001, 0.0003]}")
    count = raw.get("random")
    seed = raw.get("seed", 0)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ArraySyntaxError("sweep: random: give how many points to draw, a whole number of 1 or more")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ArraySyntaxError("sweep: seed: a whole number")
    if count is None and "seed" in raw:
        raise ArraySyntaxError("sweep: seed is for random sampling; add random: N")
    sweep = Sweep(tuple(params), count, seed)
    if sweep.count > MAX_ARRAY_ELEMENTS_CONFIRMED:
        raise ArraySyntaxError(f"sweep: {sweep.count:,} points; at most {MAX_ARRAY_ELEMENTS_CONFIRMED:,}")
    return sweep


def text_of(value: SweepValue) -> str:
    """How a value is written into an environment variable or a command: YAML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def substitute(argv: Sequence[str], values: Mapping[str, SweepValue]) -> list[str]:
    """`{lr}` -> the element's lr in every argument; braces naming no parameter are left as they are."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return text_of(values[name]) if name in values else m.group(0)

    return [_PLACEHOLDER.sub(one, a) for a in argv]


def element_env(array_id: int, index: int, count: int, values: Mapping[str, SweepValue]) -> dict[str, str]:
    """What an element's processes get: which array and element they are (Slurm's name too, so a
    script written for `sbatch --array` runs unchanged) and the sweep's values."""
    env = {name: text_of(v) for name, v in values.items()}
    env.update(
        {
            "GPUCLUSTER_ARRAY_ID": str(array_id),
            "GPUCLUSTER_ARRAY_INDEX": str(index),
            "GPUCLUSTER_ARRAY_COUNT": str(count),
            "SLURM_ARRAY_JOB_ID": str(array_id),
            "SLURM_ARRAY_TASK_ID": str(index),
            "SLURM_ARRAY_TASK_COUNT": str(count),
        }
    )
    return env
