"""A Ray job's log under the head's --max-log-size, without a Ray cluster: the node agent is a
plain object (`NodeAgent`), and the head's side is `logfile.append_log`. The cap is kept on the
node (the shim rotates there, as for local jobs) and in the head's copy, and offsets name the
same bytes on both, even when the node rotated away bytes the head never copied.
(The same through a real `gpucluster up --ray`: test_ray_cluster.py.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpucluster.executors.base import LaunchSpec, Running
from gpucluster.executors.logfile import append_log, log_end, read_log
from gpucluster.executors.ray_agent import NodeAgent

LINE = 21  # bytes in "line NNNNNNNNN......\n"
WRITE = "import sys\nfor i in range({n}): sys.stdout.write(f'line {{i:09d}}......\\n')\n"


def _kept(log: Path) -> int:
    return sum(p.stat().st_size for p in (log, Path(f"{log}.1")) if p.exists())


def _lines(n: int, first: int = 0) -> bytes:
    return b"".join(f"line {i:09d}......\n".encode() for i in range(first, first + n))


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeAgent:
    monkeypatch.setenv("GPUCLUSTER_NODE_DIR", str(tmp_path / "node"))
    return NodeAgent("c1", "e" * 32)


def test_the_agent_caps_the_node_log_and_the_head_copy_keeps_the_cap_and_the_offsets(
    agent: NodeAgent, tmp_path: Path
) -> None:
    cap, n = 8192, 5000
    run = agent.root / "jobs" / "1" / "attempt-1"
    spec = LaunchSpec(1, 1, [sys.executable, "-c", WRITE.format(n=n)], {}, str(tmp_path), run, run / "output.log")
    handle = agent.launch(spec, max_log_bytes=cap)
    deadline = time.monotonic() + 30
    while isinstance(agent.sync([(handle, [])])[0][0][0], Running):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    total = n * LINE
    remote = run / "output.log"
    assert _kept(remote) <= cap and int(Path(f"{remote}.dropped").read_text()) + _kept(remote) == total
    # The head asks from offset 0: the bytes there are gone, so the answer starts at the oldest kept.
    copy = tmp_path / "head" / "output.log"
    copy.parent.mkdir()
    pos = 0
    while True:
        [(_, [(start, chunk)])] = agent.sync([(handle, [(str(remote), pos)])])
        assert start >= pos
        if not chunk:
            break
        append_log(copy, start, chunk, cap)
        pos = log_end(copy)
    assert pos == total and _kept(copy) <= cap
    assert read_log(copy, 0) == read_log(remote, 0)  # the same newest bytes, at the same offsets
    assert read_log(copy, total - LINE) == (_lines(1, n - 1), total)
    agent.cleanup(handle, str(run))


def test_append_log_rotates_with_the_shims_code_resumes_and_restarts_after_a_gap(tmp_path: Path) -> None:
    log, cap = tmp_path / "output.log", 4 * LINE * 10  # segments of 20 lines
    append_log(log, 0, _lines(50), cap)
    assert log_end(log) == 50 * LINE and _kept(log) <= cap
    append_log(log, 40 * LINE, _lines(20, 40), cap)  # overlaps what the copy has: only 10 new lines
    assert read_log(log, 59 * LINE) == (_lines(1, 59), 60 * LINE)
    assert _kept(log) <= cap
    append_log(log, 100 * LINE, _lines(5, 100), cap)  # lines 60..99 rotated away at the source
    assert read_log(log, 0) == (_lines(5, 100), 105 * LINE)
    assert read_log(log, 102 * LINE, limit=2 * LINE) == (_lines(2, 102), 104 * LINE)
    append_log(log, 105 * LINE, _lines(100, 105), cap)  # and rotates on from there
    data, end = read_log(log, 0)
    assert end == 205 * LINE and _kept(log) <= cap and data.endswith(_lines(1, 204))
    assert data == _lines(len(data) // LINE, 205 - len(data) // LINE)


def test_read_log_with_a_limit_reads_across_the_rotated_segment(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    append_log(log, 0, _lines(100), 40 * LINE)
    first = int(Path(f"{log}.dropped").read_text())
    pos, pieces = 0, []
    while True:
        chunk, pos = read_log(log, pos, limit=7 * LINE + 3)  # pieces that straddle PATH.1 and PATH
        if not chunk:
            break
        pieces.append(chunk)
    assert pos == 100 * LINE and b"".join(pieces) == _lines(100 - first // LINE, first // LINE)
