"""The package's one atomic writer (gpucluster/atomicfile.py), as the head, the client config
and the job shim (loaded by path under `python -I -S`) use it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.atomicfile import TMP_PREFIX, atomic_write, atomic_write_bytes
from gpucluster.executors import _shim
from gpucluster.userconfig import save_head


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_write_is_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    final = tmp_path / "d" / "record.json"
    atomic_write_bytes(final, b'{"a": 1}', mode=0o600)
    assert final.read_bytes() == b'{"a": 1}'
    assert _mode(final) == 0o600
    assert os.listdir(final.parent) == ["record.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    final = tmp_path / "record.json"
    final.write_bytes(b"old")

    def boom(f: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(final, boom)
    assert final.read_bytes() == b"old"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]


def test_a_planted_link_at_a_temporary_name_is_never_followed(tmp_path: Path) -> None:
    final = tmp_path / "record.json"
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    # Every temporary name is new: a link made at the shim's old fixed name does nothing.
    (tmp_path / "record.json.tmp").symlink_to(target)
    _shim.write_json_atomic(final, {"exit": 0})
    assert target.read_bytes() == b"keep"
    assert json.loads(final.read_text()) == {"exit": 0}
    assert _mode(final) == 0o600


def test_the_shim_writes_its_records_with_it_under_python_isolated(tmp_path: Path) -> None:
    """The keeper runs with the standard library only: it loads atomicfile.py by path."""
    final = tmp_path / "exit.json"
    script = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('_shim_under_test', sys.argv[1])\n"
        "shim = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(shim)\n"
        "shim.write_json_atomic(sys.argv[2], {'returncode': 3})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'gpucluster'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, _shim.__file__, str(final)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(final.read_text()) == {"returncode": 3}
    assert _mode(final) == 0o600
    assert out.stdout.strip() == "[]"  # loaded by path: the package itself is never imported


def test_client_config_is_written_private(tmp_path: Path) -> None:
    path = save_head("http://head:8000", "secret-token", tmp_path / "cfg" / "config.yaml")
    assert _mode(path) == 0o600
    assert "secret-token" in path.read_text()
    assert sorted(os.listdir(path.parent)) == ["config.yaml", "config.yaml.lock"]
