"""Jobs in containers (issue 22), through a real head and real Podman.

No registry is reachable here, so the module builds its own image from local files: a static
busybox and the host's library paths as mount points (`podman import` of a tarball, well under a
second). Python and torch come in by --mount from the host (the policy's mount roots allow them),
which keeps the image a few MB. Podman's config and image store are the module's own (a temp
dir named by `gpucluster up --container-config`), so nothing of the machine's podman changes; its
containers.conf is what a host that mixes cgroup v1 and v2 needs (README, Containers).

Jobs run as root here (a head without Unix accounts), so podman runs rootful with --user 0:0.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.auth.unix import account_exists
from gpucluster.client import ApiError, Client
from gpucluster.executors.cgroups import detect as detect_cgroups
from gpucluster.models import Job

from .containerkit import IMAGE, GatedProxy, Podman, Registry, big_image_tar, insecure_registries_conf, rootfs_tar
from .headproc import HeadProcess, passable_dir, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or shutil.which("busybox") is None or os.geteuid() != 0,
    reason="needs podman, runc and busybox (scripts/test.sh installs them as root) and root (rootful podman "
    "in a private store)",
)

TIMEOUT_S = 60.0  # a container job starts in about half a second; the margin is for a busy CI
PY = sys.executable
# What Python and torch need from the host, mounted read-only into the image.
PY_ROOTS = tuple(dict.fromkeys(os.path.realpath(p) for p in ("/usr", sys.prefix, sys.base_prefix)))


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    root = tmp_path_factory.mktemp("podman")
    pm = Podman(root)
    made = pm.import_test_image(root)
    if made.returncode != 0:
        pytest.skip(f"podman cannot import an image here: {made.stderr.strip()}")
    try:
        yield pm
    finally:
        pm("rm", "--all", "--force", "--time", "0")  # whatever a failed test left running
        with contextlib.suppress(OSError):
            shutil.rmtree(root)


@pytest.fixture(scope="module")
def mount_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one directory of the module's tests that the shared head's policy lets jobs mount."""
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def head_options(podman: Podman, mount_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The module's shared head (`cluster`): 4 GPUs, the module's podman, mounts of `mount_root`
    and of Python's own directories only."""
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    roots = [str(mount_root), *PY_ROOTS]
    policy.write_text("containers:\n  mount_roots: [" + ", ".join(roots) + "]\n")
    return {"gpus": 4, "extra_args": ("--container-config", str(podman.config), "--policy", str(policy))}


@pytest.fixture
def cluster(head: HeadProcess) -> HeadProcess:
    """The module's shared head, idle (tests/e2e/conftest.py)."""
    return head


@pytest.fixture
def allowed(mount_root: Path, tmp_path: Path) -> Path:
    """A directory of this test's own that the cluster's policy lets jobs mount."""
    path = mount_root / tmp_path.name
    path.mkdir()
    return path


def ended(c: Client, job_id: int, timeout: float = TIMEOUT_S) -> Job:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (j := c.job(job_id)).state.terminal and j, timeout=timeout, what=f"job {job_id} to end"
    )


def log_shows(c: Client, job_id: int, text: str, **kw: object) -> str:
    return wait_for(  # type: ignore[no-any-return]
        lambda: text in (out := c.logs(job_id, **kw)) and out,  # type: ignore[arg-type]
        timeout=TIMEOUT_S,
        what=f"{text!r} in job {job_id}'s log",
    )


def sh(c: Client, script: str, workdir: Path, **fields: object) -> int:
    return c.submit(["sh", "-c", script], gpus=1, workdir=str(workdir), **{"image": IMAGE, **fields}).id


# ---- a container job is a job: log, exit code, environment, files ----------------------------


