"""`gpucluster simulate`: replay a trace through the real scheduler and write a report.

A thin shell over `gpucluster.sim.run.simulate`: options in, a progress bar while it runs, a
comparison table and the paths written out. Bad input prints one message and exits 1.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster.sim.errors import SimInputError, SimulationError
from gpucluster.sim.formats import FORMATS

if TYPE_CHECKING:
    from rich.console import Console


@cache
def _consoles() -> tuple[Console, Console]:
    """(stderr, stdout): rich is imported when `simulate` runs, not by every command (issue 19)."""
    from rich.console import Console

    return (
        Console(stderr=True, highlight=False),
        Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200),
    )


def simulate(
    cluster: Annotated[Path, typer.Option("--cluster", help="cluster spec YAML, e.g. examples/clusters/philly.yaml")],
    trace: Annotated[Path, typer.Option("--trace", help="workload trace file")],
    out: Annotated[Path, typer.Option("--out", help="directory for metrics.json, report.html and plots")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", help=f"trace format: {', '.join(FORMATS)} [default: from the file's header]"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            help="policy YAML (as for `gpucluster up`) or fifo, fifo-backfill, priority, default (= las), age,"
            " las, las-gittins; oracle-sjf (a reference: knows run times); repeat to compare",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed for every random draw (same seed, same metrics)")] = 0,
    strict: Annotated[bool, typer.Option("--strict", help="stop at the first malformed trace row")] = False,
    estimates: Annotated[
        bool,
        typer.Option(
            "--estimates",
            help="at every submit, measure the start estimate a live head would show, with time limits"
            " and with learned run times; metrics.json's start_estimates (slower)",
        ),
    ] = False,
    estimate_every: Annotated[
        int,
        typer.Option("--estimate-every", min=1, help="with --estimates, measure every Nth submit only (cheaper)"),
    ] = 1,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="policies simulated at once [default: one per core, up to the number]"),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            help="KEY=V1,V2,... over a cluster-spec value (checkpoints.interval, node_groups[0].count, "
            "node_groups[0].spares.hot, failures.gpu_failures_per_day), policy=A,B, or a value inside "
            "the policy file(s): policy.KEY (policy.preemption.enabled=true,false, policy.ordering.mode=age,las); "
            "repeat for a grid",
        ),
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="runs per sweep point, seeds SEED.. (spread)")] = 1,
    wait_target: Annotated[
        str | None,
        typer.Option("--wait-target", help="sweep goal: fewest GPUs with p99 time not running <= this (e.g. 1h)"),
    ] = None,
    goodput_target: Annotated[
        float, typer.Option("--goodput-target", help="one training job: checkpoint/restart cost to reach this")
    ] = 0.9,
) -> None:
    """Replay a workload trace on a simulated cluster through the real scheduler; compare policies."""
    from gpucluster.cli.common import fail
    from gpucluster.sim.run import SimulateOptions
    from gpucluster.sim.run import simulate as run_simulation

    if fmt is not None and fmt not in FORMATS:
        fail(f"--format {fmt!r}: allowed: {', '.join(FORMATS)}")
    target_s = None
    if wait_target is not None:
        from gpucluster.durations import parse_duration

        try:
            target_s = parse_duration(wait_target)
        except ValueError as e:
            fail(f"--wait-target {wait_target!r}: {e}")
    opts = SimulateOptions(
        sweeps=tuple(sweep or ()),
        seeds=seeds,
        wait_target_s=target_s,
        goodput_target=goodput_target,
        cluster=cluster,
        trace=trace,
        out=out,
        policies=tuple(policy or ("fifo", "priority", "default")),
        fmt=fmt,
        seed=seed,
        strict=strict,
        estimates=estimates,
        estimate_every=estimate_every,
    )
    bar = _Bar(enabled=not quiet and _consoles()[0].is_terminal)
    try:
        with bar:
            outcome = run_simulation(opts, on_phase=bar.phase, on_progress=bar.update, workers=workers)
    except SimInputError as e:
        fail(str(e))
    except SimulationError as e:
        fail(f"the simulation stopped: {e}", code=2)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    _summary(outcome.metrics, outcome.performance, [str(p) for p in outcome.files])


class _Bar:
    """A rich progress bar per policy (jobs done of jobs in the trace, and the simulated day)."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs  day {task.fields[day]:>6.1f}"),
            TimeElapsedColumn(),
            console=_consoles()[0],
            transient=False,
            # Refreshed by `update` (the parent polls its workers every 0.2 s), not by a thread
            # of its own: sim/run.py forks only from a single-threaded process.
            auto_refresh=False,
        )
        self.tasks: dict[str, Any] = {}  # policy -> rich TaskID

    def __enter__(self) -> _Bar:
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def phase(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(f"[dim]{text}[/dim]")

    def update(self, policy: str, done: int, total: int, sim_t: float) -> None:
        if not self.enabled:
            return
        task = self.tasks.get(policy)
        if task is None:
            task = self.tasks[policy] = self.progress.add_task(policy, total=total, day=0.0)
        self.progress.update(task, completed=done, total=total, day=sim_t / 86400.0)
        self.progress.refresh()


def _hours(s: Any) -> str:
    return f"{s / 3600:,.2f}" if isinstance(s, int | float) else "-"


def _summary(metrics: dict[str, Any], perf: dict[str, Any], files: list[str]) -> None:
    from rich.table import Table

    _out = _consoles()[1]
    tr = metrics["inputs"]["trace"]
    _out.print(
        f"{tr['jobs_read']:,} jobs read from {tr['rows']:,} rows"
        + (f" ({tr['malformed_rows']:,} malformed rows skipped; see report.html)" if tr["malformed_rows"] else "")
    )
    won = metrics.get("winners")
    if won:
        said = {
            "goodput": "highest goodput",
            "time_not_running_mean": "least time not running",
            "cost_per_useful_gpu_hour": "cheapest useful GPU-hour",
        }
        _out.print("answer: " + "; ".join(f"{v}: {said[k]}" for k, v in won.items() if v is not None))
    table = Table(
        "policy",
        "jobs",
        "skipped",
        "JCT mean h",
        "JCT p99 h",
        "wait mean h",
        "wait p99 h",
        "not running mean h",
        "preempt",
        "restarts",
        "GPU-h lost",
        "goodput",
        "util",
        "Jain",
        "vs " + (metrics["comparison"][0]["baseline"] if metrics["comparison"] else "-"),
        "wall s",
        box=None,
    )
    table.columns[0].no_wrap = True  # policy names whole, even in a narrow terminal
    table.columns[0].min_width = max(len(r["policy"]) for r in metrics["comparison"]) if metrics["comparison"] else 6
    for row in metrics["comparison"]:
        m = metrics["policies"][row["policy"]]
        ratio = row.get("jct_mean_vs_baseline")
        jain = row["jain_mean_contended"]
        table.add_row(
            row["policy"],
            f"{m['jobs']['simulated']:,}",
            f"{m['jobs']['skipped']:,}",
            _hours(row["jct_mean_s"]),
            _hours(row["jct_p99_s"]),
            _hours(row["queueing_delay_mean_s"]),
            _hours(row["queueing_delay_p99_s"]),
            _hours(row["time_not_running_mean_s"]),
            f"{row['preemptions']:,}",
            f"{row['restarts']:,}",
            f"{row['gpu_hours_lost']:,.1f}",
            f"{row['goodput'] * 100:.1f}%" if row["goodput"] is not None else "-",
            f"{row['utilisation'] * 100:.1f}%",
            f"{jain:.3f}" if jain is not None else "-",
            f"{ratio:.2f}x" if ratio else "-",
            f"{perf['policies'][row['policy']]['wall_s']:,.1f}",
        )
    _out.print(table)
    if "sweep" in metrics:
        _sweep_summary(metrics)
    if files:
        _out.print("wrote " + ", ".join(files))


def _sweep_summary(metrics: dict[str, Any]) -> None:
    """The sweep's answer first: the optimum and, for one training job, what reaches the target;
    then each point's goodput and p99 time not running with their spread over the seeds."""
    from rich.table import Table

    _out = _consoles()[1]
    sw = metrics["sweep"]
    table = Table("", "point", "policy", "GPUs", "goodput mean [min-max]", "not running p99 h", "JCT mean h", box=None)
    best = sw["optimum"]["row"] if sw["optimum"] else None
    for k, row in enumerate(sw["rows"]):
        g = row["goodput"]
        span = f" [{g['min'] * 100:.1f}-{g['max'] * 100:.1f}]" if g["mean"] is not None and sw["seeds"][1:] else ""
        table.add_row(
            "*" if k == best else "",
            ", ".join(f"{key}={v}" for key, v in row["point"].items()) or "as specified",
            row["policy"],
            f"{row['gpus']:,}",
            (f"{g['mean'] * 100:.1f}%" + span) if g["mean"] is not None else "-",
            _hours(row["time_not_running_p99_s"]["mean"]),
            _hours(row["jct_mean_s"]["mean"]),
        )
    _out.print(f"sweep: {sw['runs']:,} runs, seeds {sw['seeds'][0]}..{sw['seeds'][-1]}; goal: {sw['goal']}")
    _out.print(table)
    if sw["optimum"]:
        _out.print(f"optimum (*): {sw['optimum']['why']}")
    reach = metrics.get("reach_goodput")
    if reach is not None:
        _out.print(reach["answer"])
