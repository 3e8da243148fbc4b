"""executors/_pull.py: how a pull's bytes are worded and measured, and where its total comes from.

The total is read from podman's own `podman manifest inspect`; here a stand-in podman script (a
real process) prints what podman 4.3 and newer podman print, so both paths are exercised without
a registry (tests/e2e/test_containers.py pulls from a real one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpucluster.executors import _pull

MANIFEST = {
    "schemaVersion": 2,
    "config": {"digest": "sha256:" + "c" * 64, "size": 771},
    "layers": [
        {"digest": "sha256:" + "a" * 64, "size": 1_083_604},
        {"digest": "sha256:" + "b" * 64, "size": 20_002_459},
    ],
}


def test_amounts_are_worded_in_the_totals_unit_and_never_exceed_it() -> None:
    assert _pull.amount(1_200_000_000, 4_000_000_000) == "1.2 of 4.0 GB"
    assert _pull.amount(4_200_000, 17_100_000) == "4.2 of 17.1 MB"
    assert _pull.amount(18_000_000, 17_100_000) == "17.1 of 17.1 MB"  # a blob and its copy: capped
    assert _pull.amount(2_500, 900_000) == "2.5 of 900.0 kB"
    assert _pull.amount(3_300_000, None) == "3.3 MB so far"


def test_landed_sums_the_files_under_a_directory_and_is_zero_when_it_is_gone(tmp_path: Path) -> None:
    (tmp_path / "storage1").mkdir()
    (tmp_path / "storage1" / "1").write_bytes(b"x" * 1000)
    (tmp_path / "storage1" / "2").write_bytes(b"y" * 24)
    assert _pull.landed(str(tmp_path)) == 1024
    assert _pull.landed(str(tmp_path / "missing")) == 0


def _fake_podman(tmp_path: Path, stdout: str, stderr: str, code: int) -> str:
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = tmp_path / "podman"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'out'}; cat {tmp_path / 'err'} >&2; exit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_the_total_comes_from_the_manifest_podman_prints(tmp_path: Path) -> None:
    podman = _fake_podman(tmp_path, json.dumps(MANIFEST), "", 0)
    assert _pull.image_size(podman, "reg:5000/big:1", dict(os.environ)) == 771 + 1_083_604 + 20_002_459


def test_the_total_comes_from_the_manifest_podman_4_3_quotes_in_its_refusal(tmp_path: Path) -> None:
    quoted = json.dumps(json.dumps(MANIFEST))  # Go's %q of the blob: a JSON string literal
    err = f'Error: parsing manifest blob {quoted} as a "application/vnd.oci.image.manifest.v1+json": Treating'
    podman = _fake_podman(tmp_path, "", err + " single images as manifest lists is not implemented\n", 125)
    assert _pull.image_size(podman, "reg:5000/big:1", dict(os.environ)) == 771 + 1_083_604 + 20_002_459


def test_no_total_when_podman_cannot_say(tmp_path: Path) -> None:
    podman = _fake_podman(tmp_path, "", "Error: unauthorized\n", 125)
    assert _pull.image_size(podman, "reg:5000/big:1", dict(os.environ)) is None


def test_a_repository_is_a_reference_without_its_tag_or_digest() -> None:
    assert _pull._repository("host:5000/a/b:tag") == "host:5000/a/b"
    assert _pull._repository("b@sha256:" + "a" * 64) == "b"
    assert _pull._repository("host:5000/b") == "host:5000/b"