def test_a_container_job_runs_in_its_image_with_a_bare_jobs_environment(cluster: HeadProcess, tmp_path: Path) -> None:
    script = (
        "cat /etc/in-image; id -u; echo gpus=$CUDA_VISIBLE_DEVICES job=$GPUCLUSTER_JOB_ID; pwd; "
        'echo saved > "$GPUCLUSTER_CHECKPOINT_DIR/ck" && echo checkpoint-ok; echo out > made-inside; exit 3'
    )
    with cluster.client() as c:
        job_id = sh(c, script, tmp_path, env={"SECRET_TOKEN": "s3cret"})
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "failed" and job.exit_code == 3, (job.reason, out)
    lines = out.splitlines()
    assert "built by test_containers" in lines, out  # the image's file: it ran in the image
    assert f"gpus=0 job={job_id}" in lines and str(tmp_path) in lines and "checkpoint-ok" in lines, out
    assert (tmp_path / "made-inside").read_text() == "out\n"  # the workdir, at its own path
    assert (cluster.data_dir / "jobs" / str(job_id) / "checkpoints" / "ck").read_text() == "saved\n"
    # The job's variables reach the container by name only: no value on podman's command line.
    spec = (cluster.data_dir / "run" / str(job_id) / "attempt-1" / "spec.json").read_text()
    assert "--env=SECRET_TOKEN" in spec and spec.count("s3cret") == 1  # once: the job's env, not argv
    said = [line for line in cluster.log_path.read_text().splitlines() if line.startswith("containers:")]
    assert len(said) == 1 and said[0].startswith("containers: podman version"), said  # `up`'s one line


def test_cancel_sends_sigterm_to_the_process_inside_and_removes_the_container(
    cluster: HeadProcess, podman: Podman, tmp_path: Path
) -> None:
    script = 'trap "echo got SIGTERM inside; exit 0" TERM; echo started; while true; do sleep 0.1; done'
    with cluster.client() as c:
        job_id = sh(c, script, tmp_path)
        log_shows(c, job_id, "started")
        assert any(f"job-{job_id}-attempt-1" in n for n in podman.containers())
        c.cancel(job_id)
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "cancelled", job.reason
    assert out.count("got SIGTERM inside") == 1, out  # once: the trap's handler is not killed by a second
    assert not any(f"job-{job_id}-" in n for n in podman.containers())


def test_a_container_that_ignores_sigterm_is_killed_after_the_grace_period(
    cluster: HeadProcess, podman: Podman, tmp_path: Path
) -> None:
    script = 'trap "echo ignoring SIGTERM" TERM; echo started; while true; do sleep 0.1; done'
    with cluster.client() as c:
        job_id = sh(c, script, tmp_path)
        log_shows(c, job_id, "started")
        c.cancel(job_id)
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "cancelled" and "ignoring SIGTERM" in out, (job.reason, out)
    wait_for(lambda: not any(f"job-{job_id}-" in n for n in podman.containers()), what="the container removed")


def test_a_mount_outside_the_policys_roots_is_refused_and_one_inside_is_mounted(
    cluster: HeadProcess, allowed: Path, tmp_path: Path
) -> None:
    (allowed / "data.txt").write_text("from the mount\n")
    with cluster.client() as c:
        with pytest.raises(ApiError) as refused:
            sh(c, "true", tmp_path, mounts=["/etc:/host-etc:ro"])
        assert refused.value.status == 422
        assert "/etc is outside the directories this cluster lets jobs mount" in str(refused.value)
        with pytest.raises(ApiError) as bad:
            c.submit(["true"], gpus=1, image="Not A Valid//Ref")
        assert bad.value.status == 422 and "not a valid reference" in str(bad.value)
        job_id = sh(c, "cat /data/data.txt; touch /data/x", tmp_path, mounts=[f"{allowed}:/data:ro"])
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "failed" and "from the mount" in out and "Read-only file system" in out, out


def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_reason_and_no_retry(
    cluster: HeadProcess, tmp_path: Path
) -> None:
    missing = "localhost/no-such-image:1"
    with cluster.client() as c:
        one = c.submit(["true"], gpus=1, workdir=str(tmp_path), image=missing, max_restarts=3).id
        ranks = c.submit(["true"], gpus=2, per_gpu=True, workdir=str(tmp_path), image=missing, max_restarts=3).id
        for job_id in (one, ranks):
            job = ended(c, job_id)
            assert job.state.value == "failed" and f"cannot pull image {missing}" in job.reason, job.reason
            assert job.attempt == 1 and job.restarts == 0, job
        assert f"gpucluster: cannot pull image {missing}" in c.logs(one)


