"""Executor handles are typed (executors/base.py `Handle`), but the store keeps them as JSON: a row
written by an earlier head, with fields this head does not name, still loads and is polled."""

from __future__ import annotations

import json
from pathlib import Path

from gpucluster.executors.base import Exited, as_handle, complete, expected_processes
from gpucluster.executors.local import LocalExecutor


def test_an_old_rows_handle_loads_and_its_finished_ranks_are_polled(tmp_path: Path) -> None:
    for rank, code in ((0, 0), (1, 3)):
        run_dir = tmp_path / f"rank-{rank}"
        run_dir.mkdir()
        (run_dir / "exit.json").write_text(json.dumps({"exit_code": code, "signal": None}))
    # As a head before typed handles stored it; pid 0 with its ticks names no live process.
    row = json.dumps({
        "ranks": [
            {"rank": r, "pid": 0, "pgid": 0, "start_ticks": 1, "run_dir": str(tmp_path / f"rank-{r}"), "legacy": "x"}
            for r in (0, 1)
        ],
        "expected": 2,
        "run_dir": str(tmp_path),
    })  # fmt: skip
    handle = as_handle(json.loads(row))
    assert complete(handle) and expected_processes(handle) == 2
    executor = LocalExecutor(fork_server=False)
    assert [s.exit_code for s in executor.poll_ranks(handle) if isinstance(s, Exited)] == [0, 3]
    assert handle["ranks"][0].get("legacy") == "x"  # kept, for whoever wrote it
