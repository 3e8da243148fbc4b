"""The shim's capped log (rotation) and read_log's offsets, on real files with a real shim
process; and a job whose log cannot be written (a full tmpfs) still runs to its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.executors import logfile
from gpucluster.executors._shim import _CappedLog
from gpucluster.executors.local import shim_argv, write_shim_spec
from gpucluster.executors.logfile import read_log

from .tmpfs import mounted_tmpfs

LINE = 21  # bytes in "line NNNNNNNNN......\n"
WRITE = "import sys\nfor i in range({n}): sys.stdout.write(f'line {{i:09d}}......\\n')\n"


def _run_shim(run_dir: Path, log: Path, cap: int, script: str) -> dict[str, object]:
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", script]
    write_shim_spec(run_dir, argv=command, env={}, workdir=str(run_dir), log=log, max_log_bytes=cap)
    subprocess.run(shim_argv(run_dir), stdin=subprocess.DEVNULL, timeout=60, check=False)
    return dict(json.loads((run_dir / "exit.json").read_text()))


def test_the_log_keeps_the_newest_bytes_under_the_cap_and_offsets_count_every_byte(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    assert _run_shim(tmp_path, log, 8192, WRITE.format(n=3000))["exit_code"] == 0
    total = 3000 * LINE
    kept = log.stat().st_size + Path(f"{log}.1").stat().st_size
    assert kept <= 8192
    dropped = int(Path(f"{log}.dropped").read_text())
    assert dropped + kept == total
    data, end = read_log(log, 0)  # rotated away: from the oldest byte kept
    assert end == total and len(data) == kept and data.endswith(b"line 000002999......\n")
    assert read_log(log, (2999) * LINE) == (b"line 000002999......\n", total)
    assert read_log(log, total) == (b"", total)
    # Read in pieces from any kept offset: the pieces join into exactly the kept bytes.
    pos, pieces = dropped, []
    while pos < total:
        chunk, _ = read_log(log, pos)
        pieces.append(chunk[:100])
        pos += len(chunk[:100])
    assert b"".join(pieces) == data


def test_an_uncapped_log_reads_as_the_plain_file(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"hello\nworld\n")
    assert read_log(log, 0) == (b"hello\nworld\n", 12)
    assert read_log(log, 6) == (b"world\n", 12)
    assert read_log(tmp_path / "missing.log", 0) == (b"", 0)


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", "1m") as mnt:
        yield mnt


def test_a_job_whose_log_disk_is_full_still_runs_to_its_end(tmp_path: Path, full_tmpfs: Path) -> None:
    # 2 MB of output into a 1 MB filesystem with a cap above it: the disk fills, not the cap.
    record = _run_shim(tmp_path / "run", full_tmpfs / "output.log", 64 * 1024**2, WRITE.format(n=100_000))
    assert record["exit_code"] == 0
    data, _ = read_log(full_tmpfs / "output.log", 0)
    assert data.startswith(b"line 000000000......\n") and len(data) < 100_000 * LINE


def test_a_log_under_its_cap_makes_no_lock_file_and_its_first_rotation_does(tmp_path: Path) -> None:
    """Issue 18: the lock file readers hold off a rotation with is made by the first rotation,
    not at every job's start (a file creation per job)."""
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    assert _run_shim(tmp_path / "a", small, 8192, WRITE.format(n=10))["exit_code"] == 0
    assert small.stat().st_size == 10 * LINE and not Path(f"{small}.lock").exists()
    assert _run_shim(tmp_path / "b", big, 8192, WRITE.format(n=300))["exit_code"] == 0
    assert Path(f"{big}.lock").exists() and Path(f"{big}.1").exists()


def test_a_read_that_races_the_first_rotation_is_read_again_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that found no lock file (never rotated) while the writer's first rotation ran
    reads again under the lock it made: the bytes and offsets it returns are the log's after the
    rotation, never a mix of before and after."""
    log_path = tmp_path / "output.log"
    log = _CappedLog(str(log_path), 4 * LINE)  # segments of two lines
    log.write(b"".join(f"line {i:09d}......\n".encode() for i in range(2)))
    assert not Path(f"{log_path}.lock").exists()
    real_open, opened = logfile._open, []

    def rotating_meanwhile(path: Path | str, flags: int = os.O_RDONLY) -> int:
        if str(path) == str(log_path):
            opened.append(path)
            if len(opened) == 1:  # PATH.1 was not there yet: now the writer rotates, then writes on
                log.write(b"".join(f"line {i:09d}......\n".encode() for i in range(2, 4)))
        return real_open(path, flags)

    monkeypatch.setattr(logfile, "_open", rotating_meanwhile)
    data, end = read_log(log_path, 0)
    log.close()
    assert (data, end) == (b"".join(f"line {i:09d}......\n".encode() for i in range(4)), 4 * LINE)
    assert len(opened) == 2, "the read was not done again under the lock"