def test_kill_9_of_the_head_with_a_container_running_is_adopted_by_the_next_head(
    head_factory: type[HeadProcess], podman: Podman, tmp_path: Path
) -> None:
    args = ("--container-config", str(podman.config))
    data = tmp_path / "data"
    head = head_factory(data, gpus=2, extra_args=args).start()
    script = "echo started; while [ ! -e release ]; do sleep 0.1; done; echo released; exit 5"
    with head.client() as c:
        job_id = sh(c, script, tmp_path)
        log_shows(c, job_id, "started")
    head.kill9()
    assert any(f"job-{job_id}-attempt-1" in n for n in podman.containers())
    head2 = head_factory(data, gpus=2, port=head.port, extra_args=args).start()
    with head2.client() as c:
        assert c.job(job_id).state.value == "running"  # adopted, not restarted
        (tmp_path / "release").touch()
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "failed" and job.exit_code == 5 and job.attempt == 1, job.reason
    assert out == "started\nreleased\n", out
    assert not any(f"job-{job_id}-" in n for n in podman.containers())


GLOO = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item()}", flush=True)
dist.destroy_process_group()
"""


def test_a_per_gpu_job_runs_one_container_per_rank_and_all_reduces_with_gloo(
    cluster: HeadProcess, tmp_path: Path
) -> None:
    (tmp_path / "allreduce.py").write_text(GLOO)
    mounts = [f"{r}:{r}:ro" for r in PY_ROOTS]
    with cluster.client() as c:
        job_id = c.submit(
            [PY, "allreduce.py"], gpus=2, per_gpu=True, workdir=str(tmp_path), image=IMAGE, mounts=mounts
        ).id
        job = ended(c, job_id, timeout=120)
        out = c.logs(job_id, all_ranks=True)
    assert job.state.value == "succeeded", (job.reason, out)
    assert "rank 0 of 2: sum 3.0" in out and "rank 1 of 2: sum 3.0" in out, out


# ---- a member's container job: rootless podman as the member, never root in the image ----------

ACCOUNT = "gcctr_alice"


def test_a_members_container_job_runs_rootless_as_the_member_never_root(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    """A root head runs a member's job as the member's Unix account; its container is that
    account's rootless podman with --userns=keep-id: the member's uid inside, files made inside
    are the member's outside, and a cancel still reaches the command once."""
    if shutil.which("useradd") is None or shutil.which("newuidmap") is None:
        pytest.skip("needs useradd and newuidmap (uidmap) for a rootless podman account")
    made = not account_exists(ACCOUNT)
    with passable_dir("gc-ctr-") as root:
        home = root / "home"
        if made:
            subprocess.run(["useradd", "--home-dir", str(home), "--shell", "/bin/sh", ACCOUNT], check=True)
        try:
            _run_as_member(head_factory, root, home)
        finally:
            if made:
                _stop_pause_process(pwd.getpwnam(ACCOUNT).pw_uid)
                subprocess.run(["userdel", ACCOUNT], check=False, capture_output=True)


