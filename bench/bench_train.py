"""The DDP example launched the way gpucluster will vs plain torchrun, and recovery from a killed rank.

  .venv/bin/python bench/bench_train.py [--repeats 6] [--epochs 40] [--recoveries 2] [--out results.json]

1. Throughput: examples/ddp_classifier (4 processes, gloo on CPU here) under plain torchrun
   vs the same script submitted through a real head (`gpucluster up --virtual-gpus 4`, then
   `submit --gpus 4 --per-gpu`: the shims, the per-rank environment, log capture and the
   head's polling all included), and vs 4 processes started directly with the environment from
   `gpucluster.launch.ranks.per_gpu_envs` (the launch alone, without the head). Runs rotate
   (A B C, B C A, C A B, ...) so drifting machine load hits all alike. The figure is the
   example's own training steps/s (first to last step, startup excluded); the ratio to torchrun
   (goal >= 0.98) is taken per round of runs, and the median of the pairs is reported. Rank 0's CPU time per step (which
   other load on the machine hardly moves) and the wall time from launch to exit are shown too.
2. Recovery: kill -9 of one rank (rank 2, then rank 0 which hosts the store) right after a
   checkpoint, then, once every process has exited, an immediate relaunch as attempt n+1, as
   the head will do. Twice: survivors left to notice the dead peer and exit by themselves, and
   survivors SIGKILLed as soon as the victim is seen dead (what torchrun's agent does and the
   head should do). Reported: kill -> all exited, relaunch -> resumed (processes started, torch
   imported, rendezvous, checkpoint loaded), and kill -> first training step of the new attempt
   (goal < 10 s plus the checkpoint load). The head's own poll interval is not included.

All processes share this machine's cores with each other (and with anything else running), so
the figures describe this machine only. Each rank runs in a session of its own, exactly as
torchrun starts its workers: with the kernel's autogroup scheduling (on here) CPU is shared per
session, so ranks packed into one session would get one share of a busy machine instead of
four; measured here, that alone cost the per-GPU launch 20-30% of its steps/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucluster.client import Client
from gpucluster.core.types import NodeSlice
from gpucluster.launch.ranks import per_gpu_envs, pick_free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _head  # bench/ is not a package

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_classifier" / "train.py"
WORLD = 4
Event = dict[str, Any]


class Attempt:
    """The processes of one launch and rank 0's JSON events."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], out: Path) -> None:
        self.procs, self.out = procs, out

    def events(self) -> list[Event]:
        if not self.out.exists():
            return []
        found = []
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(json.JSONDecodeError):
                    found.append(json.loads(line))
        return found

    def wait_for(self, pred: Callable[[Event], bool], timeout: float = 120.0) -> Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.005)
        raise RuntimeError(f"event not seen; log: {self.out}")

    def wait(self, timeout: float = 300.0) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class HeadRun:
    """One job submitted through a real head: its exit and rank 0's events come from the API."""

    def __init__(self, client: Client, job_id: int) -> None:
        self.client, self.job_id = client, job_id
        self.out = f"job {job_id} (gpucluster logs {job_id} --rank 0)"

    def wait(self, timeout: float = 300.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.client.job(self.job_id)
            if job.state in ("succeeded", "failed", "cancelled"):
                return [0 if job.state == "succeeded" else 1]
            time.sleep(0.5)  # the steps/s figure is the job's own; polling faster only loads the head
        raise RuntimeError(f"job {self.job_id} did not end in {timeout:.0f} s")

    def wait_for(self, pred: Callable[[Event], bool], timeout: float = 120.0) -> Event:
        for line in self.client.logs(self.job_id, rank=0).splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(json.JSONDecodeError):
                    e = json.loads(line)
                    if pred(e):
                        return dict(e)
        raise RuntimeError(f"event not seen in the log of {self.out}")


class Bench:
    def __init__(self, workdir: Path, args: list[str]) -> None:
        self.workdir, self.args, self.n = workdir, args, 0
        self.live: list[Attempt] = []
        self.head: _head.Head | None = None
        self.client: Client | None = None

    def start_head(self) -> None:
        """A head with exactly WORLD virtual GPUs, so each job gets all of them, like torchrun."""
        self.head = _head.start(WORLD, self.workdir / "head-data", self.workdir / "head.log")
        self.client = Client(self.head.url, token=self.head.token)

    def through_head(self) -> HeadRun:
        assert self.client is not None
        job = self.client.submit(
            [sys.executable, str(EXAMPLE), *self.args], gpus=WORLD, per_gpu=True, name="bench-train"
        )
        return HeadRun(self.client, job.id)

    def _env(self, ckpt: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "TORCHELASTIC_"))}
        env.update({"GPUCLUSTER_CHECKPOINT_DIR": str(ckpt), "PYTHONUNBUFFERED": "1"})
        return env

    def gpucluster(self, ckpt: Path, attempt: int = 1) -> Attempt:
        self.n += 1
        port = pick_free_port("127.0.0.1")
        base = self._env(ckpt)
        base["GPUCLUSTER_ATTEMPT"] = str(attempt)
        procs = []
        out = self.workdir / f"run{self.n}-0.log"
        slices = (NodeSlice("node0", tuple(range(WORLD))),)
        for pe in per_gpu_envs(slices, {"node0": "127.0.0.1"}, port, job_id=1, attempt=attempt):
            with open(self.workdir / f"run{self.n}-{pe.placement.rank}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(EXAMPLE), *self.args],
                        env=pe.apply(base),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        a = Attempt(procs, out)
        self.live.append(a)
        return a

    def torchrun(self, ckpt: Path) -> Attempt:
        self.n += 1
        port = pick_free_port("127.0.0.1")
        out = self.workdir / f"run{self.n}-0.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}"]
        cmd += ["--master-addr=127.0.0.1", f"--master-port={port}", str(EXAMPLE), *self.args]
        with open(out, "wb") as log:
            proc = subprocess.Popen(
                cmd, env=self._env(ckpt), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        a = Attempt([proc], out)
        self.live.append(a)
        return a

    def stop_all(self) -> None:
        for a in self.live:
            a.stop()
        if self.client is not None:
            self.client.close()
        if self.head is not None:
            self.head.stop()


def throughput(bench: Bench, repeats: int) -> dict[str, Any]:
    """Rotate torchrun, head and direct-launch runs; compare each run with the torchrun next to it.

    Other load on the machine drifts over minutes, so the ratio is taken per adjacent pair and
    the median of those is reported, with rank 0's CPU time per step as a figure that load
    does not move.
    """
    kinds = ("torchrun", "head", "gpucluster")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for i in range(repeats):
        order = kinds[i % 3 :] + kinds[: i % 3]
        for kind in order:
            ckpt = bench.workdir / f"tp-{kind}-{i}"
            load = os.getloadavg()[0]
            cpu_before = _children_cpu_s()
            head_cpu_before = _cpu_s(bench.head.proc.pid) if bench.head is not None else 0.0
            started = time.monotonic()
            a: Attempt | HeadRun
            if kind == "torchrun":
                a = bench.torchrun(ckpt)
            elif kind == "head":
                a = bench.through_head()
            else:
                a = bench.gpucluster(ckpt)
            codes = a.wait()
            wall = time.monotonic() - started
            # the head's jobs are not this script's children: their CPU time is not seen here; the
            # head's own CPU time while the job ran is (scheduling loop, API, log capture)
            cpu_total = _children_cpu_s() - cpu_before if kind != "head" else float("nan")
            head_cpu = _cpu_s(bench.head.proc.pid) - head_cpu_before if bench.head is not None else 0.0
            if any(codes):
                raise RuntimeError(f"{kind} run failed: {codes}; log {a.out}")
            done = a.wait_for(lambda e: e["event"] == "done")
            r = {
                "steps_per_s": done["steps_per_s"],
                "cpu_ms_per_step": 1000 * done["train_cpu_s"] / done["steps_this_attempt"],
                "wall_s": wall,
                "cpu_s_total": cpu_total,
                "load_before": load,
                "head_cpu_s": head_cpu,
            }
            runs[kind].append(r)
            print(
                f"  {kind:10s} run {i + 1}: {r['steps_per_s']:6.1f} steps/s, rank 0 {r['cpu_ms_per_step']:.2f} "
                f"CPU-ms/step, launch-to-exit {wall:5.1f} s, {cpu_total:5.1f} CPU-s in all, head process "
                f"{head_cpu:4.2f} CPU-s (load avg {load:.1f})",
                flush=True,
            )
    pairs = [g["steps_per_s"] / t["steps_per_s"] for t, g in zip(runs["torchrun"], runs["gpucluster"], strict=True)]
    head_pairs = [h["steps_per_s"] / t["steps_per_s"] for t, h in zip(runs["torchrun"], runs["head"], strict=True)]

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    return {
        "runs": runs,
        "pair_ratios": pairs,
        "ratio": statistics.median(pairs),
        "head_pair_ratios": head_pairs,
        "head_ratio": statistics.median(head_pairs),
        "median": {
            k: {key: med(k, key) for key in ("steps_per_s", "cpu_ms_per_step", "wall_s", "cpu_s_total", "head_cpu_s")}
            for k in runs
        },
    }


def side_by_side(bench: Bench, repeats: int) -> dict[str, Any]:
    """torchrun and the head's job running at the same time, `repeats` rounds.

    On a machine whose other load swings from run to run (other users' work), runs one after the
    other compare different machines. Two runs at the same time share whatever load there is,
    so their steps/s ratio isolates the launcher's own cost (the head's polling, log capture and
    shims included). Each rank has its own session in both, so the kernel shares CPU between
    them alike. Which one starts first alternates.

    Caveat, measured: the direct launch, with no head at all, also gets ~0.9 of torchrun here
    on two cores, so this mode shows how the kernel splits CPU between two jobs (by session
    group), not the launcher's cost. A diagnostic; the back-to-back figure on a quiet machine
    is the one to quote.
    """
    ratios: list[float] = []
    pairs: list[dict[str, float]] = []
    for i in range(repeats):
        ckpt = bench.workdir / f"sbs-{i}"
        load = os.getloadavg()[0]
        if i % 2 == 0:
            t = bench.torchrun(ckpt / "t")
            h = bench.through_head()
        else:
            h = bench.through_head()
            t = bench.torchrun(ckpt / "t")
        codes = t.wait() + h.wait()
        if any(codes):
            raise RuntimeError(f"a side-by-side run failed: {codes}")
        td = t.wait_for(lambda e: e["event"] == "done")
        hd = h.wait_for(lambda e: e["event"] == "done")
        ratios.append(hd["steps_per_s"] / td["steps_per_s"])
        pairs.append({"torchrun": td["steps_per_s"], "head": hd["steps_per_s"], "load_before": load})
        print(
            f"  round {i + 1}: torchrun {td['steps_per_s']:6.1f} steps/s, through the head "
            f"{hd['steps_per_s']:6.1f} steps/s, ratio {ratios[-1]:.3f} (load avg {load:.1f})",
            flush=True,
        )
    return {"pairs": pairs, "ratios": ratios, "ratio": statistics.median(ratios)}


def recovery(bench: Bench, victim: int, trial: int, head_kills: bool) -> dict[str, float]:
    """kill -9 one rank after the step-100 checkpoint; relaunch once every process is gone.

    head_kills=False: the survivors are left to notice the dead peer and exit by themselves
    (what fail-fast means for the training library). head_kills=True: like torchrun's agent,
    and like the head should, the survivors are SIGKILLed as soon as the victim is seen dead.
    """
    ckpt = bench.workdir / f"rec-{victim}-{trial}-{int(head_kills)}"
    first = bench.gpucluster(ckpt, attempt=1)
    first.wait_for(lambda e: e["event"] == "checkpoint" and e["step"] == 100)
    killed = time.time()
    os.kill(first.procs[victim].pid, signal.SIGKILL)
    if head_kills:
        first.procs[victim].wait()
        first.stop()
    codes = first.wait(timeout=120)
    exited = time.time()
    if codes[victim] != -signal.SIGKILL or any(c == 0 for c in codes):
        raise RuntimeError(f"unexpected exit codes {codes}")
    second = bench.gpucluster(ckpt, attempt=2)
    start = second.wait_for(lambda e: e["event"] == "start")
    startup_cpu = [_cpu_s(p.pid) for p in second.procs]
    step = second.wait_for(lambda e: e["event"] == "step")
    second.stop()  # the rest of the run is not measured
    if start["resumed_from"] != 100:
        raise RuntimeError(f"resumed from {start['resumed_from']}, expected 100")
    return {
        "all_exited_s": exited - killed,
        "relaunch_to_resumed_s": start["t"] - exited,
        "checkpoint_load_s": start["load_s"],
        "kill_to_training_s": step["t"] - killed,
        "startup_cpu_s_per_process": statistics.mean(startup_cpu),
    }


def _children_cpu_s() -> float:
    """CPU seconds of every process this script has reaped (torchrun's workers included)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=6, help="throughput runs per launcher")
    p.add_argument("--epochs", type=int, default=40, help="epochs per throughput run (10 steps each)")
    p.add_argument("--recoveries", type=int, default=2, help="kill -9 trials per victim rank")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--side-by-side", type=int, default=6, help="rounds of torchrun and the head's job at once")
    a = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        bench = Bench(Path(tmp), ["--epochs", str(a.epochs), "--log-every", "1000"])
        try:
            tp: dict[str, Any] = {}
            sbs: dict[str, Any] = {}
            if not a.skip_throughput or a.side_by_side:
                bench.start_head()
            if not a.skip_throughput:
                steps = a.epochs * 10
                print(f"== throughput: {WORLD} processes, gloo on CPU, {steps} steps per run, {os.cpu_count()} cores")
                tp = throughput(bench, a.repeats)
                m = tp["median"]
                print(
                    f"steps/s ratio through the head / torchrun: median of pairs {tp['head_ratio']:.3f} "
                    f"(pairs {min(tp['head_pair_ratios']):.3f}..{max(tp['head_pair_ratios']):.3f}); "
                    f"median steps/s through the head {m['head']['steps_per_s']:.1f}, "
                    f"launch-to-exit {m['head']['wall_s']:.1f} s, "
                    f"rank 0 CPU-ms/step {m['head']['cpu_ms_per_step']:.2f}, "
                    f"head process CPU while its job ran {m['head']['head_cpu_s']:.2f} s "
                    f"(vs {m['torchrun']['head_cpu_s']:.2f} s idle during torchrun runs)\n"
                    f"steps/s ratio direct launch / torchrun: median of pairs {tp['ratio']:.3f} "
                    f"(pairs {min(tp['pair_ratios']):.3f}..{max(tp['pair_ratios']):.3f})\n"
                    f"median steps/s: torchrun {m['torchrun']['steps_per_s']:.1f}, "
                    f"gpucluster {m['gpucluster']['steps_per_s']:.1f}; rank 0 CPU-ms/step: torchrun "
                    f"{m['torchrun']['cpu_ms_per_step']:.2f}, gpucluster {m['gpucluster']['cpu_ms_per_step']:.2f}; "
                    f"launch-to-exit: torchrun {m['torchrun']['wall_s']:.1f} s, "
                    f"gpucluster {m['gpucluster']['wall_s']:.1f} s; CPU-s per run (startup included): "
                    f"torchrun {m['torchrun']['cpu_s_total']:.1f}, gpucluster {m['gpucluster']['cpu_s_total']:.1f}"
                )
            if a.side_by_side:
                print(f"== side by side: torchrun and the head's job at the same time, {a.side_by_side} rounds")
                sbs = side_by_side(bench, a.side_by_side)
                print(
                    f"steps/s ratio through the head / torchrun, run at the same time: median {sbs['ratio']:.3f} "
                    f"(rounds {min(sbs['ratios']):.3f}..{max(sbs['ratios']):.3f})"
                )
            bench.args = ["--epochs", "30", "--log-every", "1000"]
            print("== recovery: kill -9 of one rank right after the step-100 checkpoint, immediate relaunch")
            rec: dict[str, list[dict[str, float]]] = {}
            for head_kills in (False, True):
                for victim in (2, 0):
                    key = f"rank{victim}-{'head-kills-survivors' if head_kills else 'survivors-exit-alone'}"
                    rec[key] = []
                    for trial in range(a.recoveries):
                        r = recovery(bench, victim, trial, head_kills)
                        rec[key].append(r)
                        how = "survivors SIGKILLed at once" if head_kills else "survivors exit by themselves"
                        print(
                            f"  kill rank {victim}, {how}: all exited {r['all_exited_s']:.2f} s, "
                            f"relaunch -> resumed {r['relaunch_to_resumed_s']:.2f} s "
                            f"(checkpoint load {r['checkpoint_load_s'] * 1000:.0f} ms, "
                            f"{r['startup_cpu_s_per_process']:.1f} CPU-s per process), "
                            f"kill -> training again {r['kill_to_training_s']:.2f} s",
                            flush=True,
                        )
            for head_kills in (False, True) if a.recoveries else ():
                runs = [r for k, v in rec.items() if k.endswith("head-kills-survivors") == head_kills for r in v]
                label = "survivors SIGKILLed at once" if head_kills else "survivors exit by themselves"
                print(
                    f"median, {label}: kill -> all exited {statistics.median(r['all_exited_s'] for r in runs):.2f} s, "
                    f"kill -> training again {statistics.median(r['kill_to_training_s'] for r in runs):.2f} s"
                )
        finally:
            bench.stop_all()
    if a.out:
        a.out.write_text(json.dumps({"throughput": tp, "side_by_side": sbs, "recovery": rec}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
