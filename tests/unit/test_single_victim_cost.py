"""`choose_victims` when one victim is enough (`preempt._single_victim`): the cheapest such
victim, ties by node name; and a candidate is costed only once it could matter."""

from __future__ import annotations

from gpucluster.core.placement import Capacity
from gpucluster.core.preempt import CostKey, choose_victims
from gpucluster.core.types import RunningJob

from .builders import job, node, running

NODES = (node("n1").gpus(4).build(), node("n2").gpus(4).build(), node("n3").gpus(4).build())


def _choose(candidates: list[RunningJob], keys: dict[int, CostKey], asked: int = 4) -> tuple[list[int], list[int]]:
    """The victims' ids and the ids costed, in order; a job no one may take fills n3 unless a
    candidate is there (a node free enough would be taken without victims)."""
    others = [] if any(j.allocation.slices[0].node == "n3" for j in candidates) else [running(7, "n3", 0, 1, 2, 3)]
    cap = Capacity(NODES, [*candidates, *others])
    costed: list[int] = []

    def cost(v: RunningJob) -> CostKey:
        costed.append(v.job_id)
        return keys[v.job_id]

    choice = choose_victims(job(99).gpus(asked).build(), "H100", cap, candidates, [], cost, ranked=True)
    assert choice is not None
    return [v.job_id for v in choice.victims], costed


def test_the_cheapest_single_victim_wins_over_a_node_of_a_smaller_name() -> None:
    """Jobs 20 (on n2) and 10 (on n1) each free a node; 20 costs less: it is the victim. A scan
    that did not stop at the first costlier candidate would take n1's job."""
    jobs = [running(20, "n2", 0, 1, 2, 3), running(10, "n1", 0, 1, 2, 3)]
    victims, _ = _choose(jobs, {20: (0, 0.0, 1.0, 0.0, 20), 10: (0, 0.0, 2.0, 0.0, 10)})
    assert victims == [20]


def test_equal_costs_go_to_the_first_node_by_name() -> None:
    """Equal costs (a caller's cost may tie): the node first by name, so the scan goes on past
    the first victim found while the cost stays the same."""
    same: CostKey = (0, 0.0, 1.0, 0.0, 0)
    victims, _ = _choose([running(20, "n2", 0, 1, 2, 3), running(10, "n1", 0, 1, 2, 3)], {20: same, 10: same})
    assert victims == [10]


def test_candidates_that_cannot_free_enough_alone_are_not_costed_before_one_can() -> None:
    """Jobs of one GPU (none frees 4 alone) ranked before the one that does: only that one and
    the next after it (to see it costs more) are costed. Costing each was most of the scan."""
    small = [running(i, "n3", i - 1) for i in (1, 2, 3, 4)]
    jobs = [*small, running(20, "n2", 0, 1, 2, 3), running(10, "n1", 0, 1, 2, 3)]
    keys: dict[int, CostKey] = {j.job_id: (0, 0.0, float(k), 0.0, j.job_id) for k, j in enumerate(jobs)}
    victims, costed = _choose(jobs, keys)
    assert victims == [20]
    assert costed == [20, 10]