def _stop_pause_process(uid: int) -> None:
    """Rootless podman keeps a pause process per account (its user namespace); the test's podman
    started it, and its pid file names it."""
    run_dir = Path(f"/tmp/podman-run-{uid}")
    for pid_file in run_dir.glob("libpod/tmp/pause.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    for leftover in (run_dir, Path(f"/tmp/containers-user-{uid}")):
        shutil.rmtree(leftover, ignore_errors=True)


def _run_as_member(head_factory: type[HeadProcess], root: Path, home: Path) -> None:
    account = pwd.getpwnam(ACCOUNT)
    workdir, store = root / "work", root / "store"
    for d in (home, workdir, store):
        d.mkdir(exist_ok=True)
        os.chown(d, account.pw_uid, account.pw_gid)
        os.chmod(d, 0o700)
    config = root / "config"
    config.mkdir()
    (config / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
        'events_logger = "none"\n'
    )
    (config / "storage.conf").write_text(f'[storage]\ndriver = "vfs"\nrootless_storage_path = "{store}/$UID"\n')
    for f in config.iterdir():
        f.chmod(0o644)
    config.chmod(0o755)
    tar = root / "rootfs.tar"
    rootfs_tar(tar)
    tar.chmod(0o644)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "USER": ACCOUNT,
        "CONTAINERS_CONF": str(config / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(config / "storage.conf"),
    }
    imported = subprocess.run(
        ["runuser", "-u", ACCOUNT, "--", "podman", "import", str(tar), IMAGE],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if imported.returncode != 0:
        pytest.skip(f"rootless podman does not work for {ACCOUNT} here: {imported.stderr.strip()}")
    policy = root / "policy.yaml"
    policy.write_text("teams:\n  red: {weight: 1}\n")
    head = head_factory(
        root / "data", gpus=2, extra_args=("--container-config", str(config), "--policy", str(policy))
    ).start()
    with head.client() as admin:
        alice = admin.add_user("alice", ["red"], unix_user=ACCOUNT)
    script = 'id -u; id -g; cat /proc/self/cgroup; touch made-inside; trap "echo got SIGTERM inside; exit 0" TERM; ' + (
        "echo started; while true; do sleep 0.1; done"
    )
    with Client(head.url, token=alice.token) as c:
        job_id = sh(c, script, workdir)
        out = log_shows(c, job_id, "started")
        c.cancel(job_id)
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "cancelled", job.reason
    assert out.splitlines()[:2] == [str(account.pw_uid), str(account.pw_gid)], out  # keep-id: not root inside
    assert out.count("got SIGTERM inside") == 1, out
    assert (workdir / "made-inside").stat().st_uid == account.pw_uid
    if detect_cgroups().usable:  # rootless podman leaves it in the job's cgroup: killed and counted as a bare job
        assert f"/job-{job_id}-attempt-1" in out, out
    # One that ignores SIGTERM: after the grace, removed by the account's own podman (rm -f).
    with Client(head.url, token=alice.token) as c:
        stubborn = sh(c, 'trap "echo ignoring" TERM; echo started; while true; do sleep 0.1; done', workdir)
        log_shows(c, stubborn, "started")
        c.cancel(stubborn)
        assert ended(c, stubborn).state.value == "cancelled"

    def names() -> list[str]:
        listed = subprocess.run(
            ["runuser", "-u", ACCOUNT, "--", "podman", "ps", "-a", "--format", "{{.Names}}"],
            env=env, cwd="/", capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return listed.stdout.split()

    wait_for(lambda: not any(f"job-{stubborn}-" in n for n in names()), what="the member's container removed")


def test_a_preempted_container_job_checkpoints_on_sigterm_and_resumes_in_a_new_container(
    cluster: HeadProcess, podman: Podman, tmp_path: Path
) -> None:
    script = (
        'ck="$GPUCLUSTER_CHECKPOINT_DIR/ck"; if [ -e "$ck" ]; then echo "resumed from $(cat $ck)"; exit 0; fi; '
        'trap "echo saving; echo step-7 > $ck; exit 0" TERM; echo started; while true; do sleep 0.1; done'
    )
    with cluster.client() as c:
        job_id = sh(c, script, tmp_path)
        log_shows(c, job_id, "started")
        c.requeue(job_id)  # preemption's path: SIGTERM, the grace period, back in the queue
        job = wait_for(
            lambda: (j := c.job(job_id)).state.value == "succeeded" and j, timeout=TIMEOUT_S, what="attempt 2 to end"
        )
        first, second = c.logs(job_id, attempt=1), c.logs(job_id, attempt=2)
    assert job.attempt == 2 and first == "started\nsaving\n" and second == "resumed from step-7\n", (first, second)
    assert not any(f"job-{job_id}-" in n for n in podman.containers())


def test_an_image_pull_is_a_visible_phase_and_its_time_is_recorded_per_attempt(
    head_factory: type[HeadProcess], podman: Podman, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local archive (no registry here) is pulled on every attempt. The node's podman is the
    real one behind a gate that holds `podman pull` until the test opens it, so the phase is seen
    for certain, not by timing."""
    archive = tmp_path / "env.tar"
    saved = podman("save", "--output", str(archive), IMAGE)
    assert saved.returncode == 0, saved.stderr
    gate, bin_dir = tmp_path / "gate", tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "podman"
    wrapper.write_text(
        f'#!/bin/sh\nif [ "$1" = pull ]; then while [ ! -e {gate} ]; do sleep 0.05; done; fi\n'
        f'exec {shutil.which("podman")} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")  # the head finds podman at start
    head = head_factory(tmp_path / "data", gpus=2, extra_args=("--container-config", str(podman.config))).start()
    with head.client() as c:
        job_id = sh(c, "echo ran from the archive", tmp_path, image=f"docker-archive:{archive}")
        seen = wait_for(
            lambda: (r := c.job(job_id).reason).startswith("preparing: pulling image") and r,
            timeout=TIMEOUT_S,
            what="the pull phase",
        )
        assert f"docker-archive:{archive}" in seen, seen
        gate.touch()
        job = ended(c, job_id)
        out = c.logs(job_id)
    assert job.state.value == "succeeded", (job.reason, out)
    assert out.endswith("ran from the archive\n") and "preparing: pulling image" in out, out
    pull_s = job.attempts[0].pull_s
    assert pull_s is not None and pull_s > 0, job.attempts


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    if shutil.which("docker-registry") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-registry is missing (scripts/test.sh installs it with apt)")
        pytest.skip("needs docker-registry (Debian's package; scripts/test.sh installs it)")
    reg = Registry(tmp_path / "registry")
    try:
        reg.wait_ready(TIMEOUT_S)
        yield reg
    finally:
        reg.stop()


def test_a_pull_from_a_registry_shows_its_progress_in_bytes_and_records_its_time(
    head_factory: type[HeadProcess], podman: Podman, registry: Registry, tmp_path: Path
) -> None:
    """A real registry (Debian's docker-registry, a private one), a 16 MB layer of random bytes,
    and a proxy that holds the pull after 4 MB of it: the job shows `preparing: pulling image X
    (4.2 of 17.1 MB, 3s)` while it holds its GPU, for as long as the test looks, then runs. The
    node's registries.conf (in --container-config) names the registry insecure, as a site would."""
    layer = 16_000_000
    tar = tmp_path / "big.tar"
    big_image_tar(tar, layer)
    local = "localhost/gpucluster-big:1"
    assert podman("import", str(tar), local).returncode == 0
    pushed = podman("push", "--tls-verify=false", local, f"docker://{registry.address}/big:1")
    assert pushed.returncode == 0, pushed.stderr
    # Gone from the store: the job's pull must fetch every layer (podman reuses a layer it has).
    assert podman("rmi", local).returncode == 0
    proxy = GatedProxy(registry.port, hold_after=4_000_000)
    config = tmp_path / "config"
    shutil.copytree(podman.config, config)
    insecure_registries_conf(config / "registries.conf", registry.address, f"127.0.0.1:{proxy.port}")
    image = f"127.0.0.1:{proxy.port}/big:1"
    try:
        head = head_factory(tmp_path / "data", gpus=2, extra_args=("--container-config", str(config))).start()
        with head.client() as c:
            job_id = sh(c, "ls -l /random.bin", tmp_path, image=image)
            progress = re.compile(re.escape(f"preparing: pulling image {image} (") + r"([\d.]+) of ([\d.]+) MB, \d+s\)")
            seen = wait_for(
                lambda: (m := progress.fullmatch(c.job(job_id).reason or "")) and m,
                timeout=TIMEOUT_S,
                what="the pull's progress in bytes",
            )
            done, total = float(seen.group(1)), float(seen.group(2))
            assert c.job(job_id).state.value == "running"  # it holds its GPU while it pulls
            assert 0 < done < total and abs(total - layer / 1e6) < 1.5, seen.group(0)
            proxy.release()
            job = ended(c, job_id)
            out = c.logs(job_id)
    finally:
        proxy.close()
        podman("rmi", "--force", image)
    assert job.state.value == "succeeded", (job.reason, out)
    assert f"{layer} " in out, out  # the layer's file, inside the container
    pull_s = job.attempts[0].pull_s
    assert pull_s is not None and pull_s > 0, job.attempts


def test_the_image_cache_removes_the_least_recently_used_image_past_its_cap_never_one_in_use(
    head_factory: type[HeadProcess], podman: Podman, tmp_path: Path
) -> None:
    """Real podman, a cap of 1 KiB (every image is over it): after each container attempt the node
    removes the cluster's images not in use, oldest use first; the image of a running job stays
    until its job ends, and an image no job of this cluster used (the module's test image) is
    never touched."""
    images = {}
    for name in ("a", "b"):
        tar = tmp_path / f"{name}.tar"
        big_image_tar(tar, 100_000)  # random bytes: two distinct images
        images[name] = f"localhost/gpucluster-cache-{name}:1"
        assert podman("import", str(tar), images[name]).returncode == 0

    def present(image: str) -> bool:
        return podman("image", "exists", image).returncode == 0

    head = head_factory(
        tmp_path / "data",
        gpus=2,
        extra_args=("--container-config", str(podman.config), "--image-cache-size", "1KiB"),
    ).start()
    try:
        with head.client() as c:
            running = sh(c, "echo started; while [ ! -e release ]; do sleep 0.1; done", tmp_path, image=images["b"])
            log_shows(c, running, "started")
            done = sh(c, "echo done", tmp_path, image=images["a"])
            assert ended(c, done).state.value == "succeeded"
            wait_for(lambda: not present(images["a"]), what=f"{images['a']} removed after its job")
            assert present(images["b"]), "the image of a running job was removed"
            (tmp_path / "release").touch()
            assert ended(c, running).state.value == "succeeded"
            wait_for(lambda: not present(images["b"]), what=f"{images['b']} removed once its job ended")
        assert present(IMAGE)  # not this cluster's: never removed
        kept = json.loads((tmp_path / "data" / "images.json").read_text())
        assert kept == {}, kept
    finally:
        for image in images.values():
            podman("rmi", "--force", image)


def test_the_cli_and_job_files_take_image_and_mounts(
    cluster: HeadProcess, podman: Podman, allowed: Path, tmp_path: Path
) -> None:
    """`--image`/`--mount` and `image:`/`mounts:` in a job file (a relative archive path made
    absolute from the file's directory), `show` naming the image, and one-line refusals."""
    (allowed / "f.txt").write_text("mounted\n")
    assert podman("save", "--output", str(tmp_path / "env.tar"), IMAGE).returncode == 0

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "gpucluster.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "GPUCLUSTER_URL": cluster.url},
        )

    mount = f"{allowed}:/data:ro"
    r = cli("submit", "--json", "--image", IMAGE, "--mount", mount, "--", "cat", "/data/f.txt")
    assert r.returncode == 0, r.stderr
    by_flags = json.loads(r.stdout)
    assert by_flags["spec"]["image"] == IMAGE and by_flags["spec"]["mounts"] == [mount]
    job_file = tmp_path / "job.yaml"
    job_file.write_text("image: ./env.tar\ncommand: [cat, /etc/in-image]\n")
    r = cli("submit", "--json", "-f", str(job_file))
    assert r.returncode == 0, r.stderr
    by_file = json.loads(r.stdout)
    assert by_file["spec"]["image"] == f"docker-archive:{tmp_path / 'env.tar'}"
    with cluster.client() as c:
        for job_id, out in ((by_flags["id"], "mounted\n"), (by_file["id"], "built by test_containers\n")):
            job = ended(c, job_id)
            assert job.state.value == "succeeded" and c.logs(job_id).endswith(out), (job.reason, c.logs(job_id))
    shown = cli("show", str(by_flags["id"])).stdout
    assert f"image:      {IMAGE}   -v {mount}" in shown, shown
    for args, words in [
        (["--image", IMAGE, "--mount", "/etc:/x"], "/etc is outside the directories"),
        (["--mount", mount], "give an image too"),
        (["--image", "UPPER:case"], "not a valid reference"),
    ]:
        r = cli("submit", *args, "--", "true")
        assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_container_left_by_a_launch_cut_short_does_not_block_its_attempt(
    fresh_head: HeadProcess, podman: Podman, tmp_path: Path
) -> None:
    """A head killed between `podman run` and the shim's record starts the attempt again: the
    container of that name, still running, is replaced rather than failing the job."""
    instance = "head-" + hashlib.sha256(str(fresh_head.data_dir.resolve()).encode()).hexdigest()[:12]
    stale = f"gpucluster-{instance}-job-1-attempt-1"
    left = podman("run", "--detach", "--init", "--stop-timeout=1", "--name", stale, IMAGE, "sleep", "1000")
    assert left.returncode == 0, left.stderr
    with fresh_head.client() as c:
        job_id = sh(c, "echo fresh", tmp_path)
        assert job_id == 1
        job = ended(c, job_id)
        assert job.state.value == "succeeded" and c.logs(job_id).endswith("fresh\n"), (job.reason, c.logs(job_id))
    assert stale not in podman.containers()
