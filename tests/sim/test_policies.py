"""The shipped baseline policy files are the core's built-in baselines, read by the head's loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.policy import BUILTIN_POLICIES
from gpucluster.sim.scheduling import load_policy

POLICIES = Path(__file__).resolve().parents[2] / "examples" / "policies"


@pytest.mark.parametrize("name", ["fifo", "fifo-backfill", "priority", "default", "age", "las", "las-gittins"])
def test_shipped_policy_file_equals_the_builtin(name: str) -> None:
    from_file = load_policy(str(POLICIES / f"{name}.yaml"))
    assert from_file.name == name and from_file.source.endswith(f"{name}.yaml")
    assert from_file.core == BUILTIN_POLICIES[name]()
    assert load_policy(name).core == BUILTIN_POLICIES[name]()
