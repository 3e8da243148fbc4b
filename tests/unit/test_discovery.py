from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpucluster.discovery.gpus import NoGpus, discover_nvml, memory_from_type, model_name, virtual_gpus
from gpucluster.head.server import UpOptions, local_node


@pytest.mark.parametrize(
    ("nvml", "mem", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM4-40GB-40GB"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-SXM2-32GB-32GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "4090-24GB"),
    ],
)
def test_model_names_are_short_and_carry_memory(nvml: str, mem: int, expected: str) -> None:
    assert model_name(nvml, mem) == expected


def test_virtual_gpu_memory_comes_from_the_type_name_or_the_default() -> None:
    assert memory_from_type("H100-80GB") == 80 * 1024
    assert memory_from_type("A10") == 16 * 1024
    gpus = virtual_gpus(3, "H100-80GB", None, "n1")
    assert [g.index for g in gpus] == [0, 1, 2]
    assert {g.memory_mb for g in gpus} == {80 * 1024}
    assert len({g.uuid for g in gpus}) == 3


def test_without_a_driver_up_says_so_in_one_line_and_declares_virtual_gpus(tmp_path: Path) -> None:
    try:
        discover_nvml()
        pytest.skip("this machine has NVIDIA GPUs")
    except NoGpus:
        pass
    say = io.StringIO()
    opts = UpOptions("127.0.0.1", 1, tmp_path, None, None, None, 30.0, "n0")
    node, is_virtual = local_node(opts, say)
    assert is_virtual and len(node.gpus) == 8
    lines = say.getvalue().splitlines()
    assert len(lines) == 1 and "using 8 virtual GPUs" in lines[0]
