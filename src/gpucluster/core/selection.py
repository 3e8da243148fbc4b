"""Node selection: which nodes a job may run on (Slurm's --nodelist, --exclude, --constraint)
and whether it holds its nodes alone (--exclusive).

Why a value of its own: the scheduler caches answers per request (`JobRequest.need`) and per
shape, and two jobs with different selections must never share them; a frozen, hashable value
carried in the request makes that automatic. A job without selection carries None, so the
scheduling path of such jobs pays one `is None` test.

A node's labels are plain strings: a flag (`ib`) or a `key=value` pair (`rack=r1`). A constraint
is any-of (`|`) groups of all-of (`&`) labels: `ib&rack=r1|nvswitch` reads as
(ib and rack=r1) or nvswitch, `&` binding tighter, as in Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpucluster.core.reasons import WaitFacts

# A label: a flag or key=value; letters, digits and . _ - / : in each part (no spaces, no & |).
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*(=[A-Za-z0-9._/:-]*)?$")
MAX_LABEL = 128


def label_error(label: str) -> str | None:
    """Why `label` is not a valid node label or constraint term, or None if it is."""
    if not label:
        return "an empty label; give a name like ib or key=value like rack=r1"
    if len(label) > MAX_LABEL:
        return f"label {label[:20]!r}... is longer than {MAX_LABEL} characters"
    if not _LABEL.match(label):
        return (
            f"bad label {label!r}: a label is a name like ib or key=value like rack=r1 "
            "(letters, digits, . _ - / : only)"
        )
    return None


def parse_constraint(text: str) -> tuple[tuple[str, ...], ...]:
    """`ib&rack=r1|nvswitch` -> (("ib", "rack=r1"), ("nvswitch",)); ValueError naming what is wrong."""
    groups: list[tuple[str, ...]] = []
    for alt in text.split("|"):
        terms = tuple(t.strip() for t in alt.split("&"))
        for t in terms:
            why = label_error(t)
            if why is not None:
                raise ValueError(f"{why}; a constraint is labels joined by & (all of) or | (any of), e.g. ib&rack=r1")
        groups.append(tuple(sorted(set(terms))))
    return tuple(sorted(set(groups)))


def constraint_text(groups: tuple[tuple[str, ...], ...]) -> str:
    return "|".join("&".join(g) for g in groups)


@dataclass(frozen=True)
class Selection:
    """Where a job may run. `nodelist`: only these nodes (None: any); `exclude`: never these;
    `constraint`: any-of groups of all-of labels (() : no constraint); `exclusive`: its nodes
    hold no other job while it runs, and it starts only on nodes where nothing runs."""

    nodelist: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    constraint: tuple[tuple[str, ...], ...] = ()
    exclusive: bool = False
    # Node pools (core/pools.py): nodes only pools closed to the job's team or class hold, and
    # those pools' names (for its wait). Set by `decide`, never by the submitter.
    denied: frozenset[str] = frozenset()
    closed_pools: tuple[str, ...] = ()

    @property
    def filters(self) -> bool:
        """Whether it limits the nodes at all (an exclusive job alone may go anywhere idle)."""
        return self.nodelist is not None or bool(self.exclude) or bool(self.constraint) or bool(self.denied)

    def allows(self, name: str, labels: frozenset[str]) -> bool:
        if self.nodelist is not None and name not in self.nodelist:
            return False
        if name in self.exclude or name in self.denied:
            return False
        return not self.constraint or any(all(t in labels for t in group) for group in self.constraint)

    def describe(self) -> str:
        """The selection as the options that asked for it: `--constraint ib --exclude n3`."""
        parts = []
        if self.nodelist is not None:
            parts.append(f"--nodelist {','.join(sorted(self.nodelist))}")
        if self.exclude:
            parts.append(f"--exclude {','.join(sorted(self.exclude))}")
        if self.constraint:
            parts.append(f"--constraint {constraint_text(self.constraint)}")
        if self.exclusive:
            parts.append("--exclusive")
        if self.closed_pools:
            parts.append(f"outside pool(s) {', '.join(self.closed_pools)} (closed to its team or class)")
        return " ".join(parts)


def selection_of(
    nodelist: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    constraint: str | None = None,
    exclusive: bool = False,
) -> Selection | None:
    """The selection of these options, or None when they select nothing (every node, shared)."""
    sel = Selection(
        frozenset(nodelist) if nodelist is not None else None,
        frozenset(exclude),
        parse_constraint(constraint) if constraint else (),
        exclusive,
    )
    return sel if sel.filters or sel.exclusive else None


def unmatched_facts(selection: Selection, labels: Mapping[str, frozenset[str]]) -> WaitFacts:
    """Why no node of `labels` (name -> its labels) matches: the selection and what the first
    few nodes offer, as Slurm's "Requested node configuration is not available" but saying which
    (the sentence: gpucluster/waits_text.py)."""
    shown = sorted(labels)[:5]
    return WaitFacts(
        variant="unmatched",
        selection=selection.describe(),
        labels=tuple((n, ",".join(sorted(labels[n]))) for n in shown),
        nodes_count=len(labels),
    )
