"""sizes.py, the one size parser: the job spec's GPU memory, the simulator's cluster files and
`up --max-log-size` read the same spellings the same way (they used to disagree on "1TiB",
"80GB" and "16384")."""

from __future__ import annotations

import pytest

from gpucluster.cli.main import parse_size
from gpucluster.models import JobSpec, parse_memory_mb
from gpucluster.sim.fields import parse_memory_mb as sim_memory_mb
from gpucluster.sizes import MIB, parse_bytes, parse_mib

SAME_MIB = {
    "80GiB": 81920,
    "80GB": 81920,
    "80G": 81920,
    "80 gb": 81920,
    "1TiB": 1024 * 1024,
    "1TB": 1024 * 1024,
    "16384MiB": 16384,
    "16384MB": 16384,
    "16384": 16384,
    "0.5GiB": 512,
}


@pytest.mark.parametrize(("text", "mib"), SAME_MIB.items())
def test_every_reader_of_gpu_memory_agrees(text: str, mib: int) -> None:
    assert parse_mib(text) == mib
    assert parse_memory_mb(text) == mib
    assert sim_memory_mb(text) == mib
    assert parse_size(text.replace("16384", "16384MiB") if text == "16384" else text) == mib * MIB
    assert JobSpec.model_validate({"command": ["true"], "gpu_memory": text}).gpu_memory_mb == mib


def test_a_bare_number_is_in_the_callers_unit() -> None:
    assert parse_size("4096") == 4096  # bytes: a file size
    assert parse_mib("4096") == 4096  # MiB: GPU memory
    assert parse_bytes("64KiB") == parse_bytes("64k") == parse_bytes("64KB") == 65536
    assert parse_bytes("10B") == 10


@pytest.mark.parametrize("text", ["", "GiB", "80 GiBs", "80PB", "-1GiB", "1e3GiB", "eighty"])
def test_what_no_reader_accepts_is_a_one_line_error(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        parse_bytes(text)
    with pytest.raises(ValueError, match="cannot read memory size"):
        parse_memory_mb(text)
    with pytest.raises(ValueError, match="cannot read memory size"):
        sim_memory_mb(text)
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size(text)
