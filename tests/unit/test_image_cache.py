"""The image cache: which of a node's images go past the cap (the pure LRU rule), and the head
learning where images are from the attempts that ran there, which placement then prefers."""

from __future__ import annotations

from pathlib import Path

from gpucluster.containers import stored_name
from gpucluster.executors.base import Exited
from gpucluster.executors.image_cache import StoredImage, evictions

from .headkit import make_cluster

A = StoredImage("a" * 12, ("reg/a:1",), 400)
B = StoredImage("b" * 12, ("reg/b:1",), 300)
C = StoredImage("c" * 12, ("reg/c:1",), 200)
MINE = StoredImage("d" * 12, ("admin/own:1",), 500)  # pulled by hand: not the cluster's


def test_nothing_goes_while_the_store_is_within_its_cap() -> None:
    assert evictions([A, B, C], {"reg/a:1": 1, "reg/b:1": 2, "reg/c:1": 3}, (), 900) == []


def test_the_least_recently_used_go_first_until_the_store_fits() -> None:
    used = {"reg/a:1": 30.0, "reg/b:1": 10.0, "reg/c:1": 20.0}
    assert evictions([A, B, C], used, (), 600) == [B]  # 900 -> 600
    assert evictions([A, B, C], used, (), 450) == [B, C]  # 900 -> 400


def test_an_image_in_use_or_not_the_clusters_is_never_removed_even_over_the_cap() -> None:
    used = {"reg/a:1": 1.0, "reg/b:1": 2.0}
    # A is oldest but a container uses it (by name); B by id; the admin's image is not ours.
    assert evictions([A, B, MINE], used, {"reg/a:1", B.id}, 0) == []
    assert evictions([A, B, MINE], used, {"reg/a:1"}, 0) == [B]


def test_an_image_also_tagged_by_someone_else_is_kept() -> None:
    both = StoredImage("e" * 12, ("reg/a:1", "admin/alias:1"), 1000)
    assert evictions([both], {"reg/a:1": 1.0}, (), 0) == []


def test_stored_names_are_how_podman_lists_them() -> None:
    assert stored_name("docker://reg:5000/a") == "reg:5000/a:latest"
    assert stored_name("reg:5000/a:2") == "reg:5000/a:2"
    assert stored_name("a@sha256:" + "0" * 64) == "a@sha256:" + "0" * 64
    assert stored_name("docker-archive:/x/env.tar") is None


def test_the_head_learns_where_an_image_ran_and_places_the_next_job_needing_it_there(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, gpus=8, nodes=2, default_command=["true"])
    try:
        first = c.submit(gpus=8, image="reg/a:1")
        second = c.submit(gpus=8, image="reg/b:1")
        c.head.tick()
        where = {j: c.record(j).allocation.slices[0].node for j in (first, second)}  # type: ignore[union-attr]
        assert where == {first: "n1", second: "n2"}
        c.fake.finish(first)
        c.fake.finish(second)
        c.head.tick()
        assert c.head.images.by_image() == {"reg/a:1": frozenset({"n1"}), "reg/b:1": frozenset({"n2"})}
        # Both nodes are free and equal: the job needing reg/b:1 goes where it is, n2 (not n1,
        # the first by name, where it went before the head knew), and a job without an image
        # where it always would.
        third = c.submit(gpus=8, image="reg/b:1")
        c.head.tick()
        assert c.record(third).allocation.slices[0].node == "n2"  # type: ignore[union-attr]
        fourth = c.submit(gpus=8)
        c.head.tick()
        assert c.record(fourth).allocation.slices[0].node == "n1"  # type: ignore[union-attr]
    finally:
        c.close()


def test_an_image_that_could_not_be_pulled_is_not_taken_as_there(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, gpus=8, nodes=2, default_command=["true"])
    try:
        job_id = c.submit(gpus=8, image="reg/missing:1")
        c.head.tick()
        c.fake.end_rank(job_id, 0, Exited(127, error="cannot pull image reg/missing:1", final=True))
        c.head.tick()
        assert c.state(job_id).value == "failed"
        assert c.head.images.by_image() == {}
        c.head.images.seen("reg/x:1", {"n1", "n2"})
        c.head.images.forget("reg/x:1", "n1")
        assert c.head.images.by_image() == {"reg/x:1": frozenset({"n2"})}
        c.head.images.forget("reg/x:1")
        assert c.head.images.by_image() == {}
    finally:
        c.close()
