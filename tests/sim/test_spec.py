"""Cluster specs: the shipped examples load; every mistake names file:line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.sim.errors import SimInputError
from gpucluster.sim.spec import load_cluster_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def test_shipped_philly_spec() -> None:
    spec = load_cluster_spec(EXAMPLES / "philly.yaml")
    assert spec.total_gpus == 512
    assert sum(g.count for g in spec.groups) == 64
    assert spec.models == ("P100-12GB",)
    nodes = spec.nodes()
    assert len(nodes) == 64 and nodes[0][0].name == "philly-00" and nodes[-1][0].name == "philly-63"


def test_shipped_pai_spec_is_heterogeneous() -> None:
    spec = load_cluster_spec(EXAMPLES / "pai.yaml")
    assert spec.total_gpus == 6742
    assert len(spec.models) == 5
    assert spec.speed("T4-16GB") < spec.speed("P100-16GB") < spec.speed("V100-32GB")


def test_minimal_spec_gets_documented_defaults(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("node_groups:\n  - {count: 2, gpus_per_node: 4, gpu_model: A100}\n")
    spec = load_cluster_spec(p)
    assert spec.name == "c" and spec.total_gpus == 8
    assert spec.failures.gpu_failures_per_day == 4.7e-4
    assert spec.checkpoints.interval == "daly"
    assert spec.speed("A100") == 1.0


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("node_groups:\n  - {count: 2, gpus_per_node: 8}\n", ":2:", "node_groups[0].gpu_model: is required"),
        (
            "node_groups:\n  - name: a\n    count: two\n    gpus_per_node: 8\n    gpu_model: X\n",
            ":3:",
            "node_groups[0].count: must be a whole number",
        ),
        ("node_groups:\n  - {count: 0, gpus_per_node: 8, gpu_model: X}\n", ":2:", "count: must be between 1 and"),
        ("name: x\nnode_groups: []\n", ":2:", "node_groups: must be a non-empty list"),
        ("node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X}\nnodes: 3\n", ":3:", "nodes: unknown key"),
        (
            "node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X}\nspeeds:\n  Y: 2\n",
            ":4:",
            "speeds.Y: no node group has this GPU model",
        ),
        (
            "node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X}\nfailures:\n  node_repair_time: soon\n",
            ":4:",
            "cannot read duration",
        ),
        (
            "node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X, gpu_memory: lots}\n",
            ":2:",
            "cannot read memory size",
        ),
        (
            "node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X}\ntrace_fill:\n  priority: {urgent: 1}\n",
            ":4:",
            "unknown priority",
        ),
        ("node_groups:\n  - {count: 1, gpus_per_node: 8, gpu_model: X\n", ":3:", "not valid YAML"),
        ("- just\n- a list\n", "", "a cluster spec is a mapping"),
    ],
)
def test_mistakes_name_file_line_and_key(tmp_path: Path, text: str, where: str, says: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SimInputError) as e:
        load_cluster_spec(p)
    message = str(e.value)
    assert message.startswith(f"{p}{where}"), message
    assert says in message, message
    assert "\n" not in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SimInputError, match="cannot read"):
        load_cluster_spec(tmp_path / "nope.yaml")
