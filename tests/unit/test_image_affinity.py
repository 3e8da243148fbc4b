"""Image affinity (core/image_affinity.py): placement prefers a node that has the job's image
only between nodes equally good for it, so it never delays a job, never changes the model, the
number of GPUs, nodes or the best-fit level, and with no image known it changes nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpucluster.core.image_affinity import holder
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import fifo_policy, priority_policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node

from .builders import job, node
from .test_scheduler_properties import FAST, MODELS, NOW, nodes, requests, running_jobs

IMAGES = ("reg/a:1", "reg/b:1")


def _free(cap: Capacity, model: str, name: str) -> int:
    return len(cap.free[model].get(name, []))


def _shape(a: Allocation) -> tuple[object, ...]:
    return tuple(sorted((len(s.gpu_indices), s.share, s.memory_mb) for s in a.slices))


def test_between_equal_nodes_the_one_with_the_image_is_taken() -> None:
    cluster = [node(f"n{i}").gpus(4, "H100", MODELS["H100"]).build() for i in range(3)]
    cap = Capacity(cluster, ())
    request = job(1).gpus(2).build()
    assert cap.place(request, "H100").slices[0].node == "n0"  # type: ignore[union-attr]
    assert cap.place(request, "H100", holders={"n2"}).slices[0].node == "n2"  # type: ignore[union-attr]
    # Never out of the best-fit level: n1 has 2 free, n2 (with the image) 4; the 2-GPU job packs n1.
    cap.take(Allocation((cap._slice("H100", "n1", 2),)))
    assert cap.place(request, "H100", holders={"n2"}).slices[0].node == "n1"  # type: ignore[union-attr]
    # Nor onto a node it may not use.
    assert cap.place(request, "H100", frozenset({"n1"}), {"n2"}).slices[0].node == "n2"  # type: ignore[union-attr]


def test_decide_places_a_job_where_its_image_is_when_that_costs_nothing() -> None:
    cluster = tuple(node(f"n{i}").gpus(8, "H100", MODELS["H100"]).build() for i in range(4))
    queued = (replace(job(1).gpus(8).build(), image=IMAGES[0]), replace(job(2).gpus(8).build(), image=IMAGES[1]))
    snap = Snapshot(nodes=cluster, running=(), queued=queued, images={IMAGES[0]: frozenset({"n3"})})
    plan = decide(snap, priority_policy(), NOW)
    where = {s.job_id: s.allocation.slices[0].node for s in plan.starts}
    assert where == {1: "n3", 2: "n0"}


def test_holder_is_the_first_by_name_of_those_allowed() -> None:
    assert holder({"a": None, "b": None, "c": None}, ["c", "b", "z"], {"b"}) == "c"
    assert holder({"a": None}, ["z"], ()) is None


@st.composite
def placements(draw: st.DrawFn) -> tuple[Capacity, JobRequest, str, frozenset[str], frozenset[str]]:
    cluster: tuple[Node, ...] = draw(nodes())
    running = draw(running_jobs(cluster))
    cap = Capacity(cluster, running)
    model = draw(st.sampled_from(sorted(cap.model_memory)))
    names = sorted(n.name for n in cluster)
    request = job(1).gpus(draw(st.sampled_from([1, 2, 3, 4, 8, 0.25, 0.5]))).build()
    exclude = frozenset(draw(st.lists(st.sampled_from(names), unique=True, max_size=2)))
    holders = frozenset(draw(st.lists(st.sampled_from(names), unique=True, max_size=3)))
    return cap, request, model, exclude, holders


@FAST
@given(placements())
def test_the_preference_never_changes_whether_nor_how_well_a_job_fits(
    case: tuple[Capacity, JobRequest, str, frozenset[str], frozenset[str]],
) -> None:
    cap, request, model, exclude, holders = case
    plain = cap.fork().place(request, model, exclude)
    preferred = cap.fork().place(request, model, exclude, holders)
    assert (plain is None) == (preferred is None)
    if plain is None or preferred is None:
        return
    assert _shape(plain) == _shape(preferred)
    assert cap.model_of(plain) == cap.model_of(preferred) == model
    assert not {s.node for s in preferred.slices} & exclude
    if len(plain.slices) > 1 or not holders:
        assert preferred == plain  # several nodes, or no image anywhere: exactly as before
        return
    got, base = preferred.slices[0], plain.slices[0]
    on_shared = cap.used_share.get((base.node, base.gpu_indices[0]), 0.0) > 0
    if on_shared:  # a fraction on a GPU already shared: one left exactly as full
        assert cap.used_share[(got.node, got.gpu_indices[0])] == cap.used_share[(base.node, base.gpu_indices[0])]
        return
    level = _free(cap, model, base.node)
    assert _free(cap, model, got.node) == level  # the same best-fit level
    equal = [n for n in holders if n not in exclude and _free(cap, model, n) == level]
    assert got.node == (min(equal) if equal else base.node)


@FAST
@given(st.data())
def test_decide_with_images_starts_the_same_jobs_at_the_same_sizes(data: st.DataObject) -> None:
    """No job waits for the preference: the same jobs start, each on the same model with the same
    GPUs per node (policies without preemption or backfill, whose choices follow node names)."""
    cluster: tuple[Node, ...] = data.draw(nodes())
    running = data.draw(running_jobs(cluster))
    queued = [
        replace(r, image=data.draw(st.sampled_from([None, *IMAGES])))
        for r in data.draw(requests(data.draw(st.integers(1, 12))))
    ]
    names = sorted(n.name for n in cluster)
    images = {i: frozenset(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3))) for i in IMAGES}
    policy = data.draw(st.sampled_from([fifo_policy(), priority_policy()]))
    plain = decide(Snapshot(nodes=cluster, running=running, queued=tuple(queued)), policy, NOW)
    preferred = decide(Snapshot(nodes=cluster, running=running, queued=tuple(queued), images=images), policy, NOW)
    cap = Capacity(cluster, running)

    def starts(plan: object) -> dict[int, tuple[object, ...]]:
        return {s.job_id: (cap.model_of(s.allocation), _shape(s.allocation)) for s in plan.starts}  # type: ignore[attr-defined]

    assert starts(plain) == starts(preferred)
    assert set(plain.waiting) == set(preferred.waiting)
