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


def test_virtual_gpus_can_declare_topology_domains() -> None:
    gpus = virtual_gpus(8, "H100-80GB", None, "n1", per_domain=4)
    assert [g.domain for g in gpus] == ["domain0"] * 4 + ["domain1"] * 4


class _FakeNvml:
    """Just enough of pynvml for the topology grouping: GPUs 0-1 and 2-3 share a PCIe switch."""

    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_SYSTEM = 50

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.NVML_TOPOLOGY_MULTIPLE if a // 2 == b // 2 else self.NVML_TOPOLOGY_SYSTEM


def test_nvml_topology_groups_gpus_under_a_common_switch() -> None:
    from gpucluster.discovery.gpus import _with_nvml_domains

    gpus = virtual_gpus(4, "H100-80GB", None, "n1")
    grouped = _with_nvml_domains(_FakeNvml(), gpus)
    assert grouped[0].domain == grouped[1].domain != grouped[2].domain == grouped[3].domain
